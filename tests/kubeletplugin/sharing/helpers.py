"""Shared helpers of the sharing tests: an enforcer over simulated NVIDIA tools, a fake pod API,
GpuConfig entries, and reading a prepared claim's CDI environment."""

from __future__ import annotations

import copy
import shutil
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubeletplugin.devicerecord import DeviceRecord
from kubeletplugin.hosts.fakerunner import FakeRunner
from kubeletplugin.hosts.simtools import SimulatedLauncher, SimulatedNvidiaTools
from kubeletplugin.model import GpuInfo
from kubeletplugin.sharing.daemonpods import DAEMON_CONTAINER
from kubeletplugin.sharing.enforcement import Applied
from kubeletplugin.sharing.enforcer import SharingEnforcer
from tests.kubeletplugin.prepare import helpers as h

GI = 1024**3
MI = 1024**2
LIBRARY = "/opt/limits/libvgpu.so"


def query_compute_mode(uuid: str) -> tuple[str, ...]:
    """The read-only command that asks a GPU's compute mode (before time-slicing or MPS set it)."""
    return ("nvidia-smi", "-i", uuid, "--query-gpu=compute_mode", "--format=csv,noheader")


@dataclass
class Tools:
    """Simulated GPUs and daemon pods shared by every enforcer of a test (they outlive plugin
    restarts, as the GPUs and the daemon pods of a node do)."""

    sim: SimulatedNvidiaTools
    fake: FakeRunner
    pods: SimulatedLauncher
    #: The node's MPS root: short, as on a real node (socket paths hold at most 107 bytes, and
    #: pytest's temporary paths are long), removed with the tools.
    mps_root: Path = field(default_factory=lambda: h.short_mps_root())

    @staticmethod
    def new() -> Tools:
        sim = SimulatedNvidiaTools()
        tools = Tools(sim, sim.install(FakeRunner()), SimulatedLauncher(sim))
        weakref.finalize(tools, shutil.rmtree, tools.mps_root, True)
        return tools

    def enforcer(self, data_dir: Path, limits_library: str | None = None) -> SharingEnforcer:
        return SharingEnforcer(
            self.fake,
            data_dir,
            driver_name=h.DRIVER,
            launcher=self.pods,
            limits_library=limits_library,
            mps_root=self.mps_root,
        )


def gpu_config(sharing: dict[str, Any], requests: list[str] | None = None) -> dict[str, Any]:
    """A claim config entry for this driver carrying a GpuConfig with ``sharing``."""
    entry: dict[str, Any] = {
        "source": "FromClaim",
        "opaque": {
            "driver": h.DRIVER,
            "parameters": {
                "apiVersion": "resource.sharegpu.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": sharing,
            },
        },
    }
    if requests is not None:
        entry["requests"] = requests
    return entry


def claim_env(node: h.Node, claim_uid: str) -> list[dict[str, str]]:
    """Environment of each CDI device of the claim's (schema-valid) spec file."""
    doc = h.assert_valid_cdi(node.cdi_dir / f"k8s.{h.DRIVER}-claim_{claim_uid}.json")
    return [h.spec_env(doc, i) for i in range(len(doc["devices"]))]


def claim_mounts(node: h.Node, claim_uid: str) -> list[list[dict[str, Any]]]:
    doc = h.assert_valid_cdi(node.cdi_dir / f"k8s.{h.DRIVER}-claim_{claim_uid}.json")
    return [d["containerEdits"].get("mounts", []) for d in doc["devices"]]


class FakePodApi:
    """An API server's pods with a node's kubelet behind them: a created daemon pod runs the
    simulated daemon at once and reports itself running and ready; :meth:`crash` ends the
    daemon and reports the container as crash-looping, as kubelet does for a daemon that
    exited; a deleted pod is gone at once and its daemon ends."""

    def __init__(self, sim: SimulatedNvidiaTools) -> None:
        self.sim = sim
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.created = 0

    def create(self, namespace: str, pod: Mapping[str, Any]) -> None:
        body = copy.deepcopy(dict(pod))
        name = body["metadata"]["name"]
        assert (namespace, name) not in self.pods, "a pod is never created twice"
        container = next(c for c in body["spec"]["containers"] if c["name"] == DAEMON_CONTAINER)
        env = {e["name"]: e["value"] for e in container["env"]}
        self.sim.start_daemon(env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_VISIBLE_DEVICES"], env)
        body["status"] = {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": DAEMON_CONTAINER,
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                }
            ],
        }
        self.pods[(namespace, name)] = body
        self.created += 1

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod = self.pods.get((namespace, name))
        return copy.deepcopy(pod) if pod is not None else None

    def delete(self, namespace: str, name: str, grace_seconds: int) -> None:
        pod = self.pods.pop((namespace, name), None)
        if pod is not None:
            self.sim.end_daemon(_pipe_of(pod))

    def list(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        key, value = label_selector.split("=", 1)
        return [
            copy.deepcopy(p)
            for (ns, _), p in self.pods.items()
            if ns == namespace and p["metadata"].get("labels", {}).get(key) == value
        ]

    def crash(self, namespace: str, name: str) -> None:
        pod = self.pods[(namespace, name)]
        self.sim.end_daemon(_pipe_of(pod))
        [status] = pod["status"]["containerStatuses"]
        status.update(
            ready=False,
            restartCount=1,
            state={"waiting": {"reason": "CrashLoopBackOff"}},
        )


def _pipe_of(pod: Mapping[str, Any]) -> str:
    container = next(c for c in pod["spec"]["containers"] if c["name"] == DAEMON_CONTAINER)
    return str(next(e["value"] for e in container["env"] if e["name"] == "CUDA_MPS_PIPE_DIRECTORY"))


def record(
    gpu: GpuInfo,
    device: str,
    requests: tuple[str, ...],
    cores: int,
    memory: int,
    share_id: str | None = None,
    *,
    partition: str | None = None,
    admin_access: bool = False,
) -> DeviceRecord:
    """A device record as the state module hands it to the enforcer: its GPU attached, nothing
    decided yet (its CDI name and IDs play no part in enforcement)."""
    return DeviceRecord(
        requests=requests,
        pool=h.NODE,
        device=device,
        gpu_uuid=gpu.uuid,
        cores=cores,
        memory=memory,
        cdi_name=f"claim-{device}" + (f"-{share_id}" if share_id else ""),
        cdi_device_ids=(),
        share_id=share_id,
        partition=partition,
        admin_access=admin_access,
        gpu_info=gpu,
    )


def decided(devices: Sequence[DeviceRecord], applied: Applied) -> list[DeviceRecord]:
    """``devices`` with what ``apply`` decided for each, as the state module records them."""
    return [replace(d, enforcement=e) for d, e in zip(devices, applied.decisions, strict=True)]
