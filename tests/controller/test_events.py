"""ShareOvercommitted Events: the transition rule, the rate-limited sender, and the tracker sending
them (only while leading) through the in-process API server."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from api.names import OVER_COMPUTE, OVER_MEMORY
from api.shareusage import MeasuredUsage
from controller.events import (
    COMPONENT,
    ESCAPE_REASON,
    EVENT_WINDOW_S,
    REASON,
    Overcommit,
    OvercommitEvents,
    escape_transitions,
    overcommit_transitions,
    transitions,
)
from controller.reconcile import Alloc
from controller.tracker import Tracker
from sharegpu.kube.clock import FakeClock
from sharegpu.kube.rest import KubeRest, resource_path
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.controller import helpers as h
from tests.helpers import eventually

DEADLINE_S = 30.0  # generous: a loaded 2-core machine
GI = 1024**3
EVENTS = resource_path("", "v1", "events")

# --- the transition rule (pure) ---------------------------------------------------------------


def _alloc(
    over: tuple[str, ...] | None,
    *,
    claim: str = "a",
    used: int = 12 * GI,
    sm: int | None = 80,
    share: str = "s-1",
    pods: tuple[tuple[str, str, tuple[str, ...]], ...] = (("p", "uid-p", ("main",)),),
) -> Alloc:
    usage = (
        None
        if over is None
        else MeasuredUsage(
            used_memory=used, sm_utilization=sm, processes=1, sampled_at=None, overcommitted=over
        )
    )
    return Alloc(
        gpu="node-a-gpu-0",
        claim_namespace="ml",
        claim_name=claim,
        claim_uid=f"uid-{claim}",
        request="gpu",
        device="gpu-0",
        share_id=share,
        cores=30,
        memory=10 * GI,
        pods=pods,
        usage=usage,
    )


def test_unmeasured_or_within_to_over_is_a_transition_staying_over_is_not() -> None:
    state, found = overcommit_transitions(frozenset(), [_alloc(None)])
    assert (state, found) == (frozenset(), [])
    state, found = overcommit_transitions(state, [_alloc(())])
    assert (state, found) == (frozenset(), [])
    state, found = overcommit_transitions(state, [_alloc((OVER_MEMORY,))])
    assert [(o.claim_name, o.resource, o.pods) for o in found] == [
        ("a", OVER_MEMORY, (("p", "uid-p"),))
    ]
    assert (
        found[0].message == "claim ml/a on GPU node-a-gpu-0 uses 12Gi of GPU memory, 10Gi reserved"
    )
    same, again = overcommit_transitions(state, [_alloc((OVER_MEMORY,), used=13 * GI)])
    assert (same, again) == (state, [])
    # compute goes over too: only compute is new
    both, found = overcommit_transitions(state, [_alloc((OVER_MEMORY, OVER_COMPUTE))])
    assert [o.resource for o in found] == [OVER_COMPUTE]
    assert found[0].message == (
        "claim ml/a on GPU node-a-gpu-0 uses 80% of GPU compute, 30 cores reserved"
    )
    # recovering forgets the share: going over again is a new transition
    recovered, found = overcommit_transitions(both, [_alloc(())])
    assert (recovered, found) == (frozenset(), [])
    _, found = overcommit_transitions(recovered, [_alloc((OVER_MEMORY,))])
    assert len(found) == 1


def test_shares_are_told_apart_and_gone_shares_leave_the_state() -> None:
    state, found = overcommit_transitions(
        frozenset(),
        [_alloc((OVER_MEMORY,), claim="b"), _alloc((OVER_MEMORY,), claim="a", share="s-2")],
    )
    assert [o.claim_name for o in found] == ["a", "b"]  # sorted by claim
    _, found = overcommit_transitions(state, [_alloc((OVER_MEMORY,), claim="a", share="s-3")])
    assert [o.claim_name for o in found] == ["a"]  # another share of the same claim
    assert overcommit_transitions(state, []) == (frozenset(), [])
    _, found = overcommit_transitions(frozenset(), [_alloc((OVER_COMPUTE,), sm=None)])
    assert "uses more of GPU compute, 30 cores reserved" in found[0].message


def _escaped(uids: tuple[str, ...], over: tuple[str, ...] = ()) -> Alloc:
    a = _alloc(over, pods=(("p", "uid-p", ("main",)), ("q", "uid-q", ("main",))))
    assert a.usage is not None
    usage = MeasuredUsage(
        a.usage.used_memory, None, 1, None, over, outside_mps=len(uids), escaped_pods=uids
    )
    return replace(a, usage=usage)


def test_an_escaped_pod_is_a_transition_once_and_only_for_pods_the_claim_names() -> None:
    state, found = escape_transitions(frozenset(), [_escaped(("uid-q", "uid-gone"))])
    assert [(e.pods, e.reason) for e in found] == [((("q", "uid-q"),), ESCAPE_REASON)]
    assert found[0].message == (
        "a compute process of this pod runs outside MPS on GPU node-a-gpu-0 and gets the whole "
        "GPU, not claim ml/a's 30 cores and 10Gi"
    )
    assert escape_transitions(state, [_escaped(("uid-q",))])[1] == []  # still escaped
    state, found = escape_transitions(state, [_escaped(("uid-p", "uid-q"))])
    assert [e.pods for e in found] == [(("p", "uid-p"),)]
    state, _ = escape_transitions(state, [_escaped(())])  # back in MPS
    assert state == frozenset()
    assert len(escape_transitions(state, [_escaped(("uid-q",))])[1]) == 1
    # Overcommits and escapes of one GPU followed together, their keys apart.
    both, found = transitions(frozenset(), [_escaped(("uid-q",), (OVER_MEMORY,))])
    assert sorted(type(f).__name__ for f in found) == ["MpsEscape", "Overcommit"]
    assert len(both) == 2 and transitions(both, [_escaped(("uid-q",), (OVER_MEMORY,))])[1] == []


# --- the sender -------------------------------------------------------------------------------


def _overcommit(pods: tuple[tuple[str, str], ...], resource: str = OVER_MEMORY) -> Overcommit:
    return Overcommit("ml", "a", "uid-a", "node-a-gpu-0", resource, "12Gi", "10Gi", pods)


def _events(kube: KubeRest) -> list[dict[str, Any]]:
    items, _ = kube.list_all(EVENTS)
    return sorted(items, key=lambda e: (e["involvedObject"]["name"], e["metadata"]["name"]))


def test_sender_rate_limits_per_claim_resource_and_pod(kube: KubeRest) -> None:
    clock = FakeClock()
    sender = OvercommitEvents(kube, clock=clock)
    assert sender.emit([_overcommit((("p", "uid-p"),))]) == 1
    (event,) = _events(kube)
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "p",
        "uid": "uid-p",
    }
    assert (event["type"], event["reason"], event["source"]) == (
        "Warning",
        REASON,
        {"component": COMPONENT},
    )
    assert event["metadata"]["namespace"] == "ml" and event["count"] == 1
    clock.advance(EVENT_WINDOW_S - 1)
    # same claim, resource and pod: held back; another resource or pod: sent
    both = (("p", "uid-p"), ("q", ""))
    assert sender.emit([_overcommit(both), _overcommit(both, OVER_COMPUTE)]) == 3
    assert sender.suppressed == 1
    q = [e for e in _events(kube) if e["involvedObject"]["name"] == "q"]
    assert len(q) == 2 and "uid" not in q[0]["involvedObject"]
    clock.advance(1)  # the first Event's window ended
    assert sender.emit([_overcommit((("p", "uid-p"),))]) == 1
    assert len(_events(kube)) == 5 and sender.tracked == 4
    clock.advance(EVENT_WINDOW_S)
    assert sender.emit([]) == 0 and sender.tracked == 0  # ended windows are forgotten


def test_sender_state_is_bounded_and_failures_are_not_remembered(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    sender = OvercommitEvents(kube, clock=FakeClock(), max_keys=2)
    assert sender.emit([_overcommit(tuple((f"p{i}", "") for i in range(5)))]) == 5
    assert sender.tracked == 2
    apiserver.inject_fault("create", "events", code=403)
    assert sender.emit([_overcommit((("x", ""),))]) == 0
    assert sender.emit([_overcommit((("x", ""),))]) == 1  # not held back by the failure
    with pytest.raises(ValueError, match="event window"):
        OvercommitEvents(kube, window_s=-1)


# --- the tracker ------------------------------------------------------------------------------


class _Share:
    """One claim on node-a's gpu-0 reserved for two pods; its measured usage is set at will."""

    def __init__(self, kube: KubeRest, name: str = "share") -> None:
        self.kube, self.name = kube, name
        self.cluster = h.Cluster(kube)
        self.cluster.add_slice(h.node_slice("node-a", 2))
        self.pods = [
            (p, self.cluster.add_pod(h.pod(p, name, {"main": None}))) for p in ("p1", "p2")
        ]
        self.result = h.result("node-a", "gpu-0", cores=30, memory="10Gi", share_id="s-1")
        self.cluster.add_claim(name, [self.result], pods=self.pods)

    def measure(self, memory: str, over: bool, escaped: tuple[str, ...] = ()) -> None:
        current = self.kube.get(h.claims_path(name=self.name))
        data: dict[str, Any] = {"kind": "ShareUsage", "usedMemory": memory, "processes": 1}
        if over:
            data["overcommitted"] = ["memory"]
        if escaped:
            data["processesOutsideMPS"] = len(escaped)
            data["escapedPods"] = [uid for name, uid in self.pods if name in escaped]
        current["status"]["devices"] = [
            {
                "driver": h.DRIVER,
                "pool": "node-a",
                "device": "gpu-0",
                "shareID": "s-1",
                "data": data,
            }
        ]
        self.kube.request("PUT", h.claims_path(name=self.name) + "/status", body=current)


def _tracker(kube: KubeRest, clock: FakeClock, **kwargs: Any) -> Tracker:
    """A tracker whose informers run and whose flushes the test drives."""
    tracker = Tracker(kube, h.DRIVER, clock=clock, watch_timeout_s=60, **kwargs)
    for informer in tracker.informers:
        informer.start()
    assert tracker.wait_synced(DEADLINE_S)
    return tracker


def _flush_seen(apiserver: KubeAPIServer, tracker: Tracker, memory: str) -> None:
    """Wait until ``tracker`` holds the usage ``memory``, then run one round."""

    def seen() -> bool:
        (gpu,) = [g for g in tracker.manifests("node-a") if g["spec"]["index"] == 0]
        allocs = gpu["status"]["allocations"]
        return bool(allocs) and allocs[0].get("usage", {}).get("usedMemory") == memory

    eventually(seen, timeout_s=DEADLINE_S)
    tracker.flush()


def _pod_events(kube: KubeRest) -> list[tuple[str, str]]:
    return [(e["involvedObject"]["name"], e["message"]) for e in _events(kube)]


def test_tracker_sends_one_event_per_pod_per_overcommit(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    share = _Share(kube)
    clock = FakeClock()
    tracker = _tracker(kube, clock)
    try:
        tracker.flush()
        share.measure("9Gi", over=False)
        _flush_seen(apiserver, tracker, "9Gi")
        assert _events(kube) == []
        share.measure("12Gi", over=True)
        _flush_seen(apiserver, tracker, "12Gi")
        message = "claim default/share on GPU node-a-gpu-0 uses 12Gi of GPU memory, 10Gi reserved"
        assert _pod_events(kube) == [("p1", message), ("p2", message)]
        uids = {e["involvedObject"]["name"]: e["involvedObject"]["uid"] for e in _events(kube)}
        assert uids == dict(share.pods)
        # stays overcommitted: nothing new
        share.measure("13Gi", over=True)
        _flush_seen(apiserver, tracker, "13Gi")
        assert len(_events(kube)) == 2
        # recovers and goes over again within the window: held back
        share.measure("8Gi", over=False)
        _flush_seen(apiserver, tracker, "8Gi")
        share.measure("14Gi", over=True)
        _flush_seen(apiserver, tracker, "14Gi")
        assert len(_events(kube)) == 2 and tracker.events.suppressed == 2
        # recovers and goes over again after the window: one new Event per pod
        share.measure("8Gi", over=False)
        _flush_seen(apiserver, tracker, "8Gi")
        clock.advance(EVENT_WINDOW_S + 1)
        share.measure("15Gi", over=True)
        _flush_seen(apiserver, tracker, "15Gi")
        later = [m for _, m in _pod_events(kube) if "15Gi" in m]
        assert len(_events(kube)) == 4 and len(later) == 2
    finally:
        tracker.stop()


def test_standby_sends_nothing_and_what_it_followed_is_not_resent(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    share = _Share(kube)
    leads = False
    tracker = _tracker(kube, FakeClock(), is_leader=lambda: leads)
    try:
        tracker.flush()
        share.measure("12Gi", over=True)
        _flush_seen(apiserver, tracker, "12Gi")
        assert _events(kube) == [] and tracker.events.created == 0
        leads = True  # elected while the share stays overcommitted
        share.measure("13Gi", over=True)
        _flush_seen(apiserver, tracker, "13Gi")
        assert _events(kube) == []
        share.measure("8Gi", over=False)
        _flush_seen(apiserver, tracker, "8Gi")
        share.measure("12Gi", over=True)
        _flush_seen(apiserver, tracker, "12Gi")
        assert [p for p, _ in _pod_events(kube)] == ["p1", "p2"]
    finally:
        tracker.stop()


def test_overcommitted_before_the_informers_synced_is_the_baseline(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    share = _Share(kube)
    share.measure("12Gi", over=True)
    tracker = _tracker(kube, FakeClock())
    try:
        _flush_seen(apiserver, tracker, "12Gi")
        tracker.flush()
        assert _events(kube) == []
    finally:
        tracker.stop()


def test_tracker_sends_mps_escape_events_to_the_escaped_pod_only(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    share = _Share(kube)
    tracker = _tracker(kube, FakeClock())
    try:
        tracker.flush()
        share.measure("3Gi", over=False)
        _flush_seen(apiserver, tracker, "3Gi")
        share.measure("4Gi", over=False, escaped=("p2",))
        _flush_seen(apiserver, tracker, "4Gi")
        [event] = _events(kube)
        assert (event["involvedObject"]["name"], event["reason"]) == ("p2", ESCAPE_REASON)
        assert event["type"] == "Warning" and "runs outside MPS" in event["message"]
        [gpu] = [g for g in tracker.gpus("node-a") if g.spec.index == 0]
        [cond] = [c for c in gpu.status.conditions or [] if c.type == "MPSEscaped"]
        assert cond.status == "True" and "default/share (1 pod)" in cond.message
    finally:
        tracker.stop()
