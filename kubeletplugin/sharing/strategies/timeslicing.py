"""Strategy ``TimeSlicing``: the claims on a GPU take turns, at the GPU's time-slice interval
(``sharing.timeSlicing.interval``), which the first holder sets and the last one's release
restores (:class:`~kubeletplugin.sharing.timeslice.TimeSliceManager`). No container limits.

Checkpoint: each device records its interval; the node state ``timeSlicing`` records the
intervals set, and the manager's markers cover a crash before the checkpoint was written."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from api.gpuconfig import STRATEGY_LIMITS, STRATEGY_TIME_SLICING, GpuConfig, TimeSliceInterval
from kubeletplugin.devicerecord import DeviceRecord, Enforcement
from kubeletplugin.runner import CommandError
from kubeletplugin.sharing.enforcement import ShareError
from kubeletplugin.sharing.strategies.base import (
    HeldClaims,
    NoNodeEffects,
    Release,
    SettingsError,
    StrategySetup,
    enforced_caps,
    of_strategy,
    on_node_gpus,
)
from kubeletplugin.sharing.timeslice import (
    DEFAULT_INTERVAL,
    TIMESLICE_VALUES,
    TimeSliceConflict,
    TimeSliceManager,
)

log = logging.getLogger(__name__)


class TimeSlicingStrategy:
    """See the module docstring."""

    name: Final = STRATEGY_TIME_SLICING
    shares_gpu_with: Final = frozenset({STRATEGY_TIME_SLICING, STRATEGY_LIMITS})
    mixes_in_claim: Final = True
    on_mig: Final = False

    def plan(
        self, share: DeviceRecord, config: GpuConfig, setup: StrategySetup, label: str
    ) -> Enforcement:
        cores, memory = enforced_caps(share, label)
        settings = config.sharing.time_slicing if config.sharing else None
        return Enforcement(
            strategy=self.name,
            limit_cores=cores,
            limit_memory=memory,
            interval=settings.interval if settings else DEFAULT_INTERVAL,
        )

    def check_claim(self, held: Sequence[DeviceRecord]) -> None:
        return None

    def conflict(self, ours: Enforcement, theirs: Enforcement) -> str | None:
        """One interval per GPU: another TimeSlicing claim there must use ours."""
        if theirs.strategy == self.name and theirs.interval != ours.interval:
            return f"time-slice interval {ours.interval} conflicts with interval {theirs.interval}"
        return None

    def setting_from_json(self, value: Any, where: str) -> str | None:
        if value not in TIMESLICE_VALUES:
            raise SettingsError(f"{where} is {value!r}; known: {', '.join(TIMESLICE_VALUES)}")
        return str(value)

    def on_node(self, setup: StrategySetup) -> TimeSlicingNode:
        return TimeSlicingNode(TimeSliceManager(setup.runner, setup.data_dir / "timeslice"))


class TimeSlicingNode(NoNodeEffects):
    """The time-slice intervals the node's claims hold (see the module docstring)."""

    state_key: str | None = "timeSlicing"

    def __init__(self, manager: TimeSliceManager) -> None:
        self.manager = manager

    def acquire(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        acquired: list[str] = []
        try:
            for d in held:
                if d.gpu.uuid not in acquired:
                    self.manager.acquire(d.gpu.uuid, _interval(d.enforced), claim_uid)
                    acquired.append(d.gpu.uuid)
        except (CommandError, OSError, TimeSliceConflict) as exc:
            self._release_quietly(claim_uid, acquired)
            raise ShareError(f"cannot enforce the share: {exc}") from None

    def undo(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        self._release_quietly(claim_uid, sorted({d.gpu.uuid for d in held}))

    def _release_quietly(self, claim_uid: str, uuids: Sequence[str]) -> None:
        for uuid in uuids:
            with contextlib.suppress(CommandError):
                self.manager.release(uuid, claim_uid)

    def release(
        self, claim_uid: str, released: Sequence[DeviceRecord], held: HeldClaims
    ) -> Release:
        """Drop the claim's holds; every GPU with an unrestored interval is retried."""
        uuids = frozenset({d.gpu.uuid for d in released} | set(self.manager.gpus()))
        return Release(uuids, lambda _: self._settle(sorted(uuids), claim_uid))

    def _settle(self, uuids: Sequence[str], released_claim: str) -> list[str]:
        """After ``released_claim`` left: drop its interval hold on each GPU, and restore each
        GPU no claim holds."""
        problems: list[str] = []
        for uuid in uuids:
            holders = self.manager.holders(uuid)
            if released_claim in holders or (uuid in self.manager.gpus() and not holders):
                try:
                    self.manager.release(uuid, released_claim)
                except CommandError as exc:
                    problems.append(f"cannot restore the time-slice interval of GPU {uuid}: {exc}")
        return problems

    def export_state(self) -> dict[str, Any]:
        return self.manager.export_state()

    def restore(
        self, state: Mapping[str, Any] | None, held: HeldClaims, node_gpus: frozenset[str]
    ) -> None:
        """Adopt the recorded intervals, hold them again for the held claims, then restore
        every GPU no claim holds (recorded, or only marked by a prepare that died)."""
        for uuid, interval in on_node_gpus(
            TimeSliceManager.intervals(state), node_gpus, "time-slice interval"
        ).items():
            self.manager.adopt(uuid, interval)
        for claim_uid, devices in held.items():
            for d in of_strategy(STRATEGY_TIME_SLICING, devices):
                if d.enforced.interval is None:
                    continue
                try:
                    self.manager.acquire(d.gpu.uuid, _interval(d.enforced), claim_uid)
                except (CommandError, TimeSliceConflict) as exc:
                    log.error("cannot resume time-slicing on GPU %s: %s", d.gpu.uuid, exc)
        for uuid in self.manager.marked():
            if uuid in node_gpus:
                self.manager.adopt(uuid, DEFAULT_INTERVAL)
            else:
                log.warning("ignoring the time-slice marker of %r: this node has no such GPU", uuid)
        for uuid in self.manager.gpus():
            if not self.manager.holders(uuid):
                try:
                    self.manager.release(uuid, "")
                except CommandError as exc:
                    log.error("cannot restore the time-slice interval of GPU %s: %s", uuid, exc)


def _interval(e: Enforcement) -> TimeSliceInterval:
    return cast(TimeSliceInterval, e.interval or DEFAULT_INTERVAL)
