"""Strategy ``Limits``: an interception library preloaded into the container caps its memory
and SM use (:mod:`kubeletplugin.sharing.limits` has the library's contract); it needs the
node's library (``--limits-library``). Each claim gets its own lock directory, a bounded tmpfs
only its containers mount, made before the claim's containers start and removed when it is
unprepared (or, at a restart, when the checkpoint no longer has the claim). Limits shares may
share a GPU with time-slicing.

Caps: the share's requested cores and memory, or ``sharing.limits.smLimit`` and
``sharing.limits.deviceMemoryLimit`` at most the request (:func:`limits_caps`).

Checkpoint: no device setting and no node state (the lock directories are found on disk)."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from api.gpuconfig import STRATEGY_LIMITS, STRATEGY_TIME_SLICING, GpuConfig
from kubeletplugin.containeredits import ContainerEdits
from kubeletplugin.devicerecord import DeviceRecord, Enforcement
from kubeletplugin.fsutil import child_path
from kubeletplugin.model import GpuInfo
from kubeletplugin.sharing.enforcement import ShareError
from kubeletplugin.sharing.limits import limits_edits
from kubeletplugin.sharing.shm import ShmMounter
from kubeletplugin.sharing.strategies.base import (
    NO_RELEASE,
    HeldClaims,
    Release,
    StrategySetup,
    enforced_caps,
    no_setting,
)

log = logging.getLogger(__name__)

#: Bound of a Limits claim's lock directory (a tmpfs; the library keeps a few lock files there).
LIMITS_LOCK_BYTES: Final = 4 * 1024 * 1024


def limits_caps(share: DeviceRecord, config: GpuConfig, label: str) -> tuple[int, int]:
    """(SM percentage, device memory bytes) of ``share``: its request, or the
    ``sharing.limits`` overrides (see the module docstring)."""
    settings = config.sharing.limits if config.sharing else None
    if settings is None:
        return enforced_caps(share, label, config=config)
    return enforced_caps(
        share,
        label,
        config=config,
        cores=("limits.smLimit", settings.sm_limit),
        memory=("limits.deviceMemoryLimit", settings.device_memory_limit_bytes()),
    )


class LimitsStrategy:
    """See the module docstring."""

    name: Final = STRATEGY_LIMITS
    shares_gpu_with: Final = frozenset({STRATEGY_TIME_SLICING, STRATEGY_LIMITS})
    mixes_in_claim: Final = True
    on_mig: Final = False

    def plan(
        self, share: DeviceRecord, config: GpuConfig, setup: StrategySetup, label: str
    ) -> Enforcement:
        cores, memory = limits_caps(share, config, label)
        if not setup.limits_library:
            raise ShareError(
                f"{label}: strategy Limits needs an interception library, and this node's "
                "plugin has none configured (--limits-library)"
            )
        return Enforcement(strategy=self.name, limit_cores=cores, limit_memory=memory)

    def check_claim(self, held: Sequence[DeviceRecord]) -> None:
        return None

    def conflict(self, ours: Enforcement, theirs: Enforcement) -> str | None:
        return None

    def setting_from_json(self, value: Any, where: str) -> str | None:
        no_setting(self.name, value, where)
        return None

    def on_node(self, setup: StrategySetup) -> LimitsNode:
        return LimitsNode(setup.data_dir / "limits" / "vgpulock", setup.shm, setup.limits_library)


class LimitsNode:
    """The claims' lock directories under ``lock_root`` (see the module docstring)."""

    state_key: str | None = None

    def __init__(self, lock_root: Path, shm: ShmMounter, library: str | None) -> None:
        #: Parent of the per-claim lock directories.
        self.lock_root = lock_root
        self.shm = shm
        self.library = library

    def lock_dir(self, claim_uid: str) -> Path:
        """The lock directory of one claim: only that claim's containers mount it."""
        return child_path(self.lock_root, claim_uid)

    def acquire(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        # The parent is the plugin's; the claim's own directory is writable by every user of
        # the claim's containers, like the /tmp the library expects it to be, and a tmpfs of
        # at most LIMITS_LOCK_BYTES: a tenant cannot fill the kubelet's file system through it.
        try:
            self.lock_root.mkdir(parents=True, exist_ok=True)
            self.lock_root.chmod(0o755)
            directory = self.lock_dir(claim_uid)
            directory.mkdir(exist_ok=True)
            directory.chmod(0o1777)
            self.shm.mount(directory, LIMITS_LOCK_BYTES)
        except OSError as exc:
            raise ShareError(f"cannot make the Limits lock directory: {exc}") from None

    def undo(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        self._remove_lock_dir(claim_uid)

    def release(
        self, claim_uid: str, released: Sequence[DeviceRecord], held: HeldClaims
    ) -> Release:
        if not released:
            return NO_RELEASE

        def settle(held_now: HeldClaims) -> list[str]:
            self._remove_lock_dir(claim_uid)
            return []

        return Release(frozenset(), settle)

    def _remove_lock_dir(self, claim_uid: str) -> None:
        try:
            self.shm.unmount(self.lock_dir(claim_uid))
            shutil.rmtree(self.lock_dir(claim_uid))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("cannot remove the Limits lock directory of claim %s: %s", claim_uid, exc)

    def export_state(self) -> dict[str, Any]:
        return {}

    def restore(
        self, state: Mapping[str, Any] | None, held: HeldClaims, node_gpus: frozenset[str]
    ) -> None:
        """Remove the lock directories of claims that are not prepared any more (the
        checkpoint decides)."""
        for leftover in self._lock_dir_claims() - set(held):
            self._remove_lock_dir(leftover)

    def _lock_dir_claims(self) -> set[str]:
        """Claim UIDs with a lock directory (plain directories only)."""
        try:
            return {p.name for p in self.lock_root.iterdir() if p.is_dir() and not p.is_symlink()}
        except OSError:
            return set()

    def edits(
        self,
        claim_uid: str,
        device: DeviceRecord,
        caps: tuple[int, int],
        visible: Sequence[GpuInfo],
    ) -> ContainerEdits:
        """A Limits ordinal is the GPU's CUDA ordinal among the GPUs the container sees with
        the device (``visible``: the order of its ``NVIDIA_VISIBLE_DEVICES``, by PCI bus ID as
        ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` numbers them)."""
        if not self.library:
            return ContainerEdits()
        cores, memory = caps
        return limits_edits(
            self.library,
            str(self.lock_dir(claim_uid)),
            [g.uuid for g in visible].index(device.gpu.uuid),
            memory,
            cores,
        )
