"""MPSClientsQueued: which allocations are MPS shares, the effective UIDs of their client
containers, the transition rule, and the tracker sending the Events on the claim and the pods
of the later UIDs (deduplicated) through the in-process API server."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from api.names import GROUP_VERSION
from api.shareusage import MeasuredUsage
from controller.events import QUEUE_REASON, queue_transitions, transitions
from controller.mpsclients import Client, client_users, distinct_users, mps_verdict
from controller.reconcile import Alloc
from controller.records import (
    AllocatedClaim,
    PublishedDevice,
    ResultRecord,
    claim_record,
    driver_configs,
    pod_info,
)
from controller.tracker import Tracker
from sharegpu.kube.clock import FakeClock
from sharegpu.kube.rest import KubeRest, resource_path
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.controller import helpers as h

DEADLINE_S = 30.0  # generous: a loaded 2-core machine
GI = 1024**3
EVENTS = resource_path("", "v1", "events")

# --- effective UIDs -----------------------------------------------------------------------------


def _pod(pod_user: Any = None, users: dict[str, Any] | None = None) -> dict[str, Any]:
    obj = h.pod("p", "c", {"a": None, "b": None})
    if pod_user is not None:
        obj["spec"]["securityContext"] = {"runAsUser": pod_user}
    for c in obj["spec"]["containers"]:
        if users and c["name"] in users:
            c["securityContext"] = {"runAsUser": users[c["name"]]}
    return obj


def test_container_run_as_user_wins_over_the_pods_and_none_is_unknown() -> None:
    info = pod_info(_pod(1000, {"b": 1001}))
    assert info.run_as == (("a", 1000), ("b", 1001))  # the sidecar uses no claim
    assert pod_info(_pod(None, {"b": 7})).run_as == (("a", None), ("b", 7))
    assert pod_info(_pod()).run_as_user("a") is None


@pytest.mark.parametrize("bad", [True, -1, 2**31, "1000", 1.5, None])
def test_a_run_as_user_the_api_server_would_refuse_reads_as_unknown(bad: Any) -> None:
    assert pod_info(_pod(None, {"a": bad})).run_as_user("a") is None
    assert pod_info(_pod(bad)).run_as_user("b") is None


# --- which results are MPS shares ---------------------------------------------------------------


def _device(*, memory: int | None = 80 * GI, partition: bool = False, parent: bool = False) -> Any:
    return PublishedDevice(
        name="gpu-0",
        gpu_uuid="GPU-0",
        has_parent=parent,
        index=0,
        model=None,
        partition=partition,
        cores=100,
        memory=memory,
        counter_cores=None,
        counter_memory=None,
        shared=not partition,
        unhealthy_reason=None,
    )


def _claim(config: dict[str, Any] | None, share_id: str | None = "s-1") -> AllocatedClaim:
    r = h.result("node-a", "gpu-0", cores=30, memory="10Gi", share_id=share_id)
    if share_id is None:
        del r["shareID"]
    obj = h.claim("c", [r])
    if config is not None:
        obj["status"]["allocation"]["devices"]["config"] = [
            {
                "source": "FromClaim",
                "opaque": {
                    "driver": h.DRIVER,
                    "parameters": {"apiVersion": GROUP_VERSION, "kind": "GpuConfig", **config},
                },
            }
        ]
    record = claim_record(obj, h.DRIVER)
    assert record is not None
    return record


def _result(config: dict[str, Any] | None = None, **kw: Any) -> ResultRecord:
    return _claim(config, **kw).results[0]


STRATEGY_MPS = {"sharing": {"strategy": "MPS"}}
STRATEGY_TS = {"sharing": {"strategy": "TimeSlicing"}}
NO_STRATEGY: dict[str, Any] = {"sharing": {}}


def test_a_share_without_a_strategy_is_mps_and_a_whole_gpu_share_is_not() -> None:
    assert mps_verdict(_result(), _device(), 30, 10 * GI) is True
    assert mps_verdict(_result(NO_STRATEGY), _device(), 30, 10 * GI) is True
    # every core and the largest grantable memory: configured like a whole GPU (Exclusive)
    assert mps_verdict(_result(), _device(), 100, 80 * GI) is False
    # a partition device never takes the whole GPU
    assert mps_verdict(_result(share_id=None), _device(partition=True), 100, 80 * GI) is True


def test_a_configured_strategy_decides_whatever_the_amounts() -> None:
    assert mps_verdict(_result(STRATEGY_MPS), _device(), 100, 80 * GI) is True
    assert mps_verdict(_result(STRATEGY_TS), _device(), 30, 10 * GI) is False


def test_invalid_configs_mig_devices_and_admin_access_are_never_mps() -> None:
    broken = _result({"sharing": {"strategy": "Mps"}})
    assert broken.mps is None and mps_verdict(broken, _device(), 30, GI) is False
    assert mps_verdict(_result(), _device(parent=True), 30, GI) is False
    admin = replace(_result(STRATEGY_MPS), admin_access=True)
    assert mps_verdict(admin, _device(), 30, GI) is False


def test_unknown_usable_memory_is_unknown_unless_the_node_judged_it_an_mps_share() -> None:
    result = _result()
    assert mps_verdict(result, _device(memory=None), 100, 80 * GI) is None
    judged = MeasuredUsage(
        used_memory=0, sm_utilization=None, processes=0, sampled_at=None, overcommitted=(),
        outside_mps=0,
    )  # fmt: skip
    assert mps_verdict(replace(result, usage=judged), _device(memory=None), 100, GI) is True


def test_clients_are_the_reserving_pods_containers_in_reservation_order() -> None:
    claim = replace(_claim(None), reserved=(("p2", "u2"), ("p1", "u1"), ("gone", "u3")))
    p1 = pod_info({**_named(_pod(1000), "p1", "u1")})
    p2 = pod_info({**_named(_pod(None, {"a": 1001}), "p2", "u2")})
    clients = client_users(claim, "gpu", {"default/p1": p1, "default/p2": p2})
    assert clients == (
        ("p2", "u2", "a", 1001),
        ("p2", "u2", "b", None),
        ("p1", "u1", "a", 1000),
        ("p1", "u1", "b", 1000),
    )
    assert distinct_users(clients) == (1001, 1000)
    stale = replace(claim, reserved=(("p1", "other-uid"),))
    assert client_users(stale, "gpu", {"default/p1": p1}) == ()


def _named(obj: dict[str, Any], name: str, uid: str) -> dict[str, Any]:
    obj["metadata"] = {**obj["metadata"], "name": name, "uid": uid}
    obj["spec"]["resourceClaims"][0]["resourceClaimName"] = "c"
    return obj


# --- the transition rule ------------------------------------------------------------------------


def _alloc(clients: tuple[Client, ...], *, mps: bool | None = True, claim: str = "a") -> Alloc:
    return Alloc(
        gpu="node-a-gpu-0",
        claim_namespace="ml",
        claim_name=claim,
        claim_uid=f"uid-{claim}",
        request="gpu",
        device="gpu-0",
        share_id="s-1",
        cores=30,
        memory=10 * GI,
        pods=(),
        mps_clients=clients,
        mps=mps,
    )


TWO_USERS = (("p1", "u1", "main", 1000), ("p2", "u2", "main", 1001), ("p3", "u3", "main", None))


def test_two_known_uids_are_one_transition_naming_the_later_pods() -> None:
    state, found = queue_transitions(frozenset(), [_alloc(TWO_USERS)])
    [q] = found
    assert (q.reason, q.users, q.pods, q.unknown) == (
        QUEUE_REASON,
        (1000, 1001),
        (("p2", "u2"),),
        1,
    )
    assert "as UIDs 1000, 1001 (1 client container(s) set no runAsUser" in q.message
    assert "MPS serves one UID at a time per claim" in q.message
    assert "one runAsUser" in q.pod_message() and "other than 1000" in q.pod_message()
    # the same state again (a resync): nothing new
    assert queue_transitions(state, [_alloc(TWO_USERS)]) == (state, [])
    # a third UID joins: a new transition
    third = (*TWO_USERS, ("p4", "u4", "main", 1002))
    state2, [q2] = queue_transitions(state, [_alloc(third)])
    assert q2.users == (1000, 1001, 1002) and state2 != state
    # the UIDs converge: the state empties, so diverging again is a transition again
    state3, found3 = queue_transitions(state2, [_alloc(TWO_USERS[:1])])
    assert (state3, found3) == (frozenset(), [])


@pytest.mark.parametrize(
    "alloc",
    [
        _alloc((("p1", "u1", "main", 1000), ("p2", "u2", "main", None))),  # unknown is no UID
        _alloc(TWO_USERS, mps=None),  # not known to be MPS
        _alloc(TWO_USERS, mps=False),
    ],
)
def test_one_known_uid_or_no_mps_share_is_no_transition(alloc: Alloc) -> None:
    assert queue_transitions(frozenset(), [alloc]) == (frozenset(), [])


def test_queue_keys_do_not_meet_the_other_transitions() -> None:
    state, found = transitions(frozenset(), [_alloc(TWO_USERS), _alloc(TWO_USERS, claim="b")])
    assert [q.claim_name for q in found] == ["a", "b"] and len(state) == 2


# --- the tracker --------------------------------------------------------------------------------


def _events(kube: KubeRest) -> list[dict[str, Any]]:
    items, _ = kube.list_all(EVENTS)
    return sorted(items, key=lambda e: e["involvedObject"]["name"])


def _user_pod(name: str, user: int | None, claim: str = "share") -> dict[str, Any]:
    obj = h.pod(name, claim, {"main": None})
    if user is not None:
        obj["spec"]["securityContext"] = {"runAsUser": user}
    return obj


def _tracker(kube: KubeRest) -> Tracker:
    tracker = Tracker(kube, h.DRIVER, clock=FakeClock(), watch_timeout_s=60)
    for informer in tracker.informers:
        informer.start()
    assert tracker.wait_synced(DEADLINE_S)
    return tracker


def _reserved(tracker: Tracker, count: int) -> bool:
    allocs = [a for g in tracker.index.names() for a in tracker.index.allocations(g)]
    return any(len(a.mps_clients) == count for a in allocs)


def _first_client(tracker: Tracker) -> str:
    allocs = [a for g in tracker.index.names() for a in tracker.index.allocations(g)]
    return allocs[0].mps_clients[0][0] if allocs and allocs[0].mps_clients else ""


def test_tracker_warns_the_claim_and_the_later_pod_once(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    cluster = h.Cluster(kube)
    cluster.add_slice(h.node_slice("node-a", 1))
    result = h.result("node-a", "gpu-0", cores=30, memory="10Gi", share_id="s-1")
    pods = [("p1", cluster.add_pod(_user_pod("p1", 1000)))]
    cluster.add_claim("share", [result], pods=pods)
    tracker = _tracker(kube)
    try:
        tracker.flush()
        assert _events(kube) == []
        pods.append(("p2", cluster.add_pod(_user_pod("p2", 1001))))
        pods.append(("p3", cluster.add_pod(_user_pod("p3", None))))
        cluster.set_status("share", [result], pods=pods)
        assert apiserver.wait_for(lambda: _reserved(tracker, 3), DEADLINE_S)
        tracker.flush()
        events = _events(kube)
        assert [(e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in events] == [
            ("Pod", "p2"),
            ("ResourceClaim", "share"),
        ]
        assert {e["reason"] for e in events} == {QUEUE_REASON}
        assert all(e["type"] == "Warning" for e in events)
        claim_ref = events[1]["involvedObject"]
        assert claim_ref["apiVersion"] == "resource.k8s.io/v1" and claim_ref["uid"]
        assert "UIDs 1000, 1001" in events[1]["message"]
        # a status rewrite that changes nothing of it (a resync, a usage write): no new Event
        cluster.set_status("share", [result], pods=list(reversed(pods)))
        assert apiserver.wait_for(lambda: _first_client(tracker) == "p3", DEADLINE_S)
        tracker.flush()
        tracker.flush()
        assert len(_events(kube)) == 2
    finally:
        tracker.stop()


def test_a_restarted_tracker_says_it_once_more_and_time_slicing_claims_never(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    cluster = h.Cluster(kube)
    cluster.add_slice(h.node_slice("node-a", 2))
    for claim, device, config in (("mps", "gpu-0", None), ("ts", "gpu-1", STRATEGY_TS)):
        result = h.result("node-a", device, cores=30, memory="10Gi", share_id=f"s-{claim}")
        pods = [
            (f"{claim}-{u}", cluster.add_pod(_user_pod(f"{claim}-{u}", u, claim)))
            for u in (1000, 1001)
        ]
        cluster.add_claim(claim, [result], pods=pods)
        if config is not None:
            current = kube.get(h.claims_path(name=claim))
            current["status"]["allocation"]["devices"]["config"] = [
                {
                    "source": "FromClaim",
                    "opaque": {
                        "driver": h.DRIVER,
                        "parameters": {"apiVersion": GROUP_VERSION, "kind": "GpuConfig", **config},
                    },
                }
            ]
            kube.request("PUT", h.claims_path(name=claim) + "/status", body=current)
    tracker = _tracker(kube)
    try:
        tracker.flush()
        names = [e["involvedObject"]["name"] for e in _events(kube)]
        assert names == ["mps", "mps-1001"]
    finally:
        tracker.stop()


@pytest.mark.parametrize(
    "allocation",
    [
        {"devices": {"config": "x"}},
        {"devices": {"config": [{"opaque": "x"}, 3]}},
        {"devices": []},
        [],
    ],
)
def test_malformed_configs_read_as_none(allocation: Any) -> None:
    claim = h.claim("c", [h.result("node-a", "gpu-0", cores=30, memory="1Gi")])
    claim["status"]["allocation"] = allocation
    assert driver_configs(claim, h.DRIVER) is None
