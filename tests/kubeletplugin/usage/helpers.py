"""Builders of the usage-stage tests: GPUs, pods, claims and shares, a /proc tree, a fake claim
API and a taint sink."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.usage.model import PreparedShare
from sharegpu.kube.rest import KubeApiError

GI = 2**30
GPUS = MockBackend("node-a", 2).discover()
GPU0, GPU1 = GPUS[0].uuid, GPUS[1].uuid
POD_A = "0a1b2c3d-0000-4000-8000-00000000000a"
POD_B = "0a1b2c3d-0000-4000-8000-00000000000b"
CLAIM_A = "11111111-0000-4000-8000-000000000001"
CLAIM_B = "11111111-0000-4000-8000-000000000002"


def share(claim: str, name: str, gpu: str, cores: int, memory: int, sid: str) -> PreparedShare:
    return PreparedShare(claim, "ml", name, "node-a", "gpu-0", sid, gpu, cores, memory)


SHARE_A = share(CLAIM_A, "a", GPU0, 30, 10 * GI, "s-a")
SHARE_B = share(CLAIM_B, "b", GPU0, 50, 20 * GI, "s-b")


def write_proc(root: Path, pid: int, cgroup: bytes) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_bytes(cgroup)


class FakeClaims:
    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.puts: list[dict[str, Any]] = []
        self.conflict = False

    def add(self, name: str, uid: str, pods: list[str]) -> None:
        self.claims[name] = {
            "metadata": {"name": name, "namespace": "ml", "uid": uid},
            "status": {
                "reservedFor": [{"resource": "pods", "name": "p", "uid": u} for u in pods],
                "devices": [{"driver": "other.example.com", "pool": "x", "device": "y"}],
            },
        }

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        if name not in self.claims:
            raise KubeApiError(404, "NotFound", "gone")
        return self.claims[name]

    def put_status(self, namespace: str, name: str, claim: Any) -> dict[str, Any]:
        if self.conflict:
            raise KubeApiError(409, "Conflict", "changed")
        self.puts.append(claim)
        self.claims[name] = claim
        return dict(claim)


class Sink:
    def __init__(self) -> None:
        self.taints: Any = None

    def set_taints(self, taints: Any) -> None:
        self.taints = taints
