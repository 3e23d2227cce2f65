"""The daemon as built from its flags (mock backend) judges escapes from MPS: a share prepared
with the default MPS strategy, its MPS client, the server of a daemon pod listed from the API
server (label and node), and a plain process of the claim's pod reach the claim's status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.config import parse_config
from kubeletplugin.hosts.simulated import SimulatedHost, simulated_share_tools
from kubeletplugin.main import build_plugin
from kubeletplugin.usage.mpsdaemons import DAEMON_POD_SELECTOR
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.kubelet import KubeletSim
from tests.helpers import eventually
from tests.kubeletplugin.kubelet.helpers import socket_dirs
from tests.kubeletplugin.prepare.helpers import DRIVER, GI, NODE, claim, ref, result
from tests.kubeletplugin.publish.helpers import create_node

NAMESPACE = "gpu-operators"
POD = "0a1b2c3d-0000-4000-8000-00000000000a"


def daemon_pod(name: str, node: str) -> dict[str, Any]:
    key, value = DAEMON_POD_SELECTOR.split("=")
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {key: value}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
    }


def share_data(apiserver: KubeAPIServer, name: str) -> dict[str, Any] | None:
    stored = apiserver.store.get("resourceclaims", name, "default")
    for entry in (stored or {}).get("status", {}).get("devices") or []:
        if entry.get("driver") == DRIVER and "data" in entry:
            return dict(entry["data"])
    return None


def wait_for(apiserver: KubeAPIServer, name: str, outside: int) -> dict[str, Any]:
    """The usage data of claim ``name`` once it counts ``outside`` processes outside MPS."""

    def reached() -> dict[str, Any] | None:
        data = share_data(apiserver, name)
        return data if data is not None and data.get("processesOutsideMPS") == outside else None

    return eventually(reached, f"usage with {outside} processes outside MPS", timeout_s=60)


def _template(directory: Path) -> Path:
    """A daemon pod template file (it makes the host one whose daemons are pods)."""
    path = directory / "daemon-pod.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: mps}\n"
        "spec: {containers: [{name: mps-control-daemon, image: sharegpu}]}\n"
    )
    return path


def test_daemon_flags_a_plain_process_next_to_an_mps_share(
    apiserver: KubeAPIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemons themselves are simulated in the process (no kubelet runs pods here); the
    # daemon pods the sampler reads are the ones stored below.
    monkeypatch.setattr(SimulatedHost, "share_tools", lambda _self, _rest: simulated_share_tools())
    create_node(apiserver, NODE)
    here = apiserver.store.put("pods", daemon_pod("mps-here", NODE))
    # A daemon pod of another node is no server of this one.
    there = apiserver.store.put("pods", daemon_pod("mps-there", "node-b"))
    with socket_dirs() as dirs:
        usage_file = dirs.root / "usage.yaml"
        config = parse_config(
            [
                *("--node-name", NODE, "--device-backend", "mock", "--mock-gpus", "1"),
                *("--kubeconfig", apiserver.write_kubeconfig(dirs.root / "kubeconfig")),
                *("--plugin-registry-dir", str(dirs.registry)),
                *("--plugin-data-dir", str(dirs.data), "--cdi-dir", str(dirs.root / "cdi")),
                *("--mock-boot-id-file", str(_boot_id(dirs.root)), "--disable-health"),
                *("--namespace", NAMESPACE, "--usage-interval", "0.1"),
                *("--mock-usage-file", str(usage_file)),
                # Stands in for a node whose daemons are pods (their servers found by pod).
                *("--mps-daemon-pod-template", str(_template(dirs.root))),
            ],
            environ={},
        )
        plugin = build_plugin(config)
        obj = claim("train", [result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})])
        obj["status"]["reservedFor"] = [{"resource": "pods", "name": "trainer", "uid": POD}]
        apiserver.store.put("resourceclaims", obj)
        uid = obj["metadata"]["uid"]
        client = f"{{claim: {uid}, pod: {POD}, mpsClient: true, memory: 1Gi}}"
        servers = [
            f"{{pod: {here['metadata']['uid']}, memory: 64Mi}}",
            f"{{pod: {there['metadata']['uid']}, memory: 64Mi}}",
        ]
        usage_file.write_text(f"0: [{client}, {servers[0]}]\n")
        plugin.start()
        try:
            with KubeletSim(dirs.registry) as kubelet, kubelet.register(DRIVER) as kplugin:
                assert kplugin.prepare([ref(obj)])[uid].error == ""
                data = wait_for(apiserver, "train", 0)
                assert data["processes"] == 1 and "escapedPods" not in data
                # The claim's pod runs a plain CUDA process; the other node's server is no
                # server here.
                plain = f"{{pod: {POD}, memory: 2Gi, sm: 90}}"
                usage_file.write_text(f"0: [{client}, {servers[0]}, {servers[1]}, {plain}]\n")
                # The claim counts its own escape only; the other node's server (no share's
                # process) is the node's to report, not this tenant's.
                data = wait_for(apiserver, "train", 1)
                assert data["escapedPods"] == [POD] and data["processes"] == 2
                assert "smUtilization" not in data
                assert kplugin.unprepare([ref(obj)]) == {uid: ""}
        finally:
            plugin.stop()


def _boot_id(root: Path) -> Path:
    path = root / "boot_id"
    path.write_text("0f2b7a52-5d7e-4c1e-9a51-2f4d8c9e6b10\n")
    return path
