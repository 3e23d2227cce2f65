"""Warning Events on the pods of a share: ``ShareOvercommitted`` when the share starts using
more than it reserved, ``MPSEscape`` when one of its pods starts running a compute process
outside MPS (the node plugin names the share's pods that do, see :class:`api.gpu.ShareUsage`),
and ``MPSClientsQueued`` (on the claim and on the pods of its later UIDs) when the client
containers of one MPS share run as more than one known UID (:mod:`controller.mpsclients`).

Two parts, kept apart so the rule can be tested without a server:

- :func:`overcommit_transitions`, :func:`escape_transitions` and :func:`queue_transitions`
  (pure; :func:`transitions` is all three): from the keys of one GPU's shares that were
  overcommitted (or whose pod had escaped, or whose clients ran as several UIDs) and its
  current allocations, the keys now and those that *became* so (were within their
  reservation, or unmeasured, or absent before). A key stays in the set while its state lasts,
  so it yields one transition until it recovers.
- :class:`OvercommitEvents`: creates one core/v1 Event (type Warning, the transition's
  ``reason``, source component :data:`COMPONENT`) per transition and pod (and claim, for a
  queue), at most one per claim, resource and object within :data:`EVENT_WINDOW_S` seconds
  of its clock; later transitions inside the window are counted in
  :attr:`OvercommitEvents.suppressed`, not sent. The window's memory holds at most
  ``max_keys`` entries, each dropped once its window ends.

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

from api.names import OVER_COMPUTE, OVER_MEMORY, RESOURCE_GROUP, RESOURCE_VERSION
from api.quantity import format_bytes_human
from api.shareusage import MeasuredUsage
from controller.mpsclients import QUEUE_RULE, distinct_users
from controller.reconcile import Alloc
from sharegpu.kube.clock import SYSTEM_CLOCK, Clock
from sharegpu.kube.rest import KubeApiError, KubeRest, resource_path

log = logging.getLogger(__name__)

REASON: Final = "ShareOvercommitted"
ESCAPE_REASON: Final = "MPSEscape"
#: The ``resource`` of an escape's key and window entry.
ESCAPE_RESOURCE: Final = "mps-escape"
QUEUE_REASON: Final = "MPSClientsQueued"
#: The ``resource`` of a queue's key and window entry: ``mps-users/<uid>,<uid>...``.
QUEUE_RESOURCE: Final = "mps-users"
#: Most UIDs a message names (a claim reserves at most 256 pods).
MAX_USERS_SHOWN: Final = 8
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


def _uids(users: tuple[int, ...]) -> str:
    shown = ", ".join(str(u) for u in users[:MAX_USERS_SHOWN])
    more = len(users) - MAX_USERS_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True, slots=True)
class MpsQueued:
    """The client containers of claim ``claim_name``'s MPS share on ``gpu`` run as more than one
    known UID (``users``, in ``reservedFor`` order). ``pods`` are the pods that run a container
    as a UID other than the first, as ``(name, uid)``; ``unknown`` counts client containers
    whose UID is unknown (no runAsUser: the image's user)."""

    claim_namespace: str
    claim_name: str
    claim_uid: str
    gpu: str
    users: tuple[int, ...]
    pods: tuple[tuple[str, str], ...]
    unknown: int
    resource: str

    @property
    def reason(self) -> str:
        return QUEUE_REASON

    @property
    def message(self) -> str:
        """The claim's Event, e.g. ``the pods of this claim run MPS clients on GPU
        node-a-gpu-0 as UIDs 1000, 1001: MPS serves one UID at a time ...``."""
        unknown = (
            f" ({self.unknown} client container(s) set no runAsUser: their UID is the image's "
            "user, unknown here)"
            if self.unknown
            else ""
        )
        return (
            f"the pods of this claim run MPS clients on GPU {self.gpu} as UIDs "
            f"{_uids(self.users)}{unknown}. {QUEUE_RULE}"
        )

    def pod_message(self) -> str:
        """A later pod's Event."""
        return (
            f"this pod runs MPS clients of claim {self.claim_namespace}/{self.claim_name} on GPU "
            f"{self.gpu} as a UID other than {self.users[0]}, the first reserving pod's (claim's "
            f"UIDs: {_uids(self.users)}); while clients of {self.users[0]} run, this pod's may "
            f"wait. {QUEUE_RULE}"
        )


#: What the Events are about: an overcommitted share, a pod that escaped MPS, or the clients of
#: one MPS share running as several UIDs.
ShareEvent = Overcommit | MpsEscape | MpsQueued


def _share_key(a: Alloc, resource: str) -> ShareKey:
    claim = a.claim_uid or f"{a.claim_namespace}/{a.claim_name}"
    return (claim, a.request, a.device, a.share_id or "", resource)


def _amounts(a: Alloc, usage: MeasuredUsage, resource: str) -> tuple[str, str]:
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


def queue_transitions(
    before: frozenset[ShareKey], allocations: Iterable[Alloc]
) -> tuple[frozenset[ShareKey], list[MpsQueued]]:
    """The (claim, UIDs) keys of one GPU's MPS shares whose client containers run as more than
    one known UID, and those of them not in ``before`` (a new UID joining makes a new key, so a
    new transition), sorted by claim. Only allocations known to be MPS shares count."""
    by_claim: dict[str, list[Alloc]] = {}
    for a in allocations:
        if a.mps and a.mps_clients:
            by_claim.setdefault(a.claim_uid or f"{a.claim_namespace}/{a.claim_name}", []).append(a)
    now: set[ShareKey] = set()
    found: list[tuple[ShareKey, MpsQueued]] = []
    for claim, allocs in by_claim.items():
        allocs.sort(key=Alloc.sort_key)
        clients = [c for a in allocs for c in a.mps_clients]
        users = distinct_users(clients)
        if len(users) < 2:
            continue
        resource = f"{QUEUE_RESOURCE}/{','.join(str(u) for u in sorted(users))}"
        key = (claim, "", allocs[0].gpu, "", resource)
        now.add(key)
        if key in before:
            continue
        later: dict[tuple[str, str], None] = {}
        for pod, pod_uid, _, user in clients:
            if user is not None and user != users[0]:
                later.setdefault((pod, pod_uid), None)
        first = allocs[0]
        found.append(
            (
                key,
                MpsQueued(
                    claim_namespace=first.claim_namespace,
                    claim_name=first.claim_name,
                    claim_uid=first.claim_uid,
                    gpu=first.gpu,
                    users=users,
                    pods=tuple(later),
                    unknown=sum(1 for c in clients if c[3] is None),
                    resource=resource,
                ),
            )
        )
    found.sort(key=lambda f: (f[1].claim_namespace, f[1].claim_name, f[0]))
    return frozenset(now), [q for _, q in found]


def transitions(
    before: frozenset[ShareKey], allocations: Iterable[Alloc]
) -> tuple[frozenset[ShareKey], list[ShareEvent]]:
    """:func:`overcommit_transitions`, :func:`escape_transitions` and :func:`queue_transitions`
    of one GPU together (their keys never meet: an escape's resource is
    ``mps-escape/<pod uid>``, a queue's ``mps-users/<uids>``)."""
    allocs = list(allocations)
    over_now, over = overcommit_transitions(before, allocs)
    escape_now, escapes = escape_transitions(before, allocs)
    queue_now, queues = queue_transitions(before, allocs)
    return over_now | escape_now | queue_now, [*over, *escapes, *queues]


#: What an Event is about: ``(kind, name, uid, message)``; kind ``Pod`` or ``ResourceClaim``.
Target = tuple[str, str, str, str]
CLAIM_KIND: Final = "ResourceClaim"


def targets(o: ShareEvent) -> list[Target]:
    """The objects ``o``'s Events go to: its pods, and for a queue the claim first."""
    if isinstance(o, MpsQueued):
        return [
            (CLAIM_KIND, o.claim_name, o.claim_uid, o.message),
            *(("Pod", pod, uid, o.pod_message()) for pod, uid in o.pods),
        ]
    return [("Pod", pod, uid, o.message) for pod, uid in o.pods]


def event_body(
    o: ShareEvent, pod: str, pod_uid: str, when: datetime, target: Target | None = None
) -> dict[str, Any]:
    """The core/v1 Event of ``o`` at ``when`` on ``target`` (in the claim's namespace), by
    default on pod ``pod`` with ``o``'s message."""
    kind, name, uid, message = target or ("Pod", pod, pod_uid, o.message)
    ref: dict[str, Any] = {
        "apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}" if kind == CLAIM_KIND else "v1",
        "kind": kind,
        "namespace": o.claim_namespace,
        "name": name,
    }
    if uid:
        ref["uid"] = uid
    stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": o.claim_namespace},
        "involvedObject": ref,
        "type": "Warning",
        "reason": o.reason,
        "message": message,
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
            for target in targets(o):
                kind, name, uid, _ = target
                key = (claim, o.resource, f"{kind}/{uid or name}")
                if key in self._sent:
                    self.suppressed += 1
                    continue
                if self._create(o, target):
                    created += 1
                    self._remember(key, now)
        self.created += created
        return created

    def _create(self, o: ShareEvent, target: Target) -> bool:
        path = resource_path("", "v1", "events", namespace=o.claim_namespace)
        when = datetime.fromtimestamp(time.time(), UTC)
        body = event_body(o, target[1], target[2], when, target)
        try:
            self.kube.request("POST", path, body=body)
        except KubeApiError as exc:
            log.warning(
                "events: %s on %s %s/%s: %s", o.reason, target[0], o.claim_namespace, target[1], exc
            )
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
