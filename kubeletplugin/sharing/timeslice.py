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

Compute mode: time-slicing schedules the contexts of several processes on one GPU, which a GPU
in ``EXCLUSIVE_PROCESS`` (or ``PROHIBITED``) mode does not allow, so the first holder also reads
the GPU's compute mode and, when it is not ``DEFAULT``, sets ``DEFAULT`` and remembers the
previous mode; the last holder's release restores it after the interval. The previous mode is
written into the GPU's marker (line 2) before the mode is changed, so a plugin that dies at any
point leaves a record: :meth:`TimeSliceManager.adopt` reads it back, and the restart's release
of the holder-less GPU restores the mode. A GPU already in ``DEFAULT`` mode is not touched and
its marker has one line, as before.
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
from kubeletplugin.sharing.computemode import (
    DEFAULT_COMPUTE_MODE,
    compute_mode_argument,
    query_compute_mode,
)

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
    #: The compute mode the GPU had before it was set to DEFAULT (``nvidia-smi -c`` spelling);
    #: None when the manager did not change it.
    previous_mode: str | None = None


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

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        """Run ``nvidia-smi -i <uuid> -c <mode>``."""
        self.runner.run(NVIDIA_SMI, ["-i", uuid, "-c", mode])

    def acquire(self, uuid: str, interval: TimeSliceInterval, claim_uid: str) -> None:
        """Make ``claim_uid`` a holder of ``interval`` on ``uuid``; the first holder sets it
        (after setting the compute mode to DEFAULT when it is not, see the module doc).

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
        previous = current.previous_mode if current is not None else None
        if needs_set:
            mode = query_compute_mode(self.runner, uuid)
            if mode != DEFAULT_COMPUTE_MODE:
                previous = previous or mode
            if interval != DEFAULT_INTERVAL or previous is not None:
                self._mark(uuid, interval, previous)
            if mode != DEFAULT_COMPUTE_MODE:
                self.set_compute_mode(uuid, DEFAULT_COMPUTE_MODE)
            self.set_interval(uuid, interval)
        with self._lock:
            setting = self._settings.setdefault(uuid, _Setting(interval))
            setting.interval = interval
            setting.previous_mode = previous
            setting.holders.add(claim_uid)

    def release(self, uuid: str, claim_uid: str) -> None:
        """Drop ``claim_uid``; after the last holder the interval goes back to Default and the
        compute mode to what it was before the first holder. Raises CommandError if restoring
        fails (the GPU stays recorded, so it is retried)."""
        with self._lock:
            setting = self._settings.get(uuid)
            if setting is None:
                return
            setting.holders.discard(claim_uid)
            if setting.holders:
                return
        self.set_interval(uuid, DEFAULT_INTERVAL)
        with self._lock:
            previous = self._settings[uuid].previous_mode
        if previous is not None and previous != DEFAULT_COMPUTE_MODE:
            self.set_compute_mode(uuid, previous)
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
        """``{uuid: {"interval": name}}`` for every GPU with a non-restored setting, plus
        ``"previousComputeMode"`` where the manager changed the compute mode."""
        with self._lock:
            return {
                u: {"interval": s.interval}
                | ({} if s.previous_mode is None else {"previousComputeMode": s.previous_mode})
                for u, s in sorted(self._settings.items())
            }

    @staticmethod
    def intervals(state: Mapping[str, Any] | None) -> dict[str, str]:
        """Intervals read back from :meth:`export_state` output (bad entries skipped)."""
        found: dict[str, str] = {}
        for uuid, entry in (state or {}).items():
            interval = entry.get("interval") if isinstance(entry, Mapping) else None
            if isinstance(uuid, str) and interval in TIMESLICE_VALUES:
                found[uuid] = str(interval)
        return found

    def adopt(self, uuid: str, interval: str, previous_mode: str | None = None) -> None:
        """Record a setting found in the checkpoint or a marker with no holders yet (restore).
        The compute mode to restore is ``previous_mode``, else the one the GPU's marker holds."""
        previous = previous_mode or self._marked_mode(uuid)
        with self._lock:
            setting = self._settings.setdefault(uuid, _Setting(interval))
            setting.previous_mode = setting.previous_mode or previous

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

    def _mark(self, uuid: str, interval: str, previous_mode: str | None) -> None:
        """Durably record ``interval`` and the compute mode to restore (line 2, when any)."""
        if self.marker_dir is None:
            return
        if not self.marker_dir.is_dir():
            self.marker_dir.mkdir(parents=True, exist_ok=True)
            fsync_dir(self.marker_dir.parent)
        text = interval + "\n" + ("" if previous_mode is None else previous_mode + "\n")
        atomic_write(child_path(self.marker_dir, uuid), text.encode())

    def _marked_mode(self, uuid: str) -> str | None:
        """The compute mode recorded in the GPU's marker; None without one (or a bad one)."""
        if self.marker_dir is None:
            return None
        try:
            lines = child_path(self.marker_dir, uuid).read_text().splitlines()
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        if len(lines) < 2:
            return None
        try:
            return compute_mode_argument(lines[1])
        except ValueError:
            log.warning("ignoring the unknown compute mode in the marker of GPU %s", uuid)
            return None

    def _unmark(self, uuid: str) -> None:
        """Drop the marker of a GPU back at ``Default``; a marker that stays only makes the next
        start set ``Default`` once more."""
        if self.marker_dir is None:
            return
        try:
            remove_durably(child_path(self.marker_dir, uuid))
        except OSError as exc:
            log.warning("cannot remove the time-slice marker of GPU %s: %s", uuid, exc)
