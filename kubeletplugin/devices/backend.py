"""The backend interface that discovers the node's GPUs.

Backends (NVML, mock) return :class:`~kubeletplugin.model.GpuInfo` records in NVML index order.
Everything downstream (the device table, slices, prepare, health) works from these records only.
"""

from __future__ import annotations

from typing import Protocol

from kubeletplugin.model import GpuInfo


class DiscoveryError(RuntimeError):
    """An expected failure to discover GPUs (no NVML library, no GPU, an NVML error).

    The message is one line that names the cause; callers print it and exit non-zero.
    """


class DeviceBackend(Protocol):
    """Discovers the node's GPUs. Implementations: NVML (real GPUs) and mock."""

    #: Backend name as given to ``--device-backend``.
    name: str

    def discover(self) -> list[GpuInfo]:
        """Return the node's GPUs ordered by NVML index; raise :class:`DiscoveryError`."""
        ...
