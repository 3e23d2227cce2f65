"""The ``sharegpu`` command line."""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    """Top-level parser with one sub-command per verb."""
    parser = argparse.ArgumentParser(prog="sharegpu", description="sharegpu user CLI.")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    args = build_parser().parse_args(argv)
    if args.command is None:
        build_parser().print_help()
    return 0
