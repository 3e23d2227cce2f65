"""The node's preview: this node's GPUs and the ResourceSlices the plugin would publish for them,
before any API server is asked. The public door of the node plugin for ``sharegpu``.

:func:`node_preview` is the one function behind ``sharegpu-kubeletplugin --print-slices`` and
``sharegpu devices`` (and ``sharegpu explain`` without a cluster); both read the GPUs from a
:class:`~kubeletplugin.hosts.host.Host` chosen by the same host flags (:func:`add_host_flags`:
``--device-backend`` and the ``--mock-*`` flags). The other names here are what ``sharegpu``
reads of the plugin's rules; the import contract ``sharegpuctl-front-doors`` keeps the command
to this module and the plugin's other public modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from api import names
from api.jsontypes import Obj
from kubeletplugin.devices.backend import DeviceBackend, DiscoveryError
from kubeletplugin.devices.mock import MAX_MOCK_GPUS, default_gpu
from kubeletplugin.devices.nvml import NvmlBackend
from kubeletplugin.devices.sharelimit import MAX_SHARES_PER_GPU, min_share_cores, mps_client_limit
from kubeletplugin.devices.slices import consumable_device, preview_slices
from kubeletplugin.hosts.options import (
    DEFAULT_MOCK_GPUS,
    HostFlagError,
    SimulatedOptions,
    add_host_flags,
    simulated_backend,
    simulated_options,
)
from kubeletplugin.model import GpuInfo

__all__ = [
    "DEFAULT_MOCK_GPUS",
    "MAX_MOCK_GPUS",
    "MAX_SHARES_PER_GPU",
    "DiscoveryError",
    "GpuSource",
    "HostDiscovery",
    "HostFlagError",
    "NodePreview",
    "SimulatedOptions",
    "SliceSettings",
    "add_host_flags",
    "consumable_memory",
    "node_preview",
    "preview_host",
    "reference_gpus",
    "share_floor_cores",
    "simulated_options",
]


class GpuSource(Protocol):
    """What a preview reads of a host: its GPU discovery. Every
    :class:`~kubeletplugin.hosts.host.Host` is one."""

    @property
    def backend(self) -> DeviceBackend: ...


@dataclass(frozen=True)
class HostDiscovery:
    """A host's GPU discovery without the rest of the host (its tools, health and usage are
    never built, so a preview stays cheap): what :func:`preview_host` gives."""

    backend: DeviceBackend


@dataclass(frozen=True)
class SliceSettings:
    """The plugin's settings that shape its slices besides the GPUs (its flags of these names);
    validated by whoever builds it (the plugin's :func:`~kubeletplugin.config.config_from_args`,
    ``sharegpu``'s node flags)."""

    driver_name: str
    node_name: str
    sharing_mode: str = names.SHARING_MODE_CONSUMABLE
    default_share_cores: int = names.CORES_PER_GPU
    mig_strategy: str = names.MIG_STRATEGY_STATIC
    max_shares_per_gpu: int = 0

    @property
    def dynamic_mig(self) -> bool:
        """``--mig dynamic``: the default simulated GPUs are in MIG mode."""
        return self.mig_strategy == names.MIG_STRATEGY_DYNAMIC


@dataclass(frozen=True)
class NodePreview:
    """What the node would publish: its GPUs (NVML order) and the ResourceSlices for them
    (generation 1, no owner, named by ``metadata.generateName``)."""

    gpus: tuple[GpuInfo, ...]
    slices: tuple[Obj, ...]


def preview_host(settings: SliceSettings, simulated: SimulatedOptions | None) -> HostDiscovery:
    """The discovery of the host the plugin's host flags choose: simulated GPUs with
    ``simulated`` (``--device-backend mock``; the same backend the simulated host builds), else
    this node's NVIDIA GPUs. Raises :class:`DiscoveryError` for an unusable simulated GPU
    count."""
    if simulated is not None:
        return HostDiscovery(
            simulated_backend(settings.node_name, simulated, mig_enabled=settings.dynamic_mig)
        )
    return HostDiscovery(NvmlBackend())


def node_preview(host: GpuSource, settings: SliceSettings) -> NodePreview:
    """Discover ``host``'s GPUs and build the slices a plugin with ``settings`` publishes for
    them. Raises :class:`DiscoveryError`, or ValueError for GPUs the settings cannot publish."""
    gpus = host.backend.discover()
    slices = preview_slices(
        gpus,
        settings.sharing_mode,
        settings.default_share_cores,
        settings.mig_strategy,
        settings.driver_name,
        settings.node_name,
        settings.max_shares_per_gpu,
    )
    return NodePreview(tuple(gpus), tuple(slices))


def reference_gpus(node_name: str, count: int) -> tuple[GpuInfo, ...]:
    """The default simulated GPUs (H100 80GB HBM3), as ``--device-backend mock --mock-gpus
    COUNT`` discovers them on ``node_name``: the GPUs offline checks reason about."""
    return tuple(default_gpu(node_name, index, count) for index in range(count))


def consumable_memory(gpu: GpuInfo) -> Obj:
    """The ``memory`` capacity (value and request policy) the plugin publishes for ``gpu`` in
    consumable mode with its default flags."""
    capacity: Obj = consumable_device(gpu)["capacity"][names.CAP_MEMORY]
    return capacity


def share_floor_cores(gpu: GpuInfo) -> int:
    """The smallest cores request the plugin publishes for ``gpu`` with
    ``--max-shares-per-gpu 0``: one share per MPS client context the GPU serves."""
    return min_share_cores(mps_client_limit(gpu))
