"""Entry point of ``sharegpu-controller``."""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of the controller."""
    return argparse.ArgumentParser(
        prog="sharegpu-controller",
        description="sharegpu controller: admission webhook and per-GPU allocation tracking.",
    )


def main(argv: list[str] | None = None) -> int:
    """Run the controller; returns the process exit code."""
    build_parser().parse_args(argv)
    return 0
