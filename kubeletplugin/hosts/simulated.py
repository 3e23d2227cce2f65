"""The simulated host (``--device-backend mock``): mock GPUs, simulated ``nvidia-smi`` and MPS
daemons, MIG instances kept in a file of the plugin data directory, health and usage read from
files. It drives no hardware and needs no privileges."""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from kubeletplugin.devices.migpartition import MigPartitioner
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.procdevices import DEFAULT_PROC_ROOT
from kubeletplugin.health.mockfile import MockHealthChecker
from kubeletplugin.health.monitor import HealthChecker
from kubeletplugin.hosts.fakerunner import FakeRunner
from kubeletplugin.hosts.options import SimulatedOptions
from kubeletplugin.hosts.simtools import SimulatedLauncher, SimulatedNvidiaTools
from kubeletplugin.model import GpuInfo
from kubeletplugin.sharing.enforcer import ShareTools
from kubeletplugin.sharing.shm import PlainDirectory
from kubeletplugin.usage.mocksource import FileUsageSource
from kubeletplugin.usage.source import UsageSource
from sharegpu.kube.rest import KubeRest

#: The simulated MIG instances, in the plugin data directory (they survive restarts and kill -9
#: like a real GPU's).
MOCK_MIG_STATE_FILE: Final = "mock-mig.json"


def simulated_share_tools() -> ShareTools:
    """A :class:`FakeRunner` over fresh :class:`SimulatedNvidiaTools`, their
    :class:`SimulatedLauncher`, and plain directories for shared memory."""
    sim = SimulatedNvidiaTools()
    return ShareTools(sim.install(FakeRunner()), SimulatedLauncher(sim), PlainDirectory())


def install_reload_signal(checker: MockHealthChecker) -> bool:
    """Make SIGUSR1 re-read the mock health file; True when installed.

    Only the main thread can install signal handlers; elsewhere (tests) nothing happens.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: checker.reload())
    return True


class SimulatedHost:
    """:class:`~kubeletplugin.hosts.host.Host` of simulated GPUs. With ``mig_enabled`` the
    default mock GPUs are in MIG mode (a ``--mock-config`` file says per GPU). The daemons are
    simulated in this process; with ``daemon_pods`` (a daemon pod template and a namespace were
    given) the host stands in for a node whose daemons are pods, so the usage sampler tells MPS
    servers apart by the daemon pods of the namespace, as on an NVIDIA node."""

    def __init__(
        self,
        node_name: str,
        options: SimulatedOptions,
        data_dir: Path,
        *,
        mig_enabled: bool = False,
        daemon_pods: bool = False,
    ) -> None:
        self.node_name = node_name
        self.options = options
        self.data_dir = data_dir
        self._daemon_pods = daemon_pods
        self._backend = MockBackend(
            node_name,
            count=options.gpus,
            config_file=options.config_file,
            mig_enabled=mig_enabled,
        )

    @property
    def backend(self) -> MockBackend:
        return self._backend

    @property
    def dev_root(self) -> None:
        """Simulated GPUs have no device nodes."""
        return None

    @property
    def proc_root(self) -> Path:
        """Unused: simulated GPUs have no device nodes to number."""
        return DEFAULT_PROC_ROOT

    @property
    def boot_id_file(self) -> Path:
        return self.options.boot_id_file

    def check_node(self) -> None:
        """Nothing to check."""

    def mig_partitioner(self) -> MigPartitioner:
        from kubeletplugin.devices.mockmig import MockMigPartitioner

        return MockMigPartitioner(
            self.data_dir / MOCK_MIG_STATE_FILE,
            self.node_name,
            step_seconds=self.options.mig_step_seconds,
        )

    def runs_daemon_pods(self) -> bool:
        return self._daemon_pods

    def share_tools(self, rest: KubeRest | None) -> ShareTools:
        return simulated_share_tools()

    def health_checker(self) -> HealthChecker:
        """The ``--mock-health-file`` checker; SIGUSR1 re-reads the file."""
        checker = MockHealthChecker(self.options.health_file)
        install_reload_signal(checker)
        return checker

    def usage_source(self, gpus: Sequence[GpuInfo]) -> UsageSource:
        return FileUsageSource(self.options.usage_file, gpus)

    def usage_problem(self) -> str | None:
        return None
