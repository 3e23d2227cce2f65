"""Entry point of ``sharegpu-kubeletplugin``."""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of the node daemon."""
    return argparse.ArgumentParser(
        prog="sharegpu-kubeletplugin",
        description="sharegpu node daemon: discovers GPUs, publishes ResourceSlices, "
        "and prepares claims for kubelet.",
    )


def main(argv: list[str] | None = None) -> int:
    """Run the node daemon; returns the process exit code."""
    build_parser().parse_args(argv)
    return 0
