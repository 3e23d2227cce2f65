"""The per-GPU health state machine (pure: no threads, no clock of its own).

Rules, for each GPU (keyed by UUID):

- a fault (an event or a failed probe) makes a healthy GPU unhealthy at once, with the fault's
  reason; while unhealthy, further faults keep the first reason and restart the recovery count;
- an unhealthy GPU becomes healthy again after ``required`` consecutive healthy probes;
- a fault that needs a GPU reset (``needs_reset``) is sticky: healthy probes do not count
  towards recovery, however many there are; only :meth:`HealthStateMachine.reset_done` (the GPU
  was seen reset) turns it into an ordinary fault, which then recovers through ``required``
  healthy probes. A later fault that needs a reset makes an unhealthy GPU sticky too;
- flapping is damped: a GPU that fails again within ``flap_window`` seconds of its last recovery
  needs twice as many healthy probes as the previous time (up to ``recovery_probes *
  max_recovery_factor``); a failure after a quiet window starts again from ``recovery_probes``.

Every method that can change a GPU's health returns True exactly when the health or the reason
changed, so callers publish only real changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Final

DEFAULT_RECOVERY_PROBES: Final = 3
DEFAULT_FLAP_WINDOW_S: Final = 300.0
DEFAULT_MAX_RECOVERY_FACTOR: Final = 8


@dataclass(frozen=True)
class GpuHealth:
    """The health of one GPU. ``since`` is when the current health began (Unix seconds)."""

    healthy: bool
    reason: str
    since: float
    #: Consecutive healthy probes while unhealthy.
    healthy_probes: int = 0
    #: Healthy probes needed to recover from the current fault.
    required: int = DEFAULT_RECOVERY_PROBES
    #: When the GPU last recovered (None: never).
    last_recovery: float | None = None
    #: Last time a probe or event confirmed the state (Unix seconds).
    checked: float = 0.0
    #: The fault is cleared only by a GPU reset: healthy probes do not count.
    needs_reset: bool = False


class HealthStateMachine:
    """Health of a set of GPUs; not thread-safe (the monitor serialises calls)."""

    def __init__(
        self,
        recovery_probes: int = DEFAULT_RECOVERY_PROBES,
        flap_window: float = DEFAULT_FLAP_WINDOW_S,
        max_recovery_factor: int = DEFAULT_MAX_RECOVERY_FACTOR,
    ) -> None:
        if recovery_probes < 1:
            raise ValueError(f"recovery_probes must be >= 1, got {recovery_probes}")
        if flap_window < 0:
            raise ValueError(f"flap_window must be >= 0, got {flap_window}")
        if max_recovery_factor < 1:
            raise ValueError(f"max_recovery_factor must be >= 1, got {max_recovery_factor}")
        self.recovery_probes = recovery_probes
        self.flap_window = flap_window
        self.max_required = recovery_probes * max_recovery_factor
        self._gpus: dict[str, GpuHealth] = {}

    def set_gpus(self, uuids: Iterable[str], now: float) -> None:
        """Track exactly ``uuids``: new ones start healthy, missing ones are forgotten."""
        wanted = list(uuids)
        self._gpus = {
            u: self._gpus.get(u)
            or GpuHealth(True, "", now, required=self.recovery_probes, checked=now)
            for u in wanted
        }

    def get(self, uuid: str) -> GpuHealth:
        """The health of ``uuid``; raises KeyError for an unknown GPU."""
        return self._gpus[uuid]

    def snapshot(self) -> dict[str, GpuHealth]:
        """All GPUs' health by UUID (a copy)."""
        return dict(self._gpus)

    def fault(self, uuid: str, reason: str, now: float, *, needs_reset: bool = False) -> bool:
        """Record a fault; returns True when the GPU's health or reason changed (it turned
        unhealthy, or an ordinary fault became one that needs a reset, whose reason then
        replaces the first one). Unknown GPUs are ignored."""
        state = self._gpus.get(uuid)
        if state is None:
            return False
        if not state.healthy:
            if needs_reset and not state.needs_reset:
                self._gpus[uuid] = replace(
                    state, reason=reason, healthy_probes=0, checked=now, needs_reset=True
                )
                return True
            self._gpus[uuid] = replace(state, healthy_probes=0, checked=now)
            return False
        flapping = state.last_recovery is not None and now - state.last_recovery < self.flap_window
        required = min(state.required * 2, self.max_required) if flapping else self.recovery_probes
        self._gpus[uuid] = replace(
            state,
            healthy=False,
            reason=reason,
            since=now,
            healthy_probes=0,
            required=required,
            checked=now,
            needs_reset=needs_reset,
        )
        return True

    def reset_done(self, uuid: str, now: float) -> None:
        """The GPU was seen reset: its sticky fault now recovers through healthy probes."""
        state = self._gpus.get(uuid)
        if state is not None and state.needs_reset:
            self._gpus[uuid] = replace(state, needs_reset=False, healthy_probes=0, checked=now)

    def probe(self, uuid: str, error: str | None, now: float) -> bool:
        """Record a probe result (``error`` None = healthy); True when the health changed."""
        state = self._gpus.get(uuid)
        if state is None:
            return False
        if error is not None:
            return self.fault(uuid, error, now)
        if state.healthy or state.needs_reset:
            self._gpus[uuid] = replace(state, checked=now)
            return False
        streak = state.healthy_probes + 1
        if streak < state.required:
            self._gpus[uuid] = replace(state, healthy_probes=streak, checked=now)
            return False
        self._gpus[uuid] = replace(
            state,
            healthy=True,
            reason="",
            since=now,
            healthy_probes=0,
            last_recovery=now,
            checked=now,
        )
        return True
