"""The simulated host (``--device-backend mock``): mock GPUs, simulated ``nvidia-smi``, MPS
daemons simulated in this process or stand-in daemons in pods, MIG instances kept in a file of
the plugin data directory, health and usage read from files. It drives no hardware and needs no
privileges."""

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
from kubeletplugin.hosts import mpsstandin
from kubeletplugin.hosts.fakerunner import FakeRunner
from kubeletplugin.hosts.options import SimulatedOptions, simulated_backend
from kubeletplugin.hosts.simtools import SimulatedLauncher, SimulatedNvidiaTools
from kubeletplugin.model import GpuInfo
from kubeletplugin.runner import MPS_CONTROL
from kubeletplugin.sharing.daemonpods import pod_launcher_from_file
from kubeletplugin.sharing.daemons import DaemonLauncher
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


def standin_daemon_share_tools(launcher: DaemonLauncher) -> ShareTools:
    """Simulated ``nvidia-smi``, MPS control commands sent to the stand-in daemons that
    ``launcher`` runs (:mod:`~kubeletplugin.hosts.mpsstandin`), and plain directories for
    shared memory."""
    runner = SimulatedNvidiaTools().install(FakeRunner())
    runner.on(
        MPS_CONTROL,
        answer=lambda call: mpsstandin.send(
            Path(call.env.get("CUDA_MPS_PIPE_DIRECTORY") or mpsstandin.DEFAULT_PIPE),
            call.stdin or "",
        ),
    )
    return ShareTools(runner, launcher, PlainDirectory())


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
    default mock GPUs are in MIG mode (a ``--mock-config`` file says per GPU).

    With ``mps_daemon_pod_template`` and ``namespace`` the MPS daemons are pods of that namespace
    running the stand-in daemon (:mod:`~kubeletplugin.hosts.mpsstandin`), started, adopted and
    removed through the same :class:`~kubeletplugin.sharing.daemonpods.PodLauncher` as on an
    NVIDIA node, and the usage sampler tells MPS servers apart by those pods; without them the
    daemons are simulated in this process."""

    def __init__(
        self,
        node_name: str,
        options: SimulatedOptions,
        data_dir: Path,
        *,
        mig_enabled: bool = False,
        mps_daemon_pod_template: Path | None = None,
        namespace: str | None = None,
    ) -> None:
        self.node_name = node_name
        self.options = options
        self.data_dir = data_dir
        self.mps_daemon_pod_template = mps_daemon_pod_template
        self.namespace = namespace
        self._backend = simulated_backend(node_name, options, mig_enabled)

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
        return self.mps_daemon_pod_template is not None and bool(self.namespace)

    def share_tools(self, rest: KubeRest | None) -> ShareTools:
        """Stand-in daemon pods (through ``rest``) with a pod template and a namespace, else
        daemons simulated in this process; raises
        :class:`~kubeletplugin.sharing.daemonpods.TemplateError` for an unusable template."""
        template, namespace = self.mps_daemon_pod_template, self.namespace
        if template is None or not namespace or rest is None:
            return simulated_share_tools()
        return standin_daemon_share_tools(
            pod_launcher_from_file(rest, template, namespace=namespace, node_name=self.node_name)
        )

    def health_checker(self) -> HealthChecker:
        """The ``--mock-health-file`` checker; SIGUSR1 re-reads the file."""
        checker = MockHealthChecker(self.options.health_file)
        install_reload_signal(checker)
        return checker

    def usage_source(self, gpus: Sequence[GpuInfo]) -> UsageSource:
        return FileUsageSource(self.options.usage_file, gpus)

    def usage_problem(self) -> str | None:
        return None
