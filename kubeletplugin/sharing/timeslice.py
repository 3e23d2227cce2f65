"""GPU time-slice intervals (``nvidia-smi compute-policy --set-timeslice``) held by claims.

The first claim using strategy TimeSlicing on a GPU sets the GPU's interval; further claims must
ask for the same interval (a different one is a per-claim error, since the setting is per GPU);
after the last holder leaves the interval is restored to ``Default``. Callers serialise calls for
one GPU (the enforcer holds that GPU's lock).

Settings outlive the plugin through the checkpoint (:meth:`TimeSliceManager.export_state`), which
is written only after a claim's prepare finished. To cover a crash in between, a marker file
``<marker-dir>/<gpu-uuid>`` is written durably before an interval other than ``Default`` is set and
removed once ``Default`` is back: a marked GPU that no claim holds after a restart is restored.
Only the first TimeSlicing holder of a GPU pays for the marker's fsync.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from api.gpuconfig import TimeSliceInterval
from kubeletplugin.fsutil import TEMP_SUFFIX, atomic_write, child_path, fsync_dir, remove_durably
from kubeletplugin.runner import NVIDIA_SMI, Runner

log = logging.getLogger(__name__)

#: ``--set-timeslice`` values by interval name.
TIMESLICE_VALUES: Final[dict[str, int]] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
DEFAULT_INTERVAL: Final = "Default"


class TimeSliceConflict(Exception):
    """A claim asked for an interval other than the one its GPU already runs with."""


@dataclass
class _Setting:
    interval: str
    holders: set[str] = field(default_factory=set)


class TimeSliceManager:
    """Sets and restores the per-GPU time-slice interval on behalf of claims.

    ``marker_dir``: where the markers of changed GPUs live (see the module doc); without it
    nothing records a change that did not reach the checkpoint.
    """

    def __init__(self, runner: Runner, marker_dir: str | Path | None = None) -> None:
        self.runner = runner
        self.marker_dir = None if marker_dir is None else Path(marker_dir)
        self._settings: dict[str, _Setting] = {}
        self._lock = threading.Lock()

    def set_interval(self, uuid: str, interval: str) -> None:
        """Run ``nvidia-smi compute-policy -i <uuid> --set-timeslice=<n>``."""
        self.runner.run(
            NVIDIA_SMI,
            ["compute-policy", "-i", uuid, f"--set-timeslice={TIMESLICE_VALUES[interval]}"],
        )

    def acquire(self, uuid: str, interval: TimeSliceInterval, claim_uid: str) -> None:
        """Make ``claim_uid`` a holder of ``interval`` on ``uuid``; the first holder sets it.

        Raises :class:`TimeSliceConflict` when another claim holds a different interval, and
        CommandError when nvidia-smi fails (nothing is recorded then, but the GPU's marker stays:
        the command may have taken effect), OSError when the marker cannot be written (nothing
        was run then).
        """
        with self._lock:
            current = self._settings.get(uuid)
            others = current.holders - {claim_uid} if current else set()
            if current is not None and others and current.interval != interval:
                raise TimeSliceConflict(
                    f"time-slice interval {interval} conflicts with interval {current.interval} "
                    f"already used on GPU {uuid} by claim(s) {', '.join(sorted(others))}"
                )
            needs_set = current is None or not others
        if needs_set:
            if interval != DEFAULT_INTERVAL:
                self._mark(uuid, interval)
            self.set_interval(uuid, interval)
        with self._lock:
            setting = self._settings.setdefault(uuid, _Setting(interval))
            setting.interval = interval
            setting.holders.add(claim_uid)

    def release(self, uuid: str, claim_uid: str) -> None:
        """Drop ``claim_uid``; after the last holder the interval goes back to Default.
        Raises CommandError if restoring fails (the GPU stays recorded, so it is retried)."""
        with self._lock:
            setting = self._settings.get(uuid)
            if setting is None:
                return
            setting.holders.discard(claim_uid)
            if setting.holders:
                return
        self.set_interval(uuid, DEFAULT_INTERVAL)
        with self._lock:
            if not self._settings[uuid].holders:
                del self._settings[uuid]
                restored = True
            else:
                restored = False
        if restored:
            self._unmark(uuid)

    def holders(self, uuid: str) -> set[str]:
        with self._lock:
            setting = self._settings.get(uuid)
            return set(setting.holders) if setting else set()

    def gpus(self) -> list[str]:
        """GPUs whose interval this manager set and has not restored yet."""
        with self._lock:
            return sorted(self._settings)

    def export_state(self) -> dict[str, Any]:
        """``{uuid: {"interval": name}}`` for every GPU with a non-restored setting."""
        with self._lock:
            return {u: {"interval": s.interval} for u, s in sorted(self._settings.items())}

    @staticmethod
    def intervals(state: Mapping[str, Any] | None) -> dict[str, str]:
        """Intervals read back from :meth:`export_state` output (bad entries skipped)."""
        found: dict[str, str] = {}
        for uuid, entry in (state or {}).items():
            interval = entry.get("interval") if isinstance(entry, Mapping) else None
            if isinstance(uuid, str) and interval in TIMESLICE_VALUES:
                found[uuid] = str(interval)
        return found

    def adopt(self, uuid: str, interval: str) -> None:
        """Record a setting found in the checkpoint with no holders yet (restore)."""
        with self._lock:
            self._settings.setdefault(uuid, _Setting(interval))

    def marked(self) -> list[str]:
        """GPUs whose interval may differ from ``Default`` because this node's plugin set it
        (markers left by :meth:`acquire`, also by a plugin that died before its checkpoint
        recorded the setting)."""
        if self.marker_dir is None:
            return []
        try:
            return sorted(
                p.name
                for p in self.marker_dir.iterdir()
                if not p.name.startswith(".") and not p.name.endswith(TEMP_SUFFIX)
            )
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.error("cannot read the time-slice markers in %s: %s", self.marker_dir, exc)
            return []

    def _mark(self, uuid: str, interval: str) -> None:
        if self.marker_dir is None:
            return
        if not self.marker_dir.is_dir():
            self.marker_dir.mkdir(parents=True, exist_ok=True)
            fsync_dir(self.marker_dir.parent)
        atomic_write(child_path(self.marker_dir, uuid), f"{interval}\n".encode())

    def _unmark(self, uuid: str) -> None:
        """Drop the marker of a GPU back at ``Default``; a marker that stays only makes the next
        start set ``Default`` once more."""
        if self.marker_dir is None:
            return
        try:
            remove_durably(child_path(self.marker_dir, uuid))
        except OSError as exc:
            log.warning("cannot remove the time-slice marker of GPU %s: %s", uuid, exc)
