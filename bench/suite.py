"""``make bench``: the benchmark suite, or a named part of it (``make bench PART=podstart``).

Each part is one command; its output is printed and kept in ``bench/results/<part>.txt``, and
the parts that write figures write ``bench/results/<part>.json``, from which ``plots`` draws
docs/img/*.png. The real-cluster parts (``podstart``, ``schedthroughput``, ``controllerscale``)
need root and the binaries ``make bench`` builds first (tests/e2e/build-binaries.sh, the test
driver included).

Run: ``python -m bench.suite [part ...]`` (no part: all of :data:`PARTS`, in order).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Final

RESULTS: Final = Path("bench/results")
PYTHON: Final = sys.executable
#: Every part, in the order the whole suite runs them.
PARTS: Final = {
    "podstart": [PYTHON, "-m", "bench.podstart", "--json", str(RESULTS / "podstart.json")],
    "schedthroughput": [
        PYTHON,
        "-m",
        "bench.schedthroughput",
        "--json",
        str(RESULTS / "schedthroughput.json"),
    ],
    "controllerscale": [
        PYTHON,
        "-m",
        "bench.controllerscale",
        "--json",
        str(RESULTS / "controllerscale.json"),
    ],
    "prepare": [PYTHON, "bench/prepare.py"],
    "prepare-disk": [PYTHON, "bench/prepare.py", "--cdi-parent", "/var/tmp"],
    "plots": [PYTHON, "-m", "bench.plots"],
}


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(PARTS)
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        print(f"unknown part(s) {unknown} (allowed: {', '.join(PARTS)})", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in names:
        print(f"== {name}: {' '.join(PARTS[name][1:])}", flush=True)
        start = time.monotonic()
        with (RESULTS / f"{name}.txt").open("w") as log:
            proc = subprocess.Popen(
                PARTS[name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                log.write(line)
            code = proc.wait()
        print(f"== {name}: exit {code} after {time.monotonic() - start:.0f} s", flush=True)
        if code:
            failed.append(name)
    if failed:
        print(f"failed parts: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
