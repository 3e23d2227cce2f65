"""Shared helpers of the sharing tests: an enforcer over simulated NVIDIA tools, GpuConfig
entries, and reading a prepared claim's CDI environment."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeletplugin.runner import FakeRunner
from kubeletplugin.sharing.enforcer import SharingEnforcer
from kubeletplugin.sharing.simulator import SimulatedNvidiaTools
from tests.kubeletplugin.prepare import helpers as h

GI = 1024**3
MI = 1024**2
LIBRARY = "/opt/limits/libvgpu.so"


@dataclass
class Tools:
    """Simulated GPUs shared by every enforcer of a test (they outlive plugin restarts)."""

    sim: SimulatedNvidiaTools
    fake: FakeRunner

    @staticmethod
    def new() -> Tools:
        sim = SimulatedNvidiaTools()
        return Tools(sim, sim.install(FakeRunner()))

    def enforcer(self, data_dir: Path, limits_library: str | None = None) -> SharingEnforcer:
        return SharingEnforcer(
            self.fake, data_dir, driver_name=h.DRIVER, limits_library=limits_library
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
