"""The seam between preparing claims and enforcing GPU shares.

The state module hands a :class:`ShareEnforcer` the claim's device records
(:class:`~kubeletplugin.devicerecord.DeviceRecord`, each with its GPU attached) and gets back, per
device, what enforcement decided (an :class:`~kubeletplugin.devicerecord.Enforcement`, which the
state module stores in the record) and the extra container edits that enforce it (MPS,
time-slicing, interception-library limits). The enforcer owns whatever node-level state
enforcement needs (daemons, compute modes); the state module persists it in the checkpoint
through :meth:`ShareEnforcer.export_state` and hands it back with :meth:`ShareEnforcer.restore`
after a restart, with the recorded devices.

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
from dataclasses import dataclass
from typing import Any, Protocol

from api.gpuconfig import DriverConfigs
from kubeletplugin.containeredits import ContainerEdits
from kubeletplugin.devicerecord import DeviceRecord, Enforcement

#: Per device of a claim, in device order: what enforcement decided (None: not enforced).
Decisions = tuple[Enforcement | None, ...]


class ShareError(Exception):
    """A share that cannot be enforced; the message becomes the claim's per-claim error."""


@dataclass(frozen=True)
class Applied:
    """What :meth:`ShareEnforcer.apply` decided for one claim: ``decisions[i]`` and
    ``device_edits[i]`` belong to ``devices[i]`` (both as long as ``devices``)."""

    decisions: Decisions
    device_edits: tuple[ContainerEdits, ...]


class ShareEnforcer(Protocol):
    """Turns device records into enforced limits. See the module docstring for the call order."""

    def apply(
        self, claim_uid: str, devices: Sequence[DeviceRecord], configs: DriverConfigs
    ) -> Applied:
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
        prepared: Mapping[str, Sequence[DeviceRecord]],
        *,
        node_gpus: Collection[str],
    ) -> dict[str, Applied]:
        """Resume after a restart: ``state`` is the last exported state (None when it was lost:
        first start, reboot, corrupt checkpoint); ``prepared`` maps each prepared claim UID to
        its device records (checked by the checkpoint and the state module), whose recorded
        ``enforcement`` is resumed (a device without one gets the default strategy). Returns,
        per claim of ``prepared``, what ``apply`` returned for it: the decisions and the same
        container edits (the claim's CDI spec is rebuilt from them). ``state`` comes from a
        file: only entries for ``node_gpus`` (the UUIDs of the node's GPUs) are acted on, every
        value is checked against its vocabulary, the rest is logged and ignored."""
        ...


class NoEnforcement:
    """The enforcer for whole GPUs: nothing to add (exclusive GPUs need no limits), no state."""

    def apply(
        self, claim_uid: str, devices: Sequence[DeviceRecord], configs: DriverConfigs
    ) -> Applied:
        return Applied(
            decisions=(None,) * len(devices),
            device_edits=tuple(ContainerEdits() for _ in devices),
        )

    def release(self, claim_uid: str) -> None:
        return None

    def export_state(self) -> dict[str, Any]:
        return {}

    def restore(
        self,
        state: Mapping[str, Any] | None,
        prepared: Mapping[str, Sequence[DeviceRecord]],
        *,
        node_gpus: Collection[str],
    ) -> dict[str, Applied]:
        return {uid: self.apply(uid, devices, DriverConfigs()) for uid, devices in prepared.items()}
