"""The real plugin process for the crash tests: started, killed with SIGKILL and restarted, a
kubelet that retries every call it lost, and the node check after each step."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.prepare.checkpoint import checksum_of
from sharegpuctl.local.kubelet import KubeletSim, RegisteredPlugin
from tests.helpers import eventually
from tests.kubeletplugin.prepare.checkpoint_files import read_document
from tests.kubeletplugin.prepare.helpers import DRIVER, NODE, assert_valid_cdi

GPUS = 4


@dataclass
class PluginProcess:
    """``python -m kubeletplugin`` with the mock backend, restartable, killable with SIGKILL."""

    root: Path
    kubeconfig: Path
    #: Further daemon flags (e.g. the sharing mode).
    extra_args: tuple[str, ...] = ()
    #: ``--mock-gpus``.
    gpus: int = GPUS
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    logs: list[Path] = field(default_factory=list)

    @property
    def registry(self) -> Path:
        return self.root / "reg"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def start(self) -> None:
        self.starts += 1
        log = self.root / f"plugin-{self.starts}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kubeletplugin",
                    "--device-backend=mock",
                    f"--mock-gpus={self.gpus}",
                    f"--node-name={NODE}",
                    f"--kubeconfig={self.kubeconfig}",
                    f"--plugin-registry-dir={self.registry}",
                    f"--plugin-data-dir={self.data_dir}",
                    f"--cdi-dir={self.cdi_dir}",
                    f"--mock-boot-id-file={self.root / 'boot_id'}",
                    f"--nvidia-cdi-dirs={self.root / 'no-toolkit'}",
                    "--disable-health",
                    *self.extra_args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def register(self, sim: KubeletSim) -> RegisteredPlugin:
        """Wait until the plugin answers registration (as kubelet's watcher would)."""
        errors: list[Exception] = []

        def answered() -> RegisteredPlugin | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                tail = self.logs[-1].read_text()[-3000:]
                raise AssertionError(f"plugin exited with {self.proc.returncode}:\n{tail}")
            try:
                return sim.register(DRIVER, timeout=2)
            except Exception as exc:
                errors.append(exc)
                return None

        return eventually(
            answered,
            lambda: f"registration (last error: {errors[-1] if errors else None!r})",
            timeout_s=60,
        )


@dataclass
class CrashingKubelet:
    """Kubelet's side of the kill -9 loops: one call at a time, the plugin killed before or
    during a call on request, and every call retried (restarting a killed plugin) until it
    gets an answer, as kubelet retries."""

    plugin: PluginProcess
    sim: KubeletSim
    kplugin: RegisteredPlugin
    kills: int = 0
    lost_calls: int = 0

    def call(self, op: str, r: ClaimRef, kill_after: float | None) -> tuple[str, Any]:
        """One kubelet call; ``kill_after`` < 0 kills the plugin before it, >= 0 that many
        seconds after it started (it may or may not have finished by then)."""
        box: dict[str, Any] = {}
        kplugin = self.kplugin

        def run() -> None:
            try:
                if op == "prepare":
                    box["result"] = kplugin.prepare([r])[r.uid].error
                else:
                    box["result"] = kplugin.unprepare([r])[r.uid]
            except grpc.RpcError as exc:
                box["rpc_error"] = exc

        if kill_after is not None and kill_after < 0:
            self.plugin.kill()  # dead before the call: the call is certainly lost
        t = threading.Thread(target=run)
        t.start()
        if kill_after is not None and kill_after >= 0:
            time.sleep(kill_after)
            self.plugin.kill()
        t.join(timeout=60)
        assert not t.is_alive()
        if "rpc_error" in box:
            return "lost", box["rpc_error"]
        return "done", box["result"]

    def answered(self, op: str, r: ClaimRef, kill_after: float | None) -> Any:
        """The answer to ``op`` of ``r`` (the prepare error, or the unprepare outcome), after
        as many retries and restarts as it takes."""
        proc = self.plugin
        outcome, value = self.call(op, r, kill_after)
        self.lost_calls += outcome == "lost"
        while outcome == "lost" or (proc.proc is not None and proc.proc.poll() is not None):
            if proc.proc is not None and proc.proc.poll() is not None:
                self.kills += 1
                self.kplugin.close()
                proc.start()
                self.kplugin = proc.register(self.sim)
            if outcome == "lost":
                outcome, value = self.call(op, r, None)
        return value


def check_node(plugin: PluginProcess, prepared: set[str], corrupt_copies: int = 0) -> None:
    """The checkpoint loads, the spec files are exactly the prepared claims, no GPU is held
    exclusively by one claim while another claim holds it too."""
    doc = read_document(plugin.data_dir)
    assert doc["checksum"] == checksum_of(doc)
    assert len(list(plugin.data_dir.glob("checkpoint.*.corrupt-*"))) == corrupt_copies
    completed = {u for u, c in doc["claims"].items() if c["state"] == "PrepareCompleted"}
    specs = {}
    for path in plugin.cdi_dir.glob("*.json"):
        uid = path.name.removeprefix(f"k8s.{DRIVER}-claim_").removesuffix(".json")
        specs[uid] = assert_valid_cdi(path)
    assert set(specs) == prepared
    assert completed == prepared
    holders: dict[str, list[tuple[str, bool]]] = {}
    for uid, spec in specs.items():
        for dev in spec["devices"]:
            env = dict(e.split("=", 1) for e in dev["containerEdits"]["env"])
            holders.setdefault(env["SHAREGPU_GPU_UUID"], []).append(
                (uid, "SHAREGPU_SHARE_ID" not in env)
            )
    for gpu, held in holders.items():
        exclusive = [uid for uid, whole in held if whole]
        assert not exclusive or len(held) == 1, f"GPU {gpu} handed out twice: {held}"
