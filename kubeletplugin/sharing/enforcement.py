"""The seam between preparing claims and enforcing GPU shares.

The state module computes one :class:`DeviceShare` per allocated device (share) of a claim and
asks a :class:`ShareEnforcer` for the extra container edits that enforce it (MPS, time-slicing,
interception-library limits). The enforcer owns whatever node-level state enforcement needs
(daemons, compute modes); the state module persists it in the checkpoint through
:meth:`ShareEnforcer.export_state` and hands it back with :meth:`ShareEnforcer.restore` after a
restart.

Call order the state module guarantees, per claim UID (calls for different claims may run
concurrently, from different threads):

- ``apply`` at most once per prepare attempt; a claim whose ``apply`` raised is not retried
  without a ``release`` in between;
- ``release`` after a failed prepare, on unprepare, and when an interrupted prepare is rolled
  back; ``release`` of a claim the enforcer does not know succeeds;
- ``restore`` once, before any other call.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from api.gpuconfig import DriverConfigs
from kubeletplugin.containeredits import ContainerEdits
from kubeletplugin.model import GpuInfo


@dataclass(frozen=True)
class DeviceShare:
    """What one allocated device of a claim is entitled to on its physical GPU.

    Invariants: ``1 <= cores <= 100`` (percent of the GPU's compute) and
    ``0 < memory <= gpu.memory_usable`` (bytes). A whole-GPU allocation has ``cores == 100`` and
    ``memory == gpu.memory_usable``; a consumable-capacity share has ``share_id`` and its
    ``consumedCapacity``; a partition device has ``partition`` (``half``, ...).
    """

    gpu: GpuInfo
    #: Device name in the ResourceSlice.
    device: str
    #: Requests served by this device, as in the allocation results (``req`` or ``req/sub``);
    #: more than one only when several requests of the claim got the same device and share.
    requests: tuple[str, ...]
    cores: int
    memory: int
    share_id: str | None = None
    partition: str | None = None
    admin_access: bool = False

    @property
    def is_share(self) -> bool:
        """True for consumable-capacity shares and partitions (enforcement applies)."""
        return self.share_id is not None or self.partition is not None


class ShareError(Exception):
    """A share that cannot be enforced; the message becomes the claim's per-claim error."""


@dataclass(frozen=True)
class Enforcement:
    """What :meth:`ShareEnforcer.apply` decided for one claim.

    ``device_edits[i]`` are the extra container edits of ``devices[i]``; ``record`` is an opaque,
    JSON-serialisable per-claim record kept in the checkpoint and passed back to ``restore``.
    """

    device_edits: tuple[ContainerEdits, ...]
    record: Mapping[str, Any] = field(default_factory=dict)


class ShareEnforcer(Protocol):
    """Turns device shares into enforced limits. See the module docstring for the call order."""

    def apply(
        self, claim_uid: str, devices: Sequence[DeviceShare], configs: DriverConfigs
    ) -> Enforcement:
        """Enforce ``devices`` for ``claim_uid`` (``configs``: this driver's configs in precedence
        order, DeviceClass first); raise :class:`ShareError` for an unenforceable request."""
        ...

    def release(self, claim_uid: str) -> None:
        """Undo ``apply`` for ``claim_uid``; a no-op for unknown claims."""
        ...

    def export_state(self) -> dict[str, Any]:
        """Node-level enforcement state, JSON-serialisable, for the checkpoint."""
        ...

    def restore(
        self,
        state: Mapping[str, Any] | None,
        prepared: Mapping[str, tuple[Sequence[DeviceShare], Mapping[str, Any]]],
        *,
        node_gpus: Collection[str],
    ) -> None:
        """Resume after a restart: ``state`` is the last exported state (None when it was lost:
        first start, reboot, corrupt checkpoint); ``prepared`` maps each prepared claim UID to
        its device shares and its ``record``. ``state`` and ``record`` come from a file: only
        entries for ``node_gpus`` (the UUIDs of the node's GPUs) and for the claim's own shares
        are acted on, every value is checked against its vocabulary, the rest is logged and
        ignored."""
        ...


class NoEnforcement:
    """The enforcer for whole GPUs: nothing to add (exclusive GPUs need no limits), no state."""

    def apply(
        self, claim_uid: str, devices: Sequence[DeviceShare], configs: DriverConfigs
    ) -> Enforcement:
        return Enforcement(device_edits=tuple(ContainerEdits() for _ in devices))

    def release(self, claim_uid: str) -> None:
        return None

    def export_state(self) -> dict[str, Any]:
        return {}

    def restore(
        self,
        state: Mapping[str, Any] | None,
        prepared: Mapping[str, tuple[Sequence[DeviceShare], Mapping[str, Any]]],
        *,
        node_gpus: Collection[str],
    ) -> None:
        return None
