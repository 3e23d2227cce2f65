"""The ``sharegpu`` command line: ``devices``, ``validate``, ``explain``, ``status``, ``demo``.

Each sub-command module provides ``add_parser(subparsers)``, which registers the command and
sets ``run`` (``args -> exit code``). Exit codes: 0 success, 1 findings or an expected failure
(its one-line message on stderr), 2 usage errors. Every command takes ``-o json|yaml``.

Start-up stays small: :data:`COMMANDS` names each command's module and one-line summary, and
:func:`main` imports only the module of the command on the command line. Invariants: ``sharegpu
--help``, ``--version`` and a bad command import no command module (the top-level help lists
the summaries of :data:`COMMANDS`, which equal each module's ``HELP``); a command's own parser
and help are the ones its module builds, exactly as when every module is loaded
(:func:`build_parser` without ``only``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from api.version import VERSION
from sharegpuctl.cli.common import EXIT_OK, EXIT_USAGE, CliError

PROG = "sharegpu"


@dataclass(frozen=True)
class Command:
    """One sub-command: its name, the module that builds its parser, and its summary."""

    name: str
    module: str
    #: The module's ``HELP``: shown by ``sharegpu --help`` without importing the module.
    summary: str


#: The sub-commands, in the order ``sharegpu --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    Command(
        "devices",
        "sharegpuctl.cli.devices",
        "show this node's GPUs and the ResourceSlices that would be published",
    ),
    Command(
        "validate",
        "sharegpuctl.cli.validate",
        "check DeviceClass, ResourceClaim(Template) and Pod manifests offline",
    ),
    Command(
        "explain",
        "sharegpuctl.cli.explain",
        "explain where a claim would be allocated, or why each device is rejected",
    ),
    Command(
        "status",
        "sharegpuctl.cli.status",
        "show every GPU's model, health, allocated cores and memory, claims and pods",
    ),
    Command(
        "demo",
        "sharegpuctl.cli.demo",
        "run the whole driver locally: mock GPUs, the real plugin, allocation, prepare",
    ),
)


def command_module(command: Command) -> Any:
    """The imported module of ``command``."""
    return importlib.import_module(command.module)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Top-level parser with one sub-command per verb.

    Every command's module is imported and builds its parser, unless ``only`` names the one
    command to build: the others then get a parser that only carries their summary (enough for
    ``sharegpu --help``; they are never parsed, since argparse parses one sub-command).
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="sharegpu: shared NVIDIA GPUs for Kubernetes DRA. Inspect this node's GPUs, "
        "check manifests, explain allocations, show GPU usage, or run the whole driver locally.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        if only is None or command.name == only:
            command_module(command).add_parser(sub)
        else:
            sub.add_parser(command.name, help=command.summary)
    return parser


def requested_command(argv: Sequence[str]) -> str:
    """The command named on the command line, or ``""`` (help, version, no or a bad command).

    The top-level options take no value, so the command is the first argument that is not an
    option; a ``--`` ends the options.
    """
    for arg in argv:
        if arg == "--":
            continue
        if not arg.startswith("-"):
            return arg if any(c.name == arg for c in COMMANDS) else ""
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=requested_command(args_in))
    args = parser.parse_args(args_in)
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
