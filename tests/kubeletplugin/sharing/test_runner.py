"""The command runner: binary lookup under the driver root, errors, timeouts, stdin/env, and the
fake runner's scripting."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kubeletplugin.hosts.fakerunner import FakeRunner
from kubeletplugin.runner import CommandError, CommandResult, HostRunner


def script(root: Path, rel: str, body: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def test_binaries_come_from_the_driver_root_usr_bin_first(tmp_path: Path) -> None:
    script(tmp_path, "bin/tool", "echo from-bin")
    runner = HostRunner(tmp_path)
    assert runner.resolve("tool") == tmp_path / "bin" / "tool"
    script(tmp_path, "usr/bin/tool", "echo from-usr-bin")
    assert runner.run("tool").stdout == "from-usr-bin\n"


def test_missing_binary_names_the_searched_directories(tmp_path: Path) -> None:
    with pytest.raises(CommandError) as info:
        HostRunner(tmp_path).run("nvidia-smi", ["-L"])
    assert str(info.value) == (
        f"nvidia-smi: not found (searched {tmp_path}/usr/bin, {tmp_path}/bin)"
    )


def test_plugin_path_is_not_searched(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="not found"):
        HostRunner(tmp_path).run("sh", ["-c", "true"])


def test_non_zero_exit_names_command_code_and_stderr_tail(tmp_path: Path) -> None:
    tool = script(tmp_path, "usr/bin/tool", 'echo "first line" >&2; echo "GPU is busy" >&2; exit 6')
    with pytest.raises(CommandError) as info:
        HostRunner(tmp_path).run("tool", ["-i", "GPU-1", "-c", "EXCLUSIVE_PROCESS"])
    assert info.value.returncode == 6
    assert str(info.value) == (
        f"{tool} -i GPU-1 -c EXCLUSIVE_PROCESS: exit code 6: first line\nGPU is busy"
    )


def test_unchecked_run_returns_the_exit_code(tmp_path: Path) -> None:
    script(tmp_path, "usr/bin/tool", "echo out; exit 3")
    result = HostRunner(tmp_path).run("tool", check=False)
    assert (result.returncode, result.stdout) == (3, "out\n")


def test_arguments_are_never_interpreted_by_a_shell(tmp_path: Path) -> None:
    script(tmp_path, "usr/bin/tool", 'for a in "$@"; do echo "[$a]"; done')
    result = HostRunner(tmp_path).run("tool", ["a b", "$(id)", ";", "*"])
    assert result.stdout == "[a b]\n[$(id)]\n[;]\n[*]\n"


def test_stdin_and_env_reach_the_program(tmp_path: Path) -> None:
    script(tmp_path, "usr/bin/tool", 'read line; echo "$line@$CUDA_MPS_PIPE_DIRECTORY"')
    result = HostRunner(tmp_path, base_env={"PATH": os.environ["PATH"]}).run(
        "tool", env={"CUDA_MPS_PIPE_DIRECTORY": "/p"}, stdin="quit\n"
    )
    assert result.stdout == "quit@/p\n"


def test_timeout_kills_and_reports(tmp_path: Path) -> None:
    script(tmp_path, "usr/bin/tool", "echo waiting >&2; exec sleep 30")
    with pytest.raises(CommandError) as info:
        HostRunner(tmp_path).run("tool", timeout=0.5)
    assert "timed out after 0.5s: waiting" in str(info.value)


def test_a_daemon_left_behind_does_not_block_the_caller(tmp_path: Path) -> None:
    # Like nvidia-cuda-mps-control -d: the child keeps stdout/stderr open after the parent exits.
    pid_file = tmp_path / "daemon.pid"
    script(tmp_path, "usr/bin/daemonize", f"sleep 30 & echo $! > {pid_file}; echo started")
    try:
        result = HostRunner(tmp_path).run("daemonize", timeout=10)
        assert result.stdout == "started\n"
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), 9)


def test_fake_runner_records_and_answers_by_latest_matching_rule() -> None:
    fake = FakeRunner()
    fake.on("nvidia-smi", stdout="generic\n")
    fake.on("nvidia-smi", "-i", "GPU-1", stdout="specific\n")
    fake.on("nvidia-cuda-mps-control", stdin="get_server_list\n", returncode=1, once=True)
    assert fake.run("nvidia-smi", ["-i", "GPU-1", "-q"]).stdout == "specific\n"
    assert fake.run("nvidia-smi", ["-L"]).stdout == "generic\n"
    assert fake.run("other").returncode == 0
    first = fake.run("nvidia-cuda-mps-control", stdin="get_server_list\n", check=False)
    second = fake.run("nvidia-cuda-mps-control", stdin="get_server_list\n", check=False)
    assert (first.returncode, second.returncode) == (1, 0)
    assert fake.argvs() == [
        ("nvidia-smi", "-i", "GPU-1", "-q"),
        ("nvidia-smi", "-L"),
        ("other",),
        ("nvidia-cuda-mps-control",),
        ("nvidia-cuda-mps-control",),
    ]
    assert fake.calls[3].stdin == "get_server_list\n"


def test_fake_runner_failures_raise_like_the_host_runner() -> None:
    fake = FakeRunner()
    fake.on("nvidia-smi", returncode=9, stderr="Insufficient Permissions")
    with pytest.raises(CommandError) as info:
        fake.run("nvidia-smi", ["-i", "GPU-1", "-c", "DEFAULT"], env={"A": "1"})
    assert str(info.value) == (
        "nvidia-smi -i GPU-1 -c DEFAULT: exit code 9: Insufficient Permissions"
    )
    assert fake.calls[0].env == {"A": "1"}


def test_fake_runner_answer_functions_see_the_call() -> None:
    fake = FakeRunner()
    fake.on("tool", answer=lambda call: CommandResult(call.argv, 0, ",".join(call.args)))
    assert fake.run("tool", ["a", "b"]).stdout == "a,b"


def test_driver_root_libraries_come_first_on_the_library_path(tmp_path: Path) -> None:
    (tmp_path / "usr/lib64").mkdir(parents=True)
    script(tmp_path, "usr/bin/tool", 'echo "$LD_LIBRARY_PATH"')
    runner = HostRunner(tmp_path, base_env={"LD_LIBRARY_PATH": "/opt/lib"})
    assert runner.run("tool").stdout == f"{tmp_path}/usr/lib64:/opt/lib\n"
    other = tmp_path / "no-libs"
    script(other, "usr/bin/tool", 'echo "[$LD_LIBRARY_PATH]"')
    assert HostRunner(other, base_env={}).run("tool").stdout == "[]\n"


def test_the_fake_runner_remembers_only_its_recent_calls() -> None:
    """The mock backend's runner lives as long as the daemon: its record stays bounded."""
    fake = FakeRunner(history=3)
    for i in range(10):
        fake.run("nvidia-smi", ["-i", str(i)])
    assert fake.argvs() == [("nvidia-smi", "-i", str(i)) for i in (7, 8, 9)]
