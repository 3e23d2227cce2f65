"""Strategy ``MPS``: each claim gets its own MPS control daemon per GPU, with the claim's caps
as the daemon's defaults, and each container attaches to it with its own caps
(:class:`~kubeletplugin.sharing.mps.MpsManager`; docs/sharing.md). A GPU with MPS shares holds
MPS shares only, and a request with MPS shares is on one GPU (a container attaches to one
daemon).

Caps: the share's requested cores and memory, or ``sharing.mps.activeThreadPercentage`` and
``sharing.mps.pinnedMemoryLimit`` at most the request (:func:`mps_caps`).

Checkpoint: no device setting; the node state ``mps`` lists the daemons (informational: a
restart derives the daemons from the prepared claims, and stops every other one it finds)."""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Final

from api.gpuconfig import STRATEGY_MPS, GpuConfig
from kubeletplugin.containeredits import ContainerEdits
from kubeletplugin.devicerecord import DeviceRecord, Enforcement
from kubeletplugin.model import GpuInfo
from kubeletplugin.sharing.enforcement import ShareError
from kubeletplugin.sharing.mps import MPS_ERRORS, MpsLimits, MpsManager
from kubeletplugin.sharing.strategies.base import (
    HeldClaims,
    Release,
    StrategySetup,
    enforced_caps,
    group_caps,
    no_setting,
)

log = logging.getLogger(__name__)


def mps_caps(share: DeviceRecord, config: GpuConfig, label: str) -> tuple[int, int]:
    """(active thread percentage, pinned memory bytes) of ``share``: its request, or the
    ``sharing.mps`` overrides (see the module docstring)."""
    settings = config.sharing.mps if config.sharing else None
    if settings is None:
        return enforced_caps(share, label, config=config)
    return enforced_caps(
        share,
        label,
        config=config,
        cores=("mps.activeThreadPercentage", settings.active_thread_percentage),
        memory=("mps.pinnedMemoryLimit", settings.pinned_memory_limit_bytes()),
    )


class MpsStrategy:
    """See the module docstring."""

    name: Final = STRATEGY_MPS
    shares_gpu_with: Final = frozenset({STRATEGY_MPS})
    mixes_in_claim: Final = False
    on_mig: Final = False

    def plan(
        self, share: DeviceRecord, config: GpuConfig, setup: StrategySetup, label: str
    ) -> Enforcement:
        cores, memory = mps_caps(share, config, label)
        return Enforcement(strategy=self.name, limit_cores=cores, limit_memory=memory)

    def check_claim(self, held: Sequence[DeviceRecord]) -> None:
        """A container attaches to one MPS daemon, which exposes one GPU as CUDA device 0, so a
        request with MPS shares needs all its devices on one GPU (then that GPU is also all its
        ``NVIDIA_VISIBLE_DEVICES`` lists)."""
        gpus_by_request: dict[str, set[str]] = defaultdict(set)
        mps_requests: set[str] = set()
        for d in held:
            for request in d.base_requests:
                gpus_by_request[request].add(d.gpu.uuid)
                if d.enforced.strategy == self.name:
                    mps_requests.add(request)
        for request in sorted(mps_requests):
            gpus = gpus_by_request[request]
            if len(gpus) > 1:
                raise ShareError(
                    f'request "{request}": MPS shares of one request must be on one GPU, with '
                    f"every other device of the request (got {', '.join(sorted(gpus))}); a "
                    "container attaches to one MPS daemon; use one request per GPU or strategy "
                    "Limits"
                )

    def conflict(self, ours: Enforcement, theirs: Enforcement) -> str | None:
        return None

    def setting_from_json(self, value: Any, where: str) -> str | None:
        no_setting(self.name, value, where)
        return None

    def on_node(self, setup: StrategySetup) -> MpsNode:
        """The daemons' host directories live under ``setup.mps_root`` (default
        ``<data_dir>/mps``; keep it short: socket paths hold at most 107 bytes)."""
        root = setup.data_dir / "mps" if setup.mps_root is None else setup.mps_root
        return MpsNode(
            MpsManager(setup.runner, root, setup.launcher, shm=setup.shm, shm_bytes=setup.shm_bytes)
        )


class MpsNode:
    """The node's MPS daemons, one per claim and GPU (see the module docstring)."""

    state_key: str | None = "mps"

    def __init__(self, manager: MpsManager) -> None:
        self.manager = manager

    def needed(self, held: HeldClaims) -> dict[str, tuple[str, str, MpsLimits]]:
        """``{daemon id: (claim, GPU, limits)}`` of the held claims' MPS devices."""
        needed: dict[str, tuple[str, str, MpsLimits]] = {}
        for claim_uid, devices in held.items():
            for uuid, limits in daemon_limits(devices).items():
                needed[self.manager.paths(claim_uid, uuid).id] = (claim_uid, uuid, limits)
        return needed

    def acquire(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        started: list[str] = []
        try:
            for uuid, limits in sorted(daemon_limits(held).items()):
                started.append(self.manager.ensure_running(claim_uid, uuid, limits).paths.id)
        except MPS_ERRORS as exc:
            self._stop_quietly(started)
            raise ShareError(f"cannot enforce the share: {exc}") from None

    def undo(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        self._stop_quietly(
            [self.manager.paths(claim_uid, uuid).id for uuid in sorted(daemon_limits(held))]
        )

    def _stop_quietly(self, daemon_ids: Sequence[str]) -> None:
        for daemon_id in daemon_ids:
            with contextlib.suppress(*MPS_ERRORS):
                self.manager.stop(daemon_id)

    def release(
        self, claim_uid: str, released: Sequence[DeviceRecord], held: HeldClaims
    ) -> Release:
        """Stop the claim's daemons, and any whose earlier stop failed."""
        needed = self.needed(held)
        unneeded = {i: d.uuid for i, d in self.manager.running().items() if i not in needed}

        def settle(held_now: HeldClaims) -> list[str]:
            # A daemon another claim's apply started before the snapshot above has its devices
            # recorded once that apply released its GPU lock: ask again under the lock.
            needed_now = self.needed(held_now)
            problems: list[str] = []
            for daemon_id, uuid in sorted(unneeded.items()):
                if daemon_id in needed_now:
                    continue
                try:
                    self.manager.stop(daemon_id)
                except MPS_ERRORS as exc:
                    problems.append(f"cannot stop the MPS daemon {daemon_id} of GPU {uuid}: {exc}")
            return problems

        return Release(frozenset(unneeded.values()), settle)

    def export_state(self) -> dict[str, Any]:
        return self.manager.export_state()

    def restore(
        self, state: Mapping[str, Any] | None, held: HeldClaims, node_gpus: frozenset[str]
    ) -> None:
        """Adopt or restart the held claims' daemons; stop the daemons no prepared claim needs,
        found through their directories or their launcher (a claim unprepared while the plugin
        was down, or a prepare interrupted before its record)."""
        needed = self.needed(held)
        for claim_uid, uuid, limits in sorted(needed.values()):
            try:
                self.manager.ensure_running(claim_uid, uuid, limits)
            except MPS_ERRORS as exc:
                log.error(
                    "cannot resume the MPS daemon of claim %s on GPU %s: %s", claim_uid, uuid, exc
                )
        for daemon_id in self.manager.leftovers(needed):
            try:
                self.manager.stop(daemon_id)
            except MPS_ERRORS as exc:
                log.error("cannot stop the leftover MPS daemon %s: %s", daemon_id, exc)

    def edits(
        self,
        claim_uid: str,
        device: DeviceRecord,
        caps: tuple[int, int],
        visible: Sequence[GpuInfo],
    ) -> ContainerEdits:
        cores, memory = caps
        return self.manager.container_edits(claim_uid, device.gpu.uuid, cores, memory)


def daemon_limits(held: Sequence[DeviceRecord]) -> dict[str, MpsLimits]:
    """The default limits of one claim's MPS daemon per GPU: the largest caps a container of
    the claim gets there (a container with lower caps sets its own client variables)."""
    daemons: dict[str, MpsLimits] = {}
    for (_, uuid, strategy), (cores, memory) in group_caps(held).items():
        if strategy != STRATEGY_MPS:
            continue
        known = daemons.get(uuid)
        daemons[uuid] = (
            MpsLimits(cores, memory)
            if known is None
            else MpsLimits(max(known.cores, cores), max(known.memory, memory))
        )
    return daemons
