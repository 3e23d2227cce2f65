"""The health monitor's timing and policy (:class:`HealthSettings`): plain data, so the
plugin's configuration can hold it without importing the monitor or the kubelet kit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from kubeletplugin.health.events import DEFAULT_IGNORED_XIDS
from kubeletplugin.health.state import (
    DEFAULT_FLAP_WINDOW_S,
    DEFAULT_MAX_RECOVERY_FACTOR,
    DEFAULT_RECOVERY_PROBES,
)
from kubeletplugin.health.taints import DEFAULT_TAINT_EFFECT, TAINT_EFFECTS

DEFAULT_PROBE_INTERVAL_S: Final = 5.0
#: Below kubelet's 30 s staleness timeout, with margin.
DEFAULT_STREAM_REFRESH_S: Final = 20.0


@dataclass(frozen=True)
class HealthSettings:
    """Timing and policy of the monitor (validated on construction)."""

    probe_interval: float = DEFAULT_PROBE_INTERVAL_S
    recovery_probes: int = DEFAULT_RECOVERY_PROBES
    ignored_xids: frozenset[int] = field(default=DEFAULT_IGNORED_XIDS)
    taint_effect: str = DEFAULT_TAINT_EFFECT
    flap_window: float = DEFAULT_FLAP_WINDOW_S
    max_recovery_factor: int = DEFAULT_MAX_RECOVERY_FACTOR
    stream_refresh: float = DEFAULT_STREAM_REFRESH_S

    def __post_init__(self) -> None:
        if self.probe_interval <= 0:
            raise ValueError(f"probe interval must be > 0 seconds, got {self.probe_interval}")
        if self.recovery_probes < 1:
            raise ValueError(f"recovery probes must be >= 1, got {self.recovery_probes}")
        if self.taint_effect not in TAINT_EFFECTS:
            raise ValueError(
                f"taint effect {self.taint_effect!r} is not one of {', '.join(TAINT_EFFECTS)}"
            )
        if self.stream_refresh <= 0:
            raise ValueError(f"stream refresh must be > 0 seconds, got {self.stream_refresh}")
