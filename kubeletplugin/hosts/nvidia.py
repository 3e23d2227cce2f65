"""The real host: NVIDIA GPUs through NVML, the driver's tools under the driver root, MPS
daemons as pods, device nodes under ``/dev``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from kubeletplugin.devices.migpartition import MigPartitioner
from kubeletplugin.devices.nvml import NvmlBackend
from kubeletplugin.devices.prerequisites import check_driver_libraries
from kubeletplugin.devices.procdevices import DEFAULT_PROC_ROOT, ProcDevices
from kubeletplugin.devices.uvm import check_uvm
from kubeletplugin.fsutil import DEFAULT_BOOT_ID_FILE
from kubeletplugin.health.monitor import HealthChecker
from kubeletplugin.health.nvmlcheck import NvmlHealthChecker
from kubeletplugin.model import GpuInfo
from kubeletplugin.prepare.cdi import NvidiaCdiDetector
from kubeletplugin.runner import HostRunner
from kubeletplugin.sharing.daemonpods import pod_launcher_from_file
from kubeletplugin.sharing.daemons import DaemonLauncher, NoLauncher
from kubeletplugin.sharing.enforcer import ShareTools
from kubeletplugin.sharing.shm import TmpfsMounter
from kubeletplugin.usage.procfs import pid_namespace_problem
from kubeletplugin.usage.source import NvmlUsageSource, UsageSource
from sharegpu.kube.rest import KubeRest

#: Where the host's GPU device nodes are (the plugin runs privileged, seeing the host's /dev).
DEFAULT_DEV_ROOT: Final = Path("/dev")

#: Why MPS shares are refused on a node whose plugin has no daemon pod template.
NO_TEMPLATE: Final = (
    "this node's plugin has no MPS daemon pod template (--mps-daemon-pod-template), "
    "so it cannot run MPS daemons; use strategy TimeSlicing or Limits"
)


def nvidia_share_tools(driver_root: Path, launcher: DaemonLauncher | None = None) -> ShareTools:
    """Real commands under ``driver_root``, tmpfs shared memory, and MPS daemons run by
    ``launcher`` (without one, MPS shares are refused)."""
    return ShareTools(HostRunner(driver_root), launcher or NoLauncher(NO_TEMPLATE), TmpfsMounter())


class NvidiaHost:
    """:class:`~kubeletplugin.hosts.host.Host` of a node with NVIDIA GPUs and their driver.

    ``dev_root`` and ``proc_root`` are where the device nodes and ``/proc/devices`` are read
    (the host's ``/dev`` and ``/proc``, the same in every mount namespace; only tests point them
    at fixtures); ``nvidia_cdi_kind`` and ``nvidia_cdi_dirs`` find the NVIDIA
    Container Toolkit's CDI spec for :meth:`check_node`.
    """

    def __init__(
        self,
        *,
        driver_root: Path = Path("/"),
        node_name: str = "",
        nvidia_cdi: NvidiaCdiDetector | None = None,
        mps_daemon_pod_template: Path | None = None,
        namespace: str | None = None,
        dev_root: Path = DEFAULT_DEV_ROOT,
        proc_root: Path = DEFAULT_PROC_ROOT,
        boot_id_file: Path = DEFAULT_BOOT_ID_FILE,
    ) -> None:
        self.driver_root = driver_root
        self.node_name = node_name
        self.nvidia_cdi = nvidia_cdi
        self.mps_daemon_pod_template = mps_daemon_pod_template
        self.namespace = namespace
        self._proc_root = proc_root
        self._dev_root = dev_root
        self._boot_id_file = boot_id_file
        self._backend = NvmlBackend()

    @property
    def backend(self) -> NvmlBackend:
        return self._backend

    @property
    def dev_root(self) -> Path:
        return self._dev_root

    @property
    def proc_root(self) -> Path:
        return self._proc_root

    @property
    def boot_id_file(self) -> Path:
        return self._boot_id_file

    def check_node(self) -> None:
        """The CUDA unified-memory module (its nodes go into claims by their numbers when
        absent) and driver libraries for the workloads (the NVIDIA Container Toolkit's CDI spec
        or the ``nvidia`` default runtime); logged, never fatal."""
        check_uvm(self._dev_root, ProcDevices(self.proc_root))
        if self.nvidia_cdi is not None:
            check_driver_libraries(
                self.nvidia_cdi.spec_found(), self.nvidia_cdi.kind, self.nvidia_cdi.spec_dirs
            )

    def mig_partitioner(self) -> MigPartitioner:
        from kubeletplugin.devices.nvmlmig import NvmlMigPartitioner

        return NvmlMigPartitioner(self._backend)

    def runs_daemon_pods(self) -> bool:
        return self.mps_daemon_pod_template is not None and bool(self.namespace)

    def share_tools(self, rest: KubeRest | None) -> ShareTools:
        """MPS daemons run as pods (through ``rest``) only with a pod template and a namespace;
        raises :class:`~kubeletplugin.sharing.daemonpods.TemplateError` for an unusable
        template."""
        launcher = None
        template, namespace = self.mps_daemon_pod_template, self.namespace
        if template is not None and namespace and rest is not None:
            launcher = pod_launcher_from_file(
                rest, template, namespace=namespace, node_name=self.node_name
            )
        return nvidia_share_tools(self.driver_root, launcher)

    def health_checker(self) -> HealthChecker:
        return NvmlHealthChecker()

    def usage_source(self, gpus: Sequence[GpuInfo]) -> UsageSource:
        return NvmlUsageSource()

    def usage_problem(self) -> str | None:
        return pid_namespace_problem()
