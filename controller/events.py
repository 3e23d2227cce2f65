"""Warning Events on the pods of a share: ``ShareOvercommitted`` when the share starts using
more than it reserved, ``MPSEscape`` when one of its pods starts running a compute process
outside MPS (the node plugin names the share's pods that do, see :class:`api.gpu.ShareUsage`).

Two parts, kept apart so the rule can be tested without a server:

- :func:`overcommit_transitions` and :func:`escape_transitions` (pure; :func:`transitions` is
  both): from the keys of one GPU's shares that were overcommitted (or whose pod had escaped)
  and its current allocations, the keys now and those that *became* so (were within their
  reservation, or unmeasured, or absent before). A key stays in the set while its state lasts,
  so it yields one transition until it recovers.
- :class:`OvercommitEvents`: creates one core/v1 Event (type Warning, the transition's
  ``reason``, source component :data:`COMPONENT`) per transition and pod, at most one per
  claim, resource and pod within :data:`EVENT_WINDOW_S` seconds of its clock; later transitions
  inside the window are counted in :attr:`OvercommitEvents.suppressed`, not sent. The window's
  memory holds at most ``max_keys`` entries, each dropped once its window ends.

The tracker decides *when* (it calls :meth:`OvercommitEvents.emit` only while it leads); a
failed create is logged and not retried (the next transition sends a new one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from api.names import OVER_COMPUTE, OVER_MEMORY
from api.quantity import format_bytes_human
from controller.reconcile import Alloc
from controller.records import UsageRecord
from sharegpu.kube.clock import SYSTEM_CLOCK, Clock
from sharegpu.kube.rest import KubeApiError, KubeRest, resource_path

log = logging.getLogger(__name__)

REASON: Final = "ShareOvercommitted"
ESCAPE_REASON: Final = "MPSEscape"
#: The ``resource`` of an escape's key and window entry.
ESCAPE_RESOURCE: Final = "mps-escape"
COMPONENT: Final = "sharegpu-controller"
#: At most one Event per claim, resource and pod within this many seconds.
EVENT_WINDOW_S: Final = 300.0
#: Most (claim, resource, pod) entries the window remembers (the oldest are dropped first).
MAX_KEYS: Final = 10_000

#: One overcommitted resource of one share: ``(claim uid or namespace/name, request, device,
#: share ID or "", resource)``.
ShareKey = tuple[str, str, str, str, str]


@dataclass(frozen=True, slots=True)
class Overcommit:
    """A share that became overcommitted on ``resource`` (``memory`` or ``compute``).

    ``used`` and ``reserved`` are the texts the message shows; ``pods`` are the reserving pods
    as ``(name, uid)`` (uid "" when the claim's ``reservedFor`` gives none).
    """

    claim_namespace: str
    claim_name: str
    claim_uid: str
    gpu: str
    resource: str
    used: str
    reserved: str
    pods: tuple[tuple[str, str], ...]

    @property
    def reason(self) -> str:
        return REASON

    @property
    def message(self) -> str:
        """The Event's message, e.g. ``claim ns/a on GPU node-a-gpu-0 uses 12Gi of GPU memory,
        10Gi reserved``."""
        what = "GPU memory" if self.resource == OVER_MEMORY else "GPU compute"
        return (
            f"claim {self.claim_namespace}/{self.claim_name} on GPU {self.gpu} uses "
            f"{self.used} of {what}, {self.reserved} reserved"
        )


@dataclass(frozen=True, slots=True)
class MpsEscape:
    """A pod of an MPS share that started running a compute process outside MPS on ``gpu``.

    ``pods`` is that one pod as ``(name, uid)``; ``cores`` and ``memory`` are the share's, as
    shown (what the process is no longer held to).
    """

    claim_namespace: str
    claim_name: str
    claim_uid: str
    gpu: str
    cores: int
    memory: str
    pods: tuple[tuple[str, str], ...]
    resource: str = ESCAPE_RESOURCE

    @property
    def reason(self) -> str:
        return ESCAPE_REASON

    @property
    def message(self) -> str:
        """The Event's message, e.g. ``a process of this pod runs outside MPS on GPU
        node-a-gpu-0 and gets the whole GPU, not claim ns/a's 25 cores and 10Gi``."""
        return (
            f"a compute process of this pod runs outside MPS on GPU {self.gpu} and gets the whole "
            f"GPU, not claim {self.claim_namespace}/{self.claim_name}'s {self.cores} cores and "
            f"{self.memory}"
        )


#: What the Events are about: an overcommitted share or a pod that escaped MPS.
ShareEvent = Overcommit | MpsEscape


def _share_key(a: Alloc, resource: str) -> ShareKey:
    claim = a.claim_uid or f"{a.claim_namespace}/{a.claim_name}"
    return (claim, a.request, a.device, a.share_id or "", resource)


def _amounts(a: Alloc, usage: UsageRecord, resource: str) -> tuple[str, str]:
    """``(used, reserved)`` of ``a`` (measured as ``usage``) on ``resource``, as shown."""
    if resource == OVER_COMPUTE:
        sm = usage.sm_utilization
        return ("more" if sm is None else f"{sm}%"), f"{a.cores} cores"
    return format_bytes_human(usage.used_memory), format_bytes_human(a.memory)


def overcommit_transitions(
    before: frozenset[ShareKey], allocations: Iterable[Alloc]
) -> tuple[frozenset[ShareKey], list[Overcommit]]:
    """The overcommitted shares of one GPU now, and those of them not in ``before``.

    ``before`` is what the previous call returned for the same GPU (empty at first). A share
    that is unmeasured, within its reservation or gone is not in the result, so it transitions
    again when it next goes over. The transitions are sorted by claim, request and resource.
    """
    now: set[ShareKey] = set()
    found: list[tuple[ShareKey, Overcommit]] = []
    for a in allocations:
        usage = a.usage
        if usage is None:
            continue
        for resource in usage.overcommitted:
            key = _share_key(a, resource)
            now.add(key)
            if key in before:
                continue
            used, reserved = _amounts(a, usage, resource)
            found.append(
                (
                    key,
                    Overcommit(
                        claim_namespace=a.claim_namespace,
                        claim_name=a.claim_name,
                        claim_uid=a.claim_uid,
                        gpu=a.gpu,
                        resource=resource,
                        used=used,
                        reserved=reserved,
                        pods=tuple((name, uid) for name, uid, _ in a.pods),
                    ),
                )
            )
    found.sort(key=lambda f: (f[1].claim_namespace, f[1].claim_name, f[0]))
    return frozenset(now), [o for _, o in found]


def escape_transitions(
    before: frozenset[ShareKey], allocations: Iterable[Alloc]
) -> tuple[frozenset[ShareKey], list[MpsEscape]]:
    """The (share, escaped pod) keys of one GPU now, and those of them not in ``before`` (the
    previous call's result for the GPU), sorted by claim and key. A pod the claim's
    ``reservedFor`` does not name (no Event could name it) is left out until it does."""
    now: set[ShareKey] = set()
    found: list[tuple[ShareKey, MpsEscape]] = []
    for a in allocations:
        if a.usage is None:
            continue
        names = {uid: name for name, uid, _ in a.pods if uid}
        for uid in a.usage.escaped_pods:
            if uid not in names:
                continue
            key = _share_key(a, f"{ESCAPE_RESOURCE}/{uid}")
            now.add(key)
            if key in before:
                continue
            escape = MpsEscape(
                claim_namespace=a.claim_namespace,
                claim_name=a.claim_name,
                claim_uid=a.claim_uid,
                gpu=a.gpu,
                cores=a.cores,
                memory=format_bytes_human(a.memory),
                pods=((names[uid], uid),),
            )
            found.append((key, escape))
    found.sort(key=lambda f: (f[1].claim_namespace, f[1].claim_name, f[0]))
    return frozenset(now), [e for _, e in found]


def transitions(
    before: frozenset[ShareKey], allocations: Iterable[Alloc]
) -> tuple[frozenset[ShareKey], list[ShareEvent]]:
    """:func:`overcommit_transitions` and :func:`escape_transitions` of one GPU together (their
    keys never meet: an escape's resource is ``mps-escape/<pod uid>``)."""
    allocs = list(allocations)
    over_now, over = overcommit_transitions(before, allocs)
    escape_now, escapes = escape_transitions(before, allocs)
    return over_now | escape_now, [*over, *escapes]


def event_body(o: ShareEvent, pod: str, pod_uid: str, when: datetime) -> dict[str, Any]:
    """The core/v1 Event of ``o`` on pod ``pod`` (in the claim's namespace) at ``when``."""
    ref: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": o.claim_namespace,
        "name": pod,
    }
    if pod_uid:
        ref["uid"] = pod_uid
    stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{pod}.", "namespace": o.claim_namespace},
        "involvedObject": ref,
        "type": "Warning",
        "reason": o.reason,
        "message": o.message,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
    }


class OvercommitEvents:
    """Creates the Events of :class:`Overcommit` transitions, rate limited (module text).

    Thread-safe only as far as one caller at a time (the tracker's flusher) uses it.
    """

    def __init__(
        self,
        kube: KubeRest,
        *,
        clock: Clock = SYSTEM_CLOCK,
        window_s: float = EVENT_WINDOW_S,
        max_keys: int = MAX_KEYS,
    ) -> None:
        if window_s < 0 or max_keys < 1:
            raise ValueError(
                f"event window must be >= 0 s and keys >= 1, got {window_s} and {max_keys}"
            )
        self.kube = kube
        self._clock = clock
        self.window_s = window_s
        self.max_keys = max_keys
        #: (claim, resource, pod) -> when its last Event was sent, oldest first.
        self._sent: dict[tuple[str, str, str], float] = {}
        self.created = 0
        self.suppressed = 0

    @property
    def tracked(self) -> int:
        """How many (claim, resource, pod) entries the window remembers now."""
        return len(self._sent)

    def emit(self, overcommits: Iterable[ShareEvent]) -> int:
        """Create the Events of ``overcommits`` that the window allows; returns how many."""
        now = self._clock.monotonic()
        self._expire(now)
        created = 0
        for o in overcommits:
            claim = o.claim_uid or f"{o.claim_namespace}/{o.claim_name}"
            for pod, uid in o.pods:
                key = (claim, o.resource, uid or pod)
                if key in self._sent:
                    self.suppressed += 1
                    continue
                if self._create(o, pod, uid):
                    created += 1
                    self._remember(key, now)
        self.created += created
        return created

    def _create(self, o: ShareEvent, pod: str, uid: str) -> bool:
        path = resource_path("", "v1", "events", namespace=o.claim_namespace)
        body = event_body(o, pod, uid, datetime.fromtimestamp(time.time(), UTC))
        try:
            self.kube.request("POST", path, body=body)
        except KubeApiError as exc:
            log.warning("events: %s on pod %s/%s: %s", o.reason, o.claim_namespace, pod, exc)
            return False
        return True

    def _remember(self, key: tuple[str, str, str], now: float) -> None:
        self._sent[key] = now
        while len(self._sent) > self.max_keys:
            del self._sent[next(iter(self._sent))]

    def _expire(self, now: float) -> None:
        """Drop the entries whose window has ended (they are in sending order)."""
        while self._sent:
            key, sent = next(iter(self._sent.items()))
            if now - sent < self.window_s:
                return
            del self._sent[key]
