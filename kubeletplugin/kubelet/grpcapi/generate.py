"""Regenerate the Python gRPC modules in ``gen/`` from the .proto sources in ``proto/``.

Usage: ``python -m kubeletplugin.kubelet.grpcapi.generate [--check]``.

Invariants:

- the output is a pure function of the .proto files and the installed grpcio-tools version, so
  regenerating a committed tree changes nothing (``--check`` verifies this and exits 1 on drift);
- generated modules import each other as ``kubeletplugin.kubelet.grpcapi.gen.<module>`` (protoc
emits
  top-level imports; they are rewritten here, in this one place).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

PACKAGE_DIR = Path(__file__).resolve().parent
PROTO_DIR = PACKAGE_DIR / "proto"
GEN_DIR = PACKAGE_DIR / "gen"
GEN_PACKAGE = "kubeletplugin.kubelet.grpcapi.gen"

_INIT_TEXT = (
    '"""Python modules generated from ``kubeletplugin/kubelet/grpcapi/proto`` by\n'
    "``python -m kubeletplugin.kubelet.grpcapi.generate``. Do not edit; regenerate.\n"
    '"""\n'
)
_TOP_LEVEL_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


class GenerationError(RuntimeError):
    """protoc rejected the .proto sources; the message carries its exit status."""


def proto_files() -> list[Path]:
    """The .proto sources, sorted by name."""
    return sorted(PROTO_DIR.glob("*.proto"))


def _rewrite_imports(text: str) -> str:
    return _TOP_LEVEL_IMPORT.sub(rf"from {GEN_PACKAGE} import \1 as \2", text)


def generate(out_dir: Path) -> list[Path]:
    """Generate messages, gRPC stubs and .pyi type stubs into ``out_dir``; returns the files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_DIR}",
        f"--proto_path={well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(p.name for p in proto_files()),
    ]
    status = protoc.main(args)
    if status != 0:
        raise GenerationError(f"protoc failed with exit status {status} on {PROTO_DIR}")
    written = [out_dir / "__init__.py"]
    written[0].write_text(_INIT_TEXT, encoding="utf-8")
    for path in sorted(out_dir.glob("*_pb2*.py*")):
        path.write_text(_rewrite_imports(path.read_text(encoding="utf-8")), encoding="utf-8")
        written.append(path)
    return sorted(written)


def _tree(directory: Path) -> dict[str, str]:
    return {
        p.name: p.read_text(encoding="utf-8")
        for p in sorted(directory.iterdir())
        if p.is_file() and p.suffix in (".py", ".pyi")
    }


def diff_against(committed_dir: Path) -> list[str]:
    """Unified-diff lines between a fresh generation and ``committed_dir``; empty = identical."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        want, have = _tree(fresh), _tree(committed_dir) if committed_dir.is_dir() else {}
    lines: list[str] = []
    for name in sorted(want.keys() | have.keys()):
        lines.extend(
            difflib.unified_diff(
                have.get(name, "").splitlines(keepends=True),
                want.get(name, "").splitlines(keepends=True),
                fromfile=f"committed/{name}",
                tofile=f"regenerated/{name}",
            )
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Command-line entry; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m kubeletplugin.kubelet.grpcapi.generate", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="generate into a temporary directory and fail if it differs from gen/",
    )
    ns = parser.parse_args(argv)
    try:
        if ns.check:
            drift = diff_against(GEN_DIR)
            if drift:
                sys.stdout.writelines(drift)
                print(
                    f"{GEN_DIR} is out of date: run"
                    " python -m kubeletplugin.kubelet.grpcapi.generate"
                )
                return 1
            print(f"{GEN_DIR} is up to date")
            return 0
        for stale in GEN_DIR.glob("*_pb2*.py*"):
            stale.unlink()
        for path in generate(GEN_DIR):
            print(f"wrote {path}")
    except GenerationError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
