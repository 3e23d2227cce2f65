"""The ``sharegpu`` command line: ``devices``, ``validate``, ``explain``, ``status``, ``demo``.

Each sub-command module provides ``add_parser(subparsers)``, which registers the command and
sets ``run`` (``args -> exit code``). Exit codes: 0 success, 1 findings or an expected failure
(its one-line message on stderr), 2 usage errors. Every command takes ``-o json|yaml``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from api.version import VERSION
from sharegpu.cli import demo, devices, explain, status, validate
from sharegpu.cli.common import EXIT_OK, EXIT_USAGE, CliError

PROG = "sharegpu"


def build_parser() -> argparse.ArgumentParser:
    """Top-level parser with one sub-command per verb."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="sharegpu: shared NVIDIA GPUs for Kubernetes DRA. Inspect this node's GPUs, "
        "check manifests, explain allocations, show GPU usage, or run the whole driver locally.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (devices, validate, explain, status, demo):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_OK
    try:
        code: int = args.run(args)
    except CliError as exc:
        print(f"{PROG} {args.command}: error: {exc.message}", file=sys.stderr)
        if exc.code == EXIT_USAGE:
            print(f"run '{PROG} {args.command} --help' for usage", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
    return code
