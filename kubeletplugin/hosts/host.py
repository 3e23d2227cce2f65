"""The :class:`Host` seam: everything the daemon drives that differs between real and
simulated GPUs.

:mod:`kubeletplugin.main` picks one host from ``--device-backend`` and passes what it hands out
to the stages; no other module asks which backend runs. Each method builds a fresh object.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from kubeletplugin.devices.backend import DeviceBackend
from kubeletplugin.devices.migpartition import MigPartitioner
from kubeletplugin.health.monitor import HealthChecker
from kubeletplugin.model import GpuInfo
from kubeletplugin.sharing.enforcer import ShareTools
from kubeletplugin.usage.source import UsageSource
from sharegpu.kube.rest import KubeRest


class Host(Protocol):
    """The GPUs of a node with their driver tools, health and usage, real or simulated."""

    @property
    def backend(self) -> DeviceBackend:
        """GPU discovery (one object for the daemon's life)."""
        ...

    @property
    def dev_root(self) -> Path | None:
        """Host directory of the GPU device nodes put into CDI specs; None: the GPUs have none."""
        ...

    @property
    def proc_root(self) -> Path:
        """The procfs the device numbers of the UVM and MIG capability nodes are read from
        (used only with a :attr:`dev_root`)."""
        ...

    @property
    def boot_id_file(self) -> Path:
        """The kernel's boot ID; a change means a reboot (checkpointed claims are dropped)."""
        ...

    def check_node(self) -> None:
        """Log what the node lacks for workloads (never fatal)."""
        ...

    def mig_partitioner(self) -> MigPartitioner:
        """What creates and destroys MIG instances (dynamic MIG)."""
        ...

    def share_tools(self, rest: KubeRest | None) -> ShareTools:
        """The runner, MPS daemon launcher and shm mounter of share enforcement; ``rest``
        reaches the API server where daemons run as pods."""
        ...

    def runs_daemon_pods(self) -> bool:
        """Whether MPS control daemons run as pods of the plugin's namespace (their servers are
        then told apart from tenants' processes by those pods); False where they are simulated
        or MPS is refused, so the plugin never lists pods it has no permission to list."""
        ...

    def health_checker(self) -> HealthChecker:
        """The source of GPU health events and probes."""
        ...

    def usage_source(self, gpus: Sequence[GpuInfo]) -> UsageSource:
        """The source of the GPUs' compute processes."""
        ...

    def usage_problem(self) -> str | None:
        """Why usage attribution will be incomplete here, or None."""
        ...
