"""The node plugin against a real NVIDIA GPU (root only; skipped elsewhere with the reason).

- discovery through NVML equals what ``nvidia-smi --query-gpu`` prints;
- two MPS shares (10Gi/25% and 20Gi/50%) of one GPU, prepared over the real DRA socket from
  claims in the embedded API server, with the MPS daemon run by
  :class:`~tests.gpu.hostlauncher.HostMpsLauncher`; CUDA clients run in containers emulated from
  each claim's CDI spec (:mod:`tests.gpu.container`, :mod:`tests.gpu.enter`) as
  :data:`CLIENT_UID`: an allocation below the share works, one above it fails; unprepare
  restores the GPU's compute mode and leaves no daemon.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import kubernetes.client
import pytest

from kubeletplugin.devices.mig import MIG_DISABLED, MIG_ENABLED
from kubeletplugin.devices.nvml import NvmlBackend, normalize_pci_bus_id
from kubeletplugin.devices.table import node_devices
from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.kubelet.server import PluginServer
from kubeletplugin.model import GpuInfo
from kubeletplugin.prepare.cdi import CdiSpecWriter
from kubeletplugin.prepare.checkpoint import Checkpoint
from kubeletplugin.prepare.claims import KubeClaimGetter
from kubeletplugin.prepare.state import DeviceState
from kubeletplugin.runner import HostRunner
from kubeletplugin.sharing.daemons import DaemonPhase, DaemonSpec
from kubeletplugin.sharing.enforcer import build_enforcer
from kubeletplugin.sharing.mps import EXCLUSIVE_PROCESS
from kubeletplugin.sharing.mpspaths import MpsPaths
from kubeletplugin.sharing.timeslice import query_compute_mode
from sharegpu.local.apiserver import KubeAPIServer
from sharegpu.local.kubelet import KubeletSim
from tests.gpu import cudaprobe
from tests.gpu.container import (
    ContainerPlan,
    enter_command,
    load_specs,
    missing_targets,
    plan_for,
)
from tests.gpu.gpuenv import skip_reason
from tests.gpu.hostlauncher import HostMpsLauncher
from tests.kubeletplugin.prepare.helpers import DRIVER, GI, NODE, claim, ref, result
from tests.kubeletplugin.sharing.helpers import gpu_config

SKIP = skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

MIB: Final = 1024**2
#: The UID the emulated containers run as (a non-root tenant).
CLIENT_UID: Final = 1000
#: (share GiB, cores %, GiB that must fit, GiB that must not).
SHARES: Final = ((10, 25, 9.0, 12.0), (20, 50, 15.0, 21.0))
#: Kinds whose IDs the emulation leaves out: the host provides the driver libraries.
SKIP_KINDS: Final = ("nvidia.com/gpu",)
SMI_QUERY: Final = (
    "index,uuid,name,pci.bus_id,memory.total,driver_version,compute_cap,mig.mode.current"
)


def smi_rows() -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [[f.strip() for f in line.split(",")] for line in out.splitlines() if line.strip()]


def test_discovery_matches_nvidia_smi() -> None:
    gpus = NvmlBackend().discover()
    mig = {"Enabled": MIG_ENABLED, "Disabled": MIG_DISABLED}
    expected = [
        (int(r[0]), r[1], r[2], normalize_pci_bus_id(r[3]), int(r[4]), r[5], r[6], mig.get(r[7]))
        for r in smi_rows()
    ]
    got = [
        (
            g.index,
            g.uuid,
            g.product_name,
            g.pci_bus_id,
            g.memory_total // MIB,
            g.driver_version,
            g.cuda_compute_capability,
            g.mig_mode,
        )
        for g in gpus
    ]
    assert got == expected
    assert all(g.memory_usable == g.memory_total - g.memory_reserved for g in gpus)


class GpuNode:
    """DeviceState with the NVML devices, real commands and host MPS daemons, served on a DRA
    socket under ``root``."""

    def __init__(self, root: Path, client: kubernetes.client.ApiClient) -> None:
        self.root = root
        self.gpus = NvmlBackend().discover()
        self.mps_root = root / "mps"
        control = shutil.which("nvidia-cuda-mps-control") or "nvidia-cuda-mps-control"
        self.launcher = HostMpsLauncher(self.mps_root, control)
        self.state = DeviceState(
            driver_name=DRIVER,
            node_name=NODE,
            devices=node_devices(self.gpus, "consumable"),
            claims=KubeClaimGetter(client),
            cdi=CdiSpecWriter(root / "cdi", DRIVER, dev_root=Path("/dev")),
            checkpoint=Checkpoint(root / "data"),
            enforcer=build_enforcer(
                "nvml",
                root / "data",
                driver_name=DRIVER,
                mps_root=self.mps_root,
                launcher=self.launcher,
            ),
        )
        self.state.start()
        self.registry = root / "reg"
        self.server = PluginServer(DRIVER, self.registry, root / "plug", self.state)
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=1.0)


@pytest.fixture
def gpu_node(kube_client: kubernetes.client.ApiClient) -> Iterator[GpuNode]:
    root = Path(tempfile.mkdtemp(prefix="sgpu-", dir="/tmp"))
    root.chmod(0o755)  # the clients (CLIENT_UID) read the probe from here
    node = GpuNode(root, kube_client)
    try:
        yield node
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


def shareable_gpu(gpus: list[GpuInfo]) -> GpuInfo:
    for gpu in gpus:
        if gpu.mig_mode != MIG_ENABLED and gpu.memory_usable >= (SHARES[1][3] + 2) * GI:
            return gpu
    pytest.skip(f"no GPU without MIG and with {SHARES[1][3] + 2:.0f} GiB usable")


def run_client(plan: ContainerPlan, gib: float, probe: Path) -> tuple[int, dict[str, Any]]:
    """Run the CUDA probe for ``gib`` GiB in the emulated container; (exit status, report)."""
    argv = [os.path.realpath(sys.executable), "-I", "-S", str(probe), str(gib)]
    created = missing_targets(plan)
    for path, is_dir in created:
        if is_dir:
            path.mkdir()
        else:
            path.touch()
    try:
        done = subprocess.run(
            enter_command(plan, argv, CLIENT_UID),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        for path, is_dir in reversed(created):
            if is_dir:
                path.rmdir()
            else:
                path.unlink()
    lines = done.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if lines else {"stderr": done.stderr.strip()}
    return done.returncode, report


def test_mps_shares_limit_memory_and_unprepare_restores(
    gpu_node: GpuNode, apiserver: KubeAPIServer
) -> None:
    gpu = shareable_gpu(gpu_node.gpus)
    mode_before = query_compute_mode(HostRunner("/"), gpu.uuid)
    probe = gpu_node.root / "cudaprobe.py"
    shutil.copyfile(cudaprobe.__file__, probe)
    probe.chmod(0o644)
    claims = [
        claim(
            f"mps-{size}gi",
            [result("gpu", f"gpu-{gpu.index}", share={"cores": cores, "memory": size * GI})],
            configs=[gpu_config({"strategy": "MPS"})],
        )
        for size, cores, _fits, _too_big in SHARES
    ]
    for obj in claims:
        apiserver.store.put("resourceclaims", obj)
    refs: list[ClaimRef] = [ref(c) for c in claims]
    expected: dict[tuple[int, float], int] = {}
    got: dict[tuple[int, float], int] = {}
    reports: dict[tuple[int, float], dict[str, Any]] = {}
    with KubeletSim(gpu_node.registry) as sim, sim.register(DRIVER) as kplugin:
        try:
            results = kplugin.prepare(refs)
            assert {uid: r.error for uid, r in results.items()} == {r.uid: "" for r in refs}
            assert query_compute_mode(HostRunner("/"), gpu.uuid) == EXCLUSIVE_PROCESS
            specs = load_specs(gpu_node.root / "cdi")
            for (size, _cores, fits, too_big), one in zip(SHARES, refs, strict=True):
                ids = [i for d in results[one.uid].devices for i in d.cdi_device_ids]
                plan = plan_for(specs, ids, SKIP_KINDS)
                for gib, status in ((fits, cudaprobe.EXIT_OK), (too_big, cudaprobe.EXIT_ALLOC)):
                    expected[(size, gib)] = status
                    got[(size, gib)], reports[(size, gib)] = run_client(plan, gib, probe)
        finally:
            errors = kplugin.unprepare(refs)
    assert got == expected, reports
    assert errors == {r.uid: "" for r in refs}
    assert query_compute_mode(HostRunner("/"), gpu.uuid) == mode_before
    daemon = DaemonSpec(MpsPaths(gpu_node.mps_root, gpu.uuid))
    assert gpu_node.launcher.phase(daemon) is DaemonPhase.ABSENT
