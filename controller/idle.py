"""Idle shares: which measured shares used under a threshold of what they reserved for a period.

A share is *below* its threshold at a measurement when its SM utilisation is under
``threshold_percent`` of its reserved cores and its used memory under ``threshold_percent`` of
its reserved memory (both strictly: exactly at the threshold is not below). It is *idle* once
it has been below for ``period_s`` seconds of the tracker's :class:`~sharegpu.kube.clock.Clock`
without a measurement at or above the threshold in between. Rules:

- unknown is not idle: an allocation without a measurement, one whose GPU does not report
  per-process utilisation (``smUtilization`` absent), and one that reserved nothing (adminAccess)
  is never judged, and leaving the judged state starts the period over;
- the period is counted from when this controller first saw the share below (a restarted or
  newly elected controller starts it over: it reports late, never early);
- nothing is evicted: the verdict is reported on the GPU object (the allocation's ``idle`` and
  the :data:`api.names.CONDITION_SHARES_IDLE` condition), in a metric and by
  ``sharegpu status --idle``.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from api.jsontypes import Obj
from api.names import CONDITION_SHARES_IDLE
from sharegpu.kube.clock import Clock

if TYPE_CHECKING:  # reconcile lays the verdict out, so it imports this module
    from controller.reconcile import Alloc

#: Bounds of the configuration (controller flags and chart values).
MAX_THRESHOLD_PERCENT: Final = 100
MIN_PERIOD_S: Final = 1
MAX_PERIOD_S: Final = 30 * 24 * 3600
DEFAULT_THRESHOLD_PERCENT: Final = 5
DEFAULT_PERIOD_S: Final = 3600

#: One allocation: ``(claim uid or namespace/name, request, device, share ID or "")``.
AllocKey = tuple[str, str, str, str]


def alloc_key(a: Alloc) -> AllocKey:
    """The key of allocation ``a`` (stable while the claim holds it)."""
    return (
        a.claim_uid or f"{a.claim_namespace}/{a.claim_name}",
        a.request,
        a.device,
        a.share_id or "",
    )


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """When a share counts as idle (module text). Raises ValueError naming the flag when out of
    bounds."""

    threshold_percent: int = DEFAULT_THRESHOLD_PERCENT
    period_s: int = DEFAULT_PERIOD_S

    def __post_init__(self) -> None:
        if not 1 <= self.threshold_percent <= MAX_THRESHOLD_PERCENT:
            raise ValueError(
                f"--idle-threshold-percent must be 1 to {MAX_THRESHOLD_PERCENT} "
                f"(0 turns idle reporting off), not {self.threshold_percent}"
            )
        if not MIN_PERIOD_S <= self.period_s <= MAX_PERIOD_S:
            raise ValueError(
                f"--idle-period-seconds must be {MIN_PERIOD_S} to {MAX_PERIOD_S} (30 days), "
                f"not {self.period_s}"
            )

    def below(self, a: Alloc) -> bool | None:
        """Whether ``a``'s measurement is under the threshold of what it reserved; None when it
        cannot be judged (module text)."""
        u = a.usage
        if u is None or u.sm_utilization is None or a.cores <= 0 or a.memory <= 0:
            return None
        t = self.threshold_percent
        return u.sm_utilization * 100 < t * a.cores and u.used_memory * 100 < t * a.memory

    def describe(self) -> str:
        """The rule in words, for conditions and logs."""
        return (
            f"under {self.threshold_percent}% of their reserved cores and memory for "
            f"{_duration(self.period_s)}"
        )


def _duration(seconds: float) -> str:
    s = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size and s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"


@dataclass(frozen=True, slots=True)
class IdleVerdict:
    """The idle state of one GPU's allocations: ``judged`` when some allocation can be judged,
    ``idle`` the keys of those idle, with how long they have been below (seconds); ``rule``
    is :meth:`IdlePolicy.describe`."""

    judged: bool
    idle: Mapping[AllocKey, float]
    rule: str


@dataclass(frozen=True, slots=True)
class IdleShareGauge:
    """One ``sharegpu_share_idle_seconds`` sample: an idle share and a pod that reserves it."""

    namespace: str
    claim: str
    pod: str
    gpu: str
    seconds: float


class IdleShares:
    """Follows how long each allocation has been below the threshold, per GPU. Thread-safe.

    :meth:`observe` is called with a GPU's allocations whenever they change; :meth:`due` names
    the GPUs where a share reached the period since its last :meth:`verdict` (so the tracker
    recomputes them without any input changing).
    """

    def __init__(self, policy: IdlePolicy, clock: Clock) -> None:
        self.policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        #: GPU -> allocation -> clock time it was first seen below.
        self._below: dict[str, dict[AllocKey, float]] = {}
        #: GPU -> allocations its last verdict reported idle.
        self._reported: dict[str, frozenset[AllocKey]] = {}
        #: ``(clock time a share of the GPU reaches the period, GPU)``: a min-heap, so
        #: :meth:`due` looks only at GPUs whose time came (stale entries are re-checked there).
        self._deadlines: list[tuple[float, str]] = []
        #: GPU -> the deadline last queued for it (not queued twice: the heap stays one entry
        #: per GPU and pending deadline however often a GPU is observed).
        self._queued: dict[str, float] = {}

    def observe(self, gpu: str, allocations: Iterable[Alloc]) -> None:
        """Record the GPU's current allocations: a share below keeps the time it was first seen
        below, any other allocation is dropped (its period starts over when it is below
        again)."""
        now = self._clock.monotonic()
        with self._lock:
            old = self._below.get(gpu, {})
            keys = [alloc_key(a) for a in allocations if self.policy.below(a)]
            new = {k: old.get(k, now) for k in keys}
            if new:
                self._below[gpu] = new
            else:
                self._below.pop(gpu, None)
            self._push_next(gpu)

    def _push_next(self, gpu: str) -> None:
        """Queue when the GPU's next unreported share reaches the period (lock held)."""
        reported = self._reported.get(gpu, frozenset())
        pending = [s for k, s in self._below.get(gpu, {}).items() if k not in reported]
        if pending:
            self._queue(min(pending) + self.policy.period_s, gpu)

    def _queue(self, deadline: float, gpu: str) -> None:
        if self._queued.get(gpu) != deadline:
            self._queued[gpu] = deadline
            heapq.heappush(self._deadlines, (deadline, gpu))

    def forget(self, gpu: str) -> None:
        """Drop the GPU (it is gone)."""
        with self._lock:
            self._below.pop(gpu, None)
            self._reported.pop(gpu, None)
            self._queued.pop(gpu, None)

    def verdict(self, gpu: str, allocations: Iterable[Alloc], record: bool = False) -> IdleVerdict:
        """The idle state of the GPU's allocations now; ``record``: this is what its object
        will say (see :meth:`due`)."""
        now = self._clock.monotonic()
        judged = False
        idle: dict[AllocKey, float] = {}
        with self._lock:
            below = self._below.get(gpu, {})
            for a in allocations:
                below_now = self.policy.below(a)
                if below_now is None:
                    continue
                judged = True
                since = below.get(alloc_key(a))
                if below_now and since is not None and now - since >= self.policy.period_s:
                    idle[alloc_key(a)] = now - since
            if record:
                self._reported[gpu] = frozenset(idle)
                self._push_next(gpu)
        return IdleVerdict(judged, idle, self.policy.describe())

    def due(self) -> list[str]:
        """GPUs with a share that reached the period but is not yet reported idle."""
        now = self._clock.monotonic()
        period = self.policy.period_s
        with self._lock:
            came: set[str] = set()
            while self._deadlines and self._deadlines[0][0] <= now:
                deadline, gpu = heapq.heappop(self._deadlines)
                if self._queued.get(gpu) == deadline:
                    del self._queued[gpu]
                came.add(gpu)
            due = sorted(
                gpu
                for gpu in came
                if any(
                    now - since >= period and k not in self._reported.get(gpu, frozenset())
                    for k, since in self._below.get(gpu, {}).items()
                )
            )
            for gpu in due:  # until its verdict is recorded, it stays due
                self._queue(now, gpu)
            return due


def shares_idle_condition(allocations: Iterable[Alloc], verdict: IdleVerdict) -> Obj | None:
    """The :data:`api.names.CONDITION_SHARES_IDLE` condition of a GPU's (sorted) allocations:
    True naming each idle claim and share, False when some allocation was judged and none is
    idle, None when none was judged."""
    if not verdict.judged:
        return None
    idle = [a for a in allocations if alloc_key(a) in verdict.idle]
    if not idle:
        return {
            "type": CONDITION_SHARES_IDLE,
            "status": "False",
            "reason": "SharesInUse",
            "message": f"no measured share was {verdict.rule}",
        }
    names = [f"{a.claim_namespace}/{a.claim_name} ({a.share_id or a.device})" for a in idle]
    return {
        "type": CONDITION_SHARES_IDLE,
        "status": "True",
        "reason": "UsageBelowThreshold",
        "message": f"shares {verdict.rule}: " + "; ".join(names),
    }


def idle_gauges(
    gpu: str, allocations: Iterable[Alloc], verdict: IdleVerdict
) -> list[IdleShareGauge]:
    """The metric samples of the GPU's idle shares: one per reserving pod (pod "" when the
    claim is reserved by none)."""
    out: list[IdleShareGauge] = []
    for a in allocations:
        seconds = verdict.idle.get(alloc_key(a))
        if seconds is None:
            continue
        for pod in [p[0] for p in a.pods] or [""]:
            out.append(IdleShareGauge(a.claim_namespace, a.claim_name, pod, gpu, seconds))
    return out
