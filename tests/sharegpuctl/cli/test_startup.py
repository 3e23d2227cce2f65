"""``sharegpu`` imports only what the command on the command line uses.

Each case runs the CLI in a fresh interpreter and reports which modules it added to
``sys.modules``; nothing here measures time (bench/cli.py prints the timings).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sharegpuctl.cli import COMMANDS, build_parser, command_module, main, requested_command
from tests.paths import REPO_ROOT

#: Runs ``main(argv)`` and prints the modules it added, as JSON, on the last line of stdout.
PROBE = """
import json, sys
before = set(sys.modules)
from sharegpuctl.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print()
print(json.dumps(sorted(set(sys.modules) - before)))
"""
#: Packages no command that only reads the node or prints help may load.
HEAVY = ("kubernetes", "urllib3", "grpc", "opentelemetry", "jsonschema", "controller", "celpy")
PROJECT = ("api", "sharegpu", "sharegpuctl")


def added_modules(*argv: str) -> list[str]:
    """The modules ``sharegpu argv`` loads, in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    names: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return names


def top_level(names: list[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("argv", [["--help"], ["--version"], [], ["no-such-command"]])
def test_help_and_version_load_no_command_and_no_third_party_package(argv: list[str]) -> None:
    added = added_modules(*argv)
    commands = {c.module for c in COMMANDS}
    assert commands.isdisjoint(added), sorted(commands & set(added))
    outside = top_level(added) - set(sys.stdlib_module_names) - set(PROJECT)
    assert outside == set(), sorted(outside)
    assert not any(n.startswith(("kubeletplugin", "sharegpu.kube")) for n in added)


def test_devices_with_mock_gpus_loads_only_the_node_code() -> None:
    added = added_modules("devices", "--mock", "8", "-o", "json")
    assert "sharegpuctl.cli.devices" in added and "kubeletplugin.devices.mock" in added
    loaded = top_level(added)
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))
    others = {c.module for c in COMMANDS if c.name != "devices"}
    assert others.isdisjoint(added), sorted(others & set(added))


def test_status_help_loads_no_api_client() -> None:
    added = added_modules("status", "--help")
    assert "sharegpuctl.cli.status" in added
    assert "kubernetes" not in top_level(added) and "sharegpu.kube.rest" not in added


def test_each_summary_is_its_modules_help() -> None:
    for command in COMMANDS:
        assert command.summary == command_module(command).HELP, command.name


def test_top_level_help_is_the_same_with_or_without_the_command_modules() -> None:
    assert build_parser(only="").format_help() == build_parser().format_help()


def test_a_commands_parser_is_the_one_its_module_builds(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["devices", "--help"])
    full = capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["devices", "--help"])
    assert capsys.readouterr().out == full
    assert "--mock N" in full


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["--version"], ""),
        ([], ""),
        (["devices", "--mock", "8"], "devices"),
        (["-h", "status"], "status"),
        (["--", "demo"], "demo"),
        (["bogus", "devices"], ""),
        (["--mock", "8"], ""),
    ],
)
def test_requested_command(argv: list[str], command: str) -> None:
    assert requested_command(argv) == command


def test_usage_errors_still_name_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        main(["devices", "--mock"])
    assert err.value.code == 2
    assert "sharegpu devices: error: argument --mock" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        main(["bogus"])
    assert err.value.code == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err
