"""Pure pieces of the real-GPU checks (so they are tested without a GPU): sizing the compute
probe, reading a time-slice interval from ``nvidia-smi compute-policy --list``, waiting with a
deadline, and recording the taint maps the health monitor hands its publisher."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from kubeletplugin.sharing.timeslice import TIMESLICE_VALUES

#: Share of the GPU's compute (``cores`` %) of the two compute-ratio shares, and the accepted
#: range of (run time in the smaller share) / (run time in the larger one): "about 2".
RATIO_SHARES: Final = (25, 50)
RATIO_RANGE: Final = (1.5, 2.7)
#: Wall time the calibrated compute run aims at in the larger share (the smaller one takes
#: about twice as long); the calibration run's loop turns.
TARGET_SECONDS: Final = 2.0
CALIBRATION_ITERATIONS: Final = 200_000
MAX_ITERATIONS: Final = 2**32 - 1

_NAMES_BY_VALUE: Final = {str(v): k for k, v in TIMESLICE_VALUES.items()}
_SPLIT = re.compile(r"[\s|:=]+")


def scaled_iterations(iterations: int, seconds: float, target: float = TARGET_SECONDS) -> int:
    """Loop turns that take about ``target`` seconds when ``iterations`` took ``seconds``
    (at least ``iterations``, at most :data:`MAX_ITERATIONS`); ValueError for a non-positive
    measurement or count."""
    if iterations <= 0 or seconds <= 0 or target <= 0:
        raise ValueError(
            f"cannot scale {iterations} iterations measured at {seconds} s to {target} s"
        )
    return min(MAX_ITERATIONS, max(iterations, round(iterations * target / seconds)))


def ratio_in_range(slow: float, fast: float, bounds: tuple[float, float] = RATIO_RANGE) -> bool:
    """True when ``slow / fast`` lies within ``bounds`` (both ends included)."""
    if fast <= 0:
        return False
    return bounds[0] <= slow / fast <= bounds[1]


def timeslice_from_policy_list(text: str) -> str | None:
    """The interval name (``Default``, ``Short``, ``Medium``, ``Long``) in the output of
    ``nvidia-smi compute-policy --list -i <one GPU>``: the last word of the first line naming
    ``timeslice``, as a name or its ``--set-timeslice`` number; None when no line names it or
    its value is none of those (the output is not a stable interface)."""
    names = {name.lower(): name for name in TIMESLICE_VALUES}
    for line in text.splitlines():
        if "timeslice" not in line.replace("-", "").replace("_", "").replace(" ", "").lower():
            continue
        words = [w for w in _SPLIT.split(line) if w]
        if not words:
            return None
        last = words[-1]
        return _NAMES_BY_VALUE.get(last) or names.get(last.lower())
    return None


def wait_until(
    ready: Callable[[], bool],
    timeout: float,
    interval: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Call ``ready`` until it is true (True) or ``timeout`` seconds passed (False); it is
    called at least once and once more at the deadline."""
    deadline = clock() + timeout
    while True:
        if ready():
            return True
        if clock() >= deadline:
            return False
        sleep(min(interval, max(0.0, deadline - clock())))


class TaintRecorder:
    """A :class:`~kubeletplugin.model.TaintSink` that keeps every map it is handed
    (thread-safe: the monitor calls it from its checker's thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: list[dict[str, list[dict[str, Any]]]] = []

    def set_taints(self, taints: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        copied = {device: [dict(t) for t in ts] for device, ts in taints.items()}
        with self._lock:
            self._maps.append(copied)

    def latest(self, device: str) -> list[dict[str, Any]]:
        """The taints of ``device`` in the latest map ([] when none or no map yet)."""
        with self._lock:
            return list(self._maps[-1].get(device, [])) if self._maps else []
