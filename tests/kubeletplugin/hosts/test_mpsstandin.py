"""The stand-in ``nvidia-cuda-mps-control``: a real daemon process on unix sockets in its pipe
directory, its client, the script a daemon pod runs, and the simulated host's tools that talk to
it when the daemons are pods."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeletplugin.hosts import mpsstandin
from kubeletplugin.hosts.options import SimulatedOptions
from kubeletplugin.hosts.simtools import PID_FILE
from kubeletplugin.hosts.simulated import SimulatedHost
from kubeletplugin.runner import MPS_CONTROL
from kubeletplugin.sharing.daemonpods import PodLauncher
from kubeletplugin.sharing.mpspaths import PRIVILEGED_SOCKET

UUID = "GPU-standin-0"


def _wait_answering(proc: subprocess.Popen[bytes], pipe: Path) -> None:
    """Until the daemon answers (a generous bound for a loaded machine); fails if it exits."""
    deadline = time.monotonic() + 60
    while mpsstandin.send(pipe, "get_server_list\n").returncode != 0:
        assert proc.poll() is None, f"the daemon exited with {proc.returncode}"
        assert time.monotonic() < deadline, "the daemon never answered"
        time.sleep(0.05)


def _env(pipe: Path, log: Path) -> dict[str, str]:
    return {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(log),
        "CUDA_VISIBLE_DEVICES": UUID,
        # Left to the daemon pod's start hook, as with the real daemon.
        "SHAREGPU_MPS_DEFAULTS": "set_default_active_thread_percentage 10",
    }


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``nvidia-cuda-mps-control -f`` (the stand-in) running for a pipe directory of
    ``tmp_path``, answering on its sockets."""
    pipe, log = tmp_path / "pipe", tmp_path / "log"
    log.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", mpsstandin.MODULE, "-f"], env=_env(pipe, log), cwd=tmp_path
    )
    try:
        _wait_answering(proc, pipe)
        yield proc, pipe
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_the_daemon_answers_sets_defaults_and_quits(
    daemon: tuple[subprocess.Popen[bytes], Path],
) -> None:
    proc, pipe = daemon
    assert (pipe / PID_FILE).read_text() == f"{proc.pid}\n"
    # The start hook's commands were left to the hook: the default is still 100.
    answer = mpsstandin.send(pipe, "get_default_active_thread_percentage\n")
    assert (answer.returncode, answer.stdout) == (0, "100.0\n")
    assert mpsstandin.send(pipe, "set_default_active_thread_percentage 30\n").stdout == "30.0\n"
    assert (
        mpsstandin.send(pipe, f"set_default_device_pinned_mem_limit {UUID} 4096M\n").returncode == 0
    )
    assert mpsstandin.send(pipe, "get_default_active_thread_percentage\n").stdout == "30.0\n"
    # Several commands, one per line, as the daemon pod's start hook sends them.
    both = mpsstandin.send(
        pipe,
        "set_default_active_thread_percentage 40\n"
        f"set_default_device_pinned_mem_limit {UUID} 2048M\n",
    )
    assert (both.returncode, both.stdout) == (0, "40.0\n"), both
    assert mpsstandin.send(pipe, "get_default_active_thread_percentage\n").stdout == "40.0\n"
    refused = mpsstandin.send(pipe, "set_default_device_pinned_mem_limit GPU-other 1M\n")
    assert refused.returncode == 1 and "unknown or invalid command" in refused.stderr
    assert mpsstandin.send(pipe, "quit\n").returncode == 0
    assert proc.wait(timeout=30) == 0
    assert sorted(p.name for p in pipe.iterdir()) == []
    gone = mpsstandin.send(pipe, "get_server_list\n")
    assert (gone.returncode, gone.stdout) == (1, mpsstandin.NO_DAEMON)
    log = (pipe.parent / "log" / "control.log").read_text()
    assert "Startup (GPU GPU-standin-0" in log and "'quit' -> exit 0" in log


def test_the_read_socket_refuses_privileged_commands(
    daemon: tuple[subprocess.Popen[bytes], Path],
) -> None:
    _, pipe = daemon
    assert (pipe / PRIVILEGED_SOCKET).stat().st_mode & 0o777 == 0o600
    daemon_obj = mpsstandin.StandinDaemon(pipe, UUID, {}, None)
    refused = daemon_obj.answer(mpsstandin.CONTROL_SOCKET, "quit\n")
    assert refused.returncode == 1 and "privileged socket" in refused.stderr
    assert mpsstandin.socket_for("get_server_list\n") == mpsstandin.CONTROL_SOCKET
    assert mpsstandin.socket_for("get_server_list\nquit\n") == PRIVILEGED_SOCKET


def test_sigterm_ends_the_daemon_and_removes_its_files(
    daemon: tuple[subprocess.Popen[bytes], Path],
) -> None:
    proc, pipe = daemon
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert list(pipe.iterdir()) == []


def test_an_oversized_request_is_dropped_and_the_daemon_goes_on(
    daemon: tuple[subprocess.Popen[bytes], Path],
) -> None:
    _, pipe = daemon
    big = mpsstandin.send(pipe, "get_server_list\n" * (mpsstandin.MAX_REQUEST // 8))
    assert big.returncode == 1 and "request of more than" in big.stderr
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(pipe / mpsstandin.CONTROL_SOCKET))
        conn.sendall(b"x" * (mpsstandin.MAX_REQUEST + 10))
        conn.shutdown(socket.SHUT_WR)
        assert conn.recv(100) == b""  # dropped without an answer
    assert mpsstandin.send(pipe, "get_server_list\n").returncode == 0


def test_a_symlink_planted_in_the_pipe_directory_is_replaced_not_followed(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (pipe / mpsstandin.CONTROL_SOCKET).symlink_to(victim)
    standin = mpsstandin.StandinDaemon(pipe, UUID, {}, None)
    standin.start()
    try:
        assert not (pipe / mpsstandin.CONTROL_SOCKET).is_symlink()
        assert victim.read_text() == "keep"
    finally:
        standin.stop()
    assert victim.read_text() == "keep"


def test_the_client_without_a_daemon_fails_as_the_real_tool(tmp_path: Path) -> None:
    answer = mpsstandin.send(tmp_path, "get_server_list\n")
    assert (answer.returncode, answer.stdout) == (1, mpsstandin.NO_DAEMON)


def test_the_installed_script_is_the_tool(
    tmp_path: Path, daemon: tuple[subprocess.Popen[bytes], Path]
) -> None:
    _, pipe = daemon
    root = tmp_path / "nvidia-root"
    assert mpsstandin.main(["--install", str(root)]) == 0
    tool = root / "usr" / "bin" / "nvidia-cuda-mps-control"
    assert tool.stat().st_mode & 0o777 == 0o755
    env = {"PATH": os.environ["PATH"], "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    ran = subprocess.run(
        [str(tool)], input="get_server_list\n", env=env, capture_output=True, text=True, check=False
    )
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "", "")
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(tmp_path / "none")
    ran = subprocess.run(
        [str(tool)], input="get_server_list\n", env=env, capture_output=True, text=True, check=False
    )
    assert (ran.returncode, ran.stdout) == (1, mpsstandin.NO_DAEMON)


@pytest.mark.parametrize("argv", [["-d"], ["--install", "relative/dir"], ["-f", "extra"]])
def test_other_arguments_are_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert mpsstandin.main(argv) == 2
    assert "usage: nvidia-cuda-mps-control" in capsys.readouterr().err


def test_the_simulated_host_drives_stand_in_daemon_pods(
    tmp_path: Path, daemon: tuple[subprocess.Popen[bytes], Path]
) -> None:
    """With a daemon pod template and a namespace the simulated host launches daemons through
    the pod launcher and sends MPS control commands to the stand-in daemon's sockets."""
    _, pipe = daemon
    template = tmp_path / "daemon-pod.yaml"
    template.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: mps}\n"
        "spec: {containers: [{name: mps-control-daemon, image: x}]}\n"
    )
    host = SimulatedHost(
        "n1",
        SimulatedOptions(),
        tmp_path,
        mps_daemon_pod_template=template,
        namespace="gpu",
    )
    assert host.runs_daemon_pods()
    tools = host.share_tools(rest=object())  # type: ignore[arg-type]
    assert isinstance(tools.launcher, PodLauncher)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    assert (
        tools.runner.run(
            MPS_CONTROL, [], env=env, stdin="set_default_active_thread_percentage 20\n"
        ).stdout
        == "20.0\n"
    )
    assert mpsstandin.send(pipe, "get_default_active_thread_percentage\n").stdout == "20.0\n"
    # Without a template or a namespace, the daemons are simulated in the process.
    plain = SimulatedHost("n1", SimulatedOptions(), tmp_path, namespace="gpu")
    assert not plain.runs_daemon_pods()
    assert not isinstance(plain.share_tools(rest=None).launcher, PodLauncher)
