"""The daemon as built from its flags (mock backend, consumable mode) enforces a claim's
``capacity.requests: {cores: 30, memory: 10Gi}`` exactly, through the in-process API server and
the kubelet simulator, and runs the node commands through the simulated NVIDIA tools."""

from __future__ import annotations

import json
from pathlib import Path

from kubeletplugin.config import parse_config
from kubeletplugin.hosts.simtools import PID_FILE
from kubeletplugin.main import build_plugin
from kubeletplugin.sharing.mpspaths import daemon_id
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.kubelet import KubeletSim
from tests.kubeletplugin.kubelet.helpers import socket_dirs
from tests.kubeletplugin.prepare.helpers import DRIVER, GI, NODE, claim, ref, result
from tests.kubeletplugin.prepare.helpers import cdi_validator as cdi_schema
from tests.kubeletplugin.publish.helpers import create_node


def test_daemon_enforces_a_30_core_10gi_share(apiserver: KubeAPIServer) -> None:
    create_node(apiserver, NODE)
    with socket_dirs() as dirs:
        kubeconfig = apiserver.write_kubeconfig(dirs.root / "kubeconfig")
        cdi_dir = dirs.root / "cdi"
        config = parse_config(
            [
                "--node-name",
                NODE,
                "--kubeconfig",
                kubeconfig,
                "--device-backend",
                "mock",
                "--mock-gpus",
                "2",
                "--plugin-registry-dir",
                str(dirs.registry),
                "--plugin-data-dir",
                str(dirs.data),
                "--cdi-dir",
                str(cdi_dir),
                "--mock-boot-id-file",
                str(_boot_id(dirs.root)),
                "--disable-health",
            ],
            environ={},
        )
        plugin = build_plugin(config)
        obj = claim("train", [result("gpu", "gpu-1", share={"cores": 30, "memory": 10 * GI})])
        apiserver.store.put("resourceclaims", obj)
        uid = obj["metadata"]["uid"]
        plugin.start()
        try:
            with KubeletSim(dirs.registry) as kubelet, kubelet.register(DRIVER) as kplugin:
                assert kplugin.prepare([ref(obj)])[uid].error == ""
                spec = json.loads((cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json").read_text())
                cdi_schema().validate(spec)
                env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
                assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
                assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{plugin.gpus[1].uuid}=10240M"
                gpu_uuid = plugin.gpus[1].uuid
                assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"/run/sharegpu/mps/{gpu_uuid}/pipe"
                # The simulated daemon writes its pid file where the real one does: in the
                # claim's host directory on that GPU, named by its daemon id.
                pid_file = dirs.data / "mps" / daemon_id(uid, gpu_uuid) / "pipe" / PID_FILE
                assert pid_file.exists()
                assert kplugin.unprepare([ref(obj)]) == {uid: ""}
                assert not pid_file.exists()
        finally:
            plugin.stop()


def _boot_id(root: Path) -> Path:
    path = root / "boot_id"
    path.write_text("0f2b7a52-5d7e-4c1e-9a51-2f4d8c9e6b10\n")
    return path
