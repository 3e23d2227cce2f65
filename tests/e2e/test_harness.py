"""The end-to-end harness itself, without a control plane: the build script's arguments and
cache key, the prerequisite check, and processes stopped by their PID with failures that name
the step, the command and the log."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from api.upstream import UPSTREAM
from tests.e2e.binaries import (
    BUILD_SCRIPT,
    E2E_DIR,
    KUBERNETES_PINS,
    VERSION_ENV,
    missing_prerequisites,
    pinned_version,
)
from tests.e2e.controlplane import KUBECTL_TIMEOUT_MARGIN_S, KUBECTL_TIMEOUT_S, kubectl_timeout
from tests.e2e.netns import (
    SEAL_PROBES,
    SealBroken,
    SealedNetwork,
    enter,
    missing_network_prerequisites,
)
from tests.e2e.plugindaemon import OVERRIDES, PluginDaemon, install_values, values
from tests.e2e.processes import (
    Processes,
    StepFailed,
    forbidden_lines,
    interrupt_on_signals,
    step,
    wait_until,
)
from tests.paths import REPO_ROOT


def _script(*args: str, cache: Path, version: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), VERSION_ENV: version}
    return subprocess.run(
        ["bash", str(BUILD_SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_bin_dir_is_keyed_by_version_and_pins(tmp_path: Path) -> None:
    out = _script("--print-dir", cache=tmp_path)
    assert out.returncode == 0, out.stderr
    path = Path(out.stdout.strip())
    assert path.parent.parent == tmp_path / "sharegpu-e2e"
    version, _, digest = path.parent.name.partition("-")
    assert version == pinned_version(KUBERNETES_PINS) == f"v{UPSTREAM.kubernetes}"
    assert len(digest) == 12 and int(digest, 16) >= 0
    assert path.name == "bin" and not path.exists()  # --print-dir builds nothing


def test_a_second_pinned_release_is_picked_by_its_version(tmp_path: Path) -> None:
    """``make e2e K8S=<kubernetes-previous>`` builds from upstream/kubernetes-<minor>/ into a
    directory of its own; a release that is not pinned is refused naming the pinned ones."""
    release, previous = UPSTREAM.kubernetes_releases()
    default = Path(_script("--print-dir", cache=tmp_path).stdout.strip())
    second = Path(_script("--print-dir", cache=tmp_path, version=previous).stdout.strip())
    assert second.parent.name.startswith(f"v{previous}-") and second != default
    same = Path(_script("--print-dir", cache=tmp_path, version=f"v{release}").stdout.strip())
    assert same == default
    out = _script("--print-dir", cache=tmp_path, version="1.35.0")
    assert out.returncode == 1
    assert f"Kubernetes v1.35.0 is not pinned (pinned: v{release} v{previous})" in out.stderr


def _scratch_pins(tmp_path: Path, change: tuple[str, str, str]) -> Path:
    """A copy of the build script, its go.mod files and the pin file, with ``(file, old,
    new)`` replaced; returns the copied script."""
    e2e = tmp_path / "tree" / "tests" / "e2e"
    for gomod in (E2E_DIR / "upstream").glob("*/go.mod"):
        target = e2e / gomod.relative_to(E2E_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(gomod.read_text())
        (target.parent / "go.sum").write_text("")
    shutil.copy(BUILD_SCRIPT, e2e / BUILD_SCRIPT.name)
    (tmp_path / "tree" / "api").mkdir()
    (tmp_path / "tree" / "api" / "upstream.toml").write_text(
        (REPO_ROOT / "api" / "upstream.toml").read_text()
    )
    name, old, new = change
    path = tmp_path / "tree" / name
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    return e2e / BUILD_SCRIPT.name


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("api/upstream.toml", f'kubernetes = "{UPSTREAM.kubernetes}"', 'kubernetes = "1.99.0"'),
            "upstream/kubernetes/go.mod does not require k8s.io/kubernetes v1.99.0",
        ),
        (
            ("api/upstream.toml", f'etcd = "{UPSTREAM.etcd}"', 'etcd = "3.9.9"'),
            "upstream/etcd/go.mod does not require go.etcd.io/etcd/server/v3 v3.9.9",
        ),
        (
            (
                "tests/e2e/upstream/containerd/go.mod",
                f"containerd/v2 v{UPSTREAM.containerd}",
                "containerd/v2 v2.0.0",
            ),
            f"does not require github.com/containerd/containerd/v2 v{UPSTREAM.containerd}",
        ),
    ],
)
def test_the_build_refuses_pins_that_disagree_with_the_pin_file(
    tmp_path: Path, change: tuple[str, str, str], message: str
) -> None:
    script = _scratch_pins(tmp_path, change)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), VERSION_ENV: ""}
    out = subprocess.run(
        ["bash", str(script), "--print-dir"], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 1 and message in out.stderr, out.stderr
    assert not (tmp_path / "cache").exists()


def test_unknown_binary_is_refused_naming_the_allowed_ones(tmp_path: Path) -> None:
    out = _script("kube-dns", cache=tmp_path)
    assert out.returncode == 1
    assert "unknown argument 'kube-dns'" in out.stderr and "kube-proxy" in out.stderr
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


def test_every_command_line_goes_through_the_wrapper(tmp_path: Path) -> None:
    """What the sealed namespace relies on: a Processes with a wrapper starts nothing
    unwrapped."""
    seen: list[list[str]] = []

    def wrap(argv: Sequence[str]) -> list[str]:
        seen.append(list(argv))
        return ["env", "WRAPPED=1", *argv]

    processes = Processes(tmp_path, wrap=wrap)
    proc = processes.start(
        "child", [sys.executable, "-c", "import os; print(os.environ.get('WRAPPED'))"]
    )
    proc.popen.wait(60)
    processes.stop_all()
    assert proc.argv[:2] == ["env", "WRAPPED=1"] and len(seen) == 1
    assert proc.log.read_text().strip() == "1"


def test_the_install_sets_exactly_the_listed_overrides(tmp_path: Path) -> None:
    """Every value the run sets at ``helm install`` is in OVERRIDES with its reason, and every
    entry of OVERRIDES is set: the rest of the chart keeps its defaults."""
    node = SimpleNamespace(
        kubelet_dir=tmp_path / "kubelet", cdi_dir=tmp_path / "cdi", root=tmp_path
    )
    daemon = PluginDaemon(
        cast(Any, None), "helm", "", cast(Any, node), tmp_path / "data", "sharegpu:e2e"
    )
    sets, json_sets = install_values(daemon)
    keys = [v.split("=", 1)[0] for v in (*sets, *json_sets)]
    assert sorted(keys) == sorted(OVERRIDES), keys
    assert all(reason.strip() for reason in OVERRIDES.values())
    # A step's own values come on top of those (helm upgrade --set).
    assert "kubeletPlugin.sharingMode=partitions" in values(
        daemon, ("kubeletPlugin.sharingMode=partitions",)
    )


needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or bool(missing_network_prerequisites()),
    reason="network namespaces need root, ip and nsenter",
)


@needs_netns
def test_a_new_namespace_is_sealed_and_removed_without_a_trace() -> None:
    network = SealedNetwork()
    network.create()
    try:
        lines = network.prove_sealed()
        assert len(lines) == len(SEAL_PROBES), lines
        assert all(line.endswith(("ENETUNREACH", "EHOSTUNREACH")) for line in lines), lines
        assert not network.holds(os.getpid())
        assert network.call(lambda: network.holds(threading.get_native_id()))
    finally:
        network.remove()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert network.name not in listed and not network.path.exists()
    network.remove()  # idempotent


@needs_netns
def test_enter_moves_the_calling_thread_and_the_threads_it_starts() -> None:
    """A thread of a bench's own (a watch) joins the namespace with :func:`enter`; the threads it
    starts afterwards are in it too, the calling process is not."""
    network = SealedNetwork()
    network.create()
    seen: dict[str, bool] = {}

    def child() -> None:
        seen["child"] = network.holds(threading.get_native_id())

    def joined() -> None:
        enter(network.path)
        seen["thread"] = network.holds(threading.get_native_id())
        started = threading.Thread(target=child)
        started.start()
        started.join()

    try:
        thread = threading.Thread(target=joined)
        thread.start()
        thread.join(30)
        assert seen == {"thread": True, "child": True}
        assert not network.holds(threading.get_native_id())
    finally:
        network.remove()


def test_enter_names_the_namespace_it_cannot_enter(tmp_path: Path) -> None:
    not_a_namespace = tmp_path / "not-a-namespace"
    not_a_namespace.write_text("")
    with pytest.raises(OSError, match=r"setns.*not-a-namespace"):
        enter(not_a_namespace)


@needs_netns
def test_the_seal_check_fails_on_an_answer() -> None:
    """The proof is no formality: a listener at a probed address breaks it."""
    network = SealedNetwork()
    network.create()
    try:

        def listen() -> tuple[socket.socket, int]:
            server = socket.socket()
            server.bind(("127.0.0.1", 0))
            server.listen()
            return server, int(server.getsockname()[1])

        server, port = network.call(listen)
        with server, pytest.raises(SealBroken, match="a connection was accepted"):
            network.prove_sealed([("a listener inside", "127.0.0.1", port)])
    finally:
        network.remove()


def _fake_go(directory: Path, seconds: int) -> Path:
    """A ``go`` that takes ``seconds`` and writes the ``-o`` file it is given."""
    directory.mkdir(parents=True, exist_ok=True)
    go = directory / "go"
    go.write_text(
        "#!/bin/sh\n"
        f"sleep {seconds}\n"
        'while [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done\n'
        'printf "#!/bin/sh\\n" > "$out"; chmod +x "$out"\n'
    )
    go.chmod(0o755)
    return directory


@pytest.mark.skipif(shutil.which("flock") is None, reason="no flock (util-linux) on PATH")
def test_a_long_build_reports_progress_and_a_waiting_build_says_so(tmp_path: Path) -> None:
    fake = _fake_go(tmp_path / "fakebin", 3)
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        VERSION_ENV: "",
        "PATH": f"{fake}:{os.environ['PATH']}",
        "SHAREGPU_E2E_PROGRESS_S": "1",
    }
    out_dir = Path(_script("--print-dir", cache=tmp_path / "cache").stdout.strip()).parent
    out_dir.mkdir(parents=True)
    holder = subprocess.Popen(["flock", str(out_dir / ".lock"), "sleep", "5"])
    try:
        lock = str(out_dir / ".lock")
        wait_until(
            lambda: subprocess.run(["flock", "-n", lock, "true"]).returncode != 0,
            "hold the lock",
            "the lock held by another process",
        )
        built = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "kube-scheduler"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    finally:
        holder.wait(60)
    assert built.returncode == 0, built.stderr
    assert "holds" in built.stderr and "waiting for it" in built.stderr, built.stderr
    assert "still building kube-scheduler" in built.stderr, built.stderr
    assert (out_dir / "bin" / "kube-scheduler").exists()
    bad = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "kube-scheduler"],
        capture_output=True, text=True, env={**env, "SHAREGPU_E2E_PROGRESS_S": "soon"},
        timeout=60,
    )  # fmt: skip
    assert bad.returncode == 1 and "positive number of seconds, not 'soon'" in bad.stderr


def test_kubectl_may_run_as_long_as_its_own_timeout() -> None:
    """A ``kubectl wait --timeout=240s`` is not killed after the default 120 s."""
    assert kubectl_timeout(["get", "pods"]) == KUBECTL_TIMEOUT_S
    assert kubectl_timeout(["wait", "--timeout=240s"]) == 240 + KUBECTL_TIMEOUT_MARGIN_S
    assert kubectl_timeout(["wait", "--timeout=5m"]) == 300 + KUBECTL_TIMEOUT_MARGIN_S
    assert kubectl_timeout(["wait", "--timeout=30s"]) == KUBECTL_TIMEOUT_S


def test_the_first_signal_interrupts_and_later_ones_wait_for_the_cleanup() -> None:
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        interrupt_on_signals()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
        os.kill(os.getpid(), signal.SIGINT)  # ignored during the cleanup
        os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
