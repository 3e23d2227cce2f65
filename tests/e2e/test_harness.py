"""The end-to-end harness itself, without a control plane: the build script's arguments and
cache key, the prerequisite check, and processes stopped by their PID with failures that name
the step, the command and the log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.binaries import BUILD_SCRIPT, kubernetes_version, missing_prerequisites
from tests.e2e.processes import Processes, StepFailed, forbidden_lines, step, wait_until


def _script(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    return subprocess.run(
        ["bash", str(BUILD_SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_bin_dir_is_keyed_by_version_and_pins(tmp_path: Path) -> None:
    out = _script("--print-dir", cache=tmp_path)
    assert out.returncode == 0, out.stderr
    path = Path(out.stdout.strip())
    assert path.parent.parent == tmp_path / "sharegpu-e2e"
    version, _, digest = path.parent.name.partition("-")
    assert version == kubernetes_version() == "v1.37.2"
    assert len(digest) == 12 and int(digest, 16) >= 0
    assert path.name == "bin" and not path.exists()  # --print-dir builds nothing


def test_unknown_binary_is_refused_naming_the_allowed_ones(tmp_path: Path) -> None:
    out = _script("kube-proxy", cache=tmp_path)
    assert out.returncode == 1
    assert "unknown argument 'kube-proxy'" in out.stderr and "kube-apiserver" in out.stderr
    assert not (tmp_path / "sharegpu-e2e").exists()


def test_prerequisites_name_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    missing = missing_prerequisites()
    assert any("no Go toolchain" in m for m in missing), missing
    assert any("flock" in m for m in missing), missing


def test_processes_are_stopped_by_pid_even_when_they_ignore_sigterm(tmp_path: Path) -> None:
    processes = Processes(tmp_path)
    polite = processes.start("polite", [sys.executable, "-c", "import time; time.sleep(600)"])
    stubborn = processes.start(
        "stubborn",
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(600)",
        ],
    )
    wait_until(lambda: "ready" in stubborn.log.read_text(), "start", "ready", process=stubborn)
    stubborn_pid = stubborn.pid
    processes.stop_all(grace_s=1.0)
    assert processes.started == []
    assert polite.popen.returncode is not None and stubborn.popen.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(stubborn_pid, 0)


def test_a_failed_step_names_the_step_the_command_and_the_log(tmp_path: Path) -> None:
    processes = Processes(tmp_path)
    proc = processes.start(
        "crasher", [sys.executable, "-c", "print('line one'); print('bad flag --x'); exit(3)"]
    )
    with pytest.raises(StepFailed) as failed:
        wait_until(lambda: False, "start crasher", "never", process=proc, deadline_s=60)
    text = str(failed.value)
    assert "step 'start crasher' failed" in text
    assert "crasher exited with code 3" in text
    assert "-c print('line one')" in text
    assert "bad flag --x" in text and str(proc.log) in text
    processes.stop_all()
    expected = r"step 'parse' failed\n  command: kubectl get x\n  ValueError: no such thing"
    with pytest.raises(StepFailed, match=expected), step("parse", "kubectl get x"):
        raise ValueError("no such thing")


def test_forbidden_lines_are_403_answers_not_timestamps() -> None:
    """A log line whose timestamp ends in ,403 milliseconds is no 403 answer (it failed the RBAC
    step once); the status code and the word are."""
    log = "\n".join(
        [
            "2026-11-28 10:32:01,403 INFO controller: webhook on https://127.0.0.1:39787",
            "listening on 127.0.0.1:4030 and 14031",
            "2026-11-28 10:32:02,001 WARNING kube: GET /apis/x: HTTP 403",
            'resourceclaims is forbidden: User "system:serviceaccount:x" cannot list',
        ]
    )
    assert forbidden_lines(log) == log.splitlines()[2:]
