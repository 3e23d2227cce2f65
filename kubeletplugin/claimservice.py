"""The daemon component that serves kubelet: DeviceState (prepare/unprepare, checkpoint, CDI)
behind the PluginServer (registration and DRA v1/v1beta1 sockets).

``start`` recovers the node state from the checkpoint first (with dynamic MIG: the MIG
instances too, which also decides :meth:`DeviceState.hidden_devices`), then opens the sockets,
so kubelet never reaches a plugin that has not finished recovering. ``stop`` closes the sockets
(kubelet deregisters) and leaves every prepared claim and spec file in place.
"""

from __future__ import annotations

from kubeletplugin.config import PluginConfig
from kubeletplugin.devices.migpartition import MigPartitioner
from kubeletplugin.devices.table import NodeDevices
from kubeletplugin.hosts.host import Host
from kubeletplugin.kubelet.healthservice import HealthSource
from kubeletplugin.kubelet.server import PluginServer
from kubeletplugin.prepare.cdi import CdiSpecWriter, NvidiaCdiDetector, spec_file_prefix
from kubeletplugin.prepare.checkpoint import Checkpoint
from kubeletplugin.prepare.claims import KubeClaimGetter
from kubeletplugin.prepare.state import DeviceState
from kubeletplugin.sharing.enforcement import ShareEnforcer
from sharegpu.kube.connection import KubeClient
from sharegpu.kube.telemetry import Telemetry


def nvidia_cdi_detector(config: PluginConfig) -> NvidiaCdiDetector:
    """Finds the NVIDIA Container Toolkit's CDI spec (``--nvidia-cdi-kind``,
    ``--nvidia-cdi-dirs``), never taking this driver's own claim specs for it."""
    return NvidiaCdiDetector(
        config.nvidia_cdi_kind,
        config.nvidia_cdi_dirs,
        skip_prefixes=(spec_file_prefix(config.driver_name),),
    )


class ClaimService:
    """DeviceState + PluginServer as one start/stop component of the daemon."""

    def __init__(
        self,
        config: PluginConfig,
        host: Host,
        devices: NodeDevices,
        api_client: KubeClient,
        enforcer: ShareEnforcer,
        health_source: HealthSource | None = None,
        telemetry: Telemetry | None = None,
        partitioner: MigPartitioner | None = None,
    ) -> None:
        """``partitioner`` creates the MIG instances of dynamic MIG devices: required when
        ``devices`` has any (``--mig dynamic`` on a MIG-enabled GPU), None otherwise. ``host``
        says where the GPUs' device nodes are and how a reboot is recognised."""
        self.state = DeviceState(
            driver_name=config.driver_name,
            node_name=config.node_name,
            devices=devices,
            claims=KubeClaimGetter(api_client),
            cdi=CdiSpecWriter(
                config.cdi_dir,
                config.driver_name,
                dev_root=host.dev_root,
                proc_root=host.proc_root,
                nvidia=nvidia_cdi_detector(config),
            ),
            checkpoint=Checkpoint(config.plugin_data_dir, boot_id_file=host.boot_id_file),
            enforcer=enforcer,
            telemetry=telemetry,
            partitioner=partitioner,
        )
        self.server = PluginServer(
            config.driver_name,
            config.plugin_registry_dir,
            config.plugin_data_dir,
            self.state,
            health_source=health_source,
        )

    def start(self) -> None:
        self.state.start()
        self.server.start()

    def stop(self) -> None:
        self.server.stop()
        self.state.close()
