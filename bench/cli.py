"""Start-up cost of the ``sharegpu`` commands: wall time and modules loaded, per command.

Each command runs in a fresh interpreter (``python -c`` calling ``sharegpuctl.cli.main``, as the
``sharegpu`` script does), ``--runs`` times; the median wall time is printed with the number of
modules the process had loaded when the command returned, and which heavy packages were among
them. Targets: ``--help`` and ``devices --mock 8`` <= 0.25 s each, ``demo`` <= 1.5 s.

Run: ``python bench/cli.py [--runs 7] [--root DIR]`` (``--root``: the source tree to measure,
default this one; run it from a copy to measure another version).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
#: Top-level packages whose presence is reported.
HEAVY: Final = (
    "yaml",
    "kubernetes",
    "urllib3",
    "grpc",
    "opentelemetry",
    "jsonschema",
    "kubernetes_validate",
    "lark",
    "celpy",
)
#: (label, arguments, runs divisor): slow commands run fewer times.
COMMANDS: Final = (
    ("--help", ["--help"], 1),
    ("--version", ["--version"], 1),
    ("devices --mock 8", ["devices", "--mock", "8", "-o", "text"], 1),
    ("validate -f examples/", ["validate", "-f", "examples/", "-o", "text"], 2),
    ("demo", ["demo", "-o", "text"], 2),
)
#: Runs ``sharegpuctl.cli.main`` and reports, on the last line of stderr, what was loaded.
SNIPPET: Final = """
import json, sys
from sharegpuctl.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
names = list(sys.modules)
heavy = [p for p in HEAVY if p in sys.modules]
sys.stderr.write("\\n" + json.dumps({"code": code, "modules": len(names), "heavy": heavy}) + "\\n")
"""


def run_once(root: Path, args: list[str]) -> tuple[float, dict[str, object]]:
    """Wall seconds of one run and what it reported."""
    code = f"HEAVY = {HEAVY!r}\n{SNIPPET}"
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=root, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    lines = done.stderr.strip().splitlines() or [""]
    try:
        report: dict[str, object] = json.loads(lines[-1])
    except ValueError:
        report = {"code": "crashed"}
    if report["code"] not in (0, 1, None):
        raise RuntimeError(f"exit {report['code']}: {lines[-1][:200]}")
    return wall, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--root", type=Path, default=ROOT, help="source tree to measure")
    parser.add_argument("--only", help="measure only the command with this label")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    print(f"sharegpu start-up, tree {root}, python {sys.version.split()[0]}")
    print(f"  {'command':<22} {'median':>8} {'min':>8} {'modules':>8}  heavy packages loaded")
    for label, command, divisor in COMMANDS:
        if args.only and label != args.only:
            continue
        runs = max(3, args.runs // divisor)
        walls: list[float] = []
        report: dict[str, object] = {}
        try:
            for _ in range(runs):
                wall, report = run_once(root, command)
                walls.append(wall)
        except RuntimeError as exc:
            print(f"  {label:<22} failed: {exc}")
            continue
        heavy = report["heavy"]
        assert isinstance(heavy, list)
        print(
            f"  {label:<22} {statistics.median(walls):7.3f}s {min(walls):7.3f}s "
            f"{report['modules']!s:>8}  {', '.join(heavy) or '-'}  ({runs} runs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
