"""The tracker against the in-process API server: GPU objects converge on what the pure
reconcile says, through claim, pod and slice changes, restarts and broken watches."""

from __future__ import annotations

from typing import Any

import pytest

from controller.tracker import Tracker
from sharegpu.kube.clock import FakeClock
from sharegpu.kube.rest import KubeRest
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.controller import helpers as h
from tests.helpers import eventually

DEADLINE_S = 30.0  # generous: a loaded 2-core machine; convergence normally takes well under 2 s
NODES = ("node-a", "node-b", "node-c")


@pytest.fixture
def cluster(kube: KubeRest) -> h.Cluster:
    c = h.Cluster(kube)
    for node in NODES:
        c.add_slice(h.node_slice(node, 8))
    return c


def _tracker(kube: KubeRest, **kwargs: Any) -> Tracker:
    t = Tracker(kube, h.DRIVER, **{"watch_timeout_s": 60, "delete_grace_s": 0.0, **kwargs})
    t.start()
    return t


def _converge(apiserver: KubeAPIServer, cluster: h.Cluster, tracker: Tracker) -> None:
    def differing() -> str:
        stored, expected = cluster.stored(), cluster.expected()
        diff = sorted(n for n in set(stored) | set(expected) if stored.get(n) != expected.get(n))
        return f"GPU objects converged (differing: {diff[:5]})"

    eventually(lambda: tracker.idle() and cluster.converged(), differing, timeout_s=DEADLINE_S)


def test_three_nodes_of_eight_gpus(
    apiserver: KubeAPIServer, kube: KubeRest, cluster: h.Cluster
) -> None:
    tracker = _tracker(kube)
    try:
        _converge(apiserver, cluster, tracker)
        stored = cluster.stored()
        assert len(stored) == 24
        assert stored["node-b-gpu-7"]["spec"]["uuid"] == h.gpu_uuid("node-b", 7)
        assert stored["node-b-gpu-7"]["status"]["coresSummary"] == "0/100"
        assert {g.name for g in tracker.gpus("node-c")} == {f"node-c-gpu-{i}" for i in range(8)}
    finally:
        tracker.stop()


def test_claims_allocated_deallocated_deleted_and_pods(
    apiserver: KubeAPIServer, kube: KubeRest, cluster: h.Cluster
) -> None:
    tracker = _tracker(kube)
    try:
        _converge(apiserver, cluster, tracker)
        cluster.add_claim("share-1", [h.result("node-a", "gpu-0", cores=30, memory="10Gi")])
        cluster.add_claim("share-2", [h.result("node-a", "gpu-0", cores=20, memory="4Gi")])
        cluster.add_claim("whole", [h.result("node-b", "gpu-3")], namespace="team")
        cluster.add_claim("pending")
        _converge(apiserver, cluster, tracker)
        gpu = cluster.stored()["node-a-gpu-0"]["status"]
        assert gpu["coresSummary"] == "50/100" and gpu["memorySummary"] == "14Gi/80Gi"
        assert cluster.stored()["node-b-gpu-3"]["status"]["allocatable"]["cores"] == 0

        # a pod appears and the claim is reserved for it: containers show up
        uid = cluster.add_pod(h.pod("trainer", "share-1", {"main": None, "logger": None}))
        cluster.set_status(
            "share-1",
            [h.result("node-a", "gpu-0", cores=30, memory="10Gi", share_id=None)],
            pods=[("trainer", uid)],
        )
        _converge(apiserver, cluster, tracker)
        allocs = cluster.stored()["node-a-gpu-0"]["status"]["allocations"]
        pods = next(a["pods"] for a in allocs if a["claimName"] == "share-1")
        assert pods == [{"name": "trainer", "uid": uid, "containers": ["logger", "main"]}]

        cluster.set_status("share-2", None)  # deallocated
        cluster.delete_claim("whole", namespace="team")  # deleted
        _converge(apiserver, cluster, tracker)
        stored = cluster.stored()
        assert stored["node-a-gpu-0"]["status"]["coresSummary"] == "30/100"
        assert stored["node-b-gpu-3"]["status"]["claimCount"] == 0
    finally:
        tracker.stop()


def test_slice_changes_create_update_and_delete_objects(
    apiserver: KubeAPIServer, kube: KubeRest, cluster: h.Cluster
) -> None:
    tracker = _tracker(kube)
    try:
        _converge(apiserver, cluster, tracker)
        devices = [h.whole_device("node-a", i) for i in range(9)]
        devices[2] = h.whole_device("node-a", 2, unhealthy="Xid79-GpuFellOffTheBus")
        cluster.replace_slice(h.node_slice("node-a", generation=2, devices=devices))
        cluster.delete_slice(h.node_slice("node-c")["metadata"]["name"])
        _converge(apiserver, cluster, tracker)
        stored = cluster.stored()
        assert "node-a-gpu-8" in stored and not any(n.startswith("node-c") for n in stored)
        assert stored["node-a-gpu-2"]["status"]["health"] == "Unhealthy"
        assert stored["node-a-gpu-2"]["status"]["healthReason"] == "Xid79-GpuFellOffTheBus"
    finally:
        tracker.stop()


def test_restart_gives_same_objects_without_writes(
    apiserver: KubeAPIServer, kube: KubeRest, cluster: h.Cluster
) -> None:
    cluster.add_claim("a", [h.result("node-a", "gpu-1", cores=10, memory="1Gi")])
    first = _tracker(kube)
    try:
        _converge(apiserver, cluster, first)
    finally:
        first.stop()
    before = cluster.stored()
    apiserver.reset_counters()
    second = _tracker(kube)
    try:
        assert second.wait_synced(DEADLINE_S)
        eventually(second.idle, timeout_s=DEADLINE_S)
        assert second.flush() == 0
        assert cluster.stored() == before
        assert apiserver.write_count("gpus") == 0
        assert second.writes == 0
    finally:
        second.stop()


def test_resyncs_after_dropped_and_expired_watches(
    apiserver: KubeAPIServer, kube: KubeRest, cluster: h.Cluster
) -> None:
    tracker = _tracker(kube)
    try:
        _converge(apiserver, cluster, tracker)
        relists = sum(i.relists for i in tracker.informers)
        # every watch fails with 410 Gone for a while, and the open ones are cut
        fault = apiserver.inject_fault("watch", code=410, times=8, message="too old")
        apiserver.drop_watches()
        cluster.add_claim("during-outage", [h.result("node-c", "gpu-5", cores=5, memory="1Gi")])
        cluster.delete_slice(h.node_slice("node-b")["metadata"]["name"])
        _converge(apiserver, cluster, tracker)
        assert fault.hits > 0
        assert sum(i.relists for i in tracker.informers) > relists
        assert cluster.stored()["node-c-gpu-5"]["status"]["coresSummary"] == "5/100"
        # a cut connection alone resumes from the last resourceVersion
        apiserver.drop_watches()
        cluster.add_claim("after-drop", [h.result("node-c", "gpu-6", cores=7, memory="1Gi")])
        _converge(apiserver, cluster, tracker)
    finally:
        tracker.stop()


def test_status_writes_are_batched_per_gpu(
    apiserver: KubeAPIServer, kube: KubeRest, cluster: h.Cluster
) -> None:
    """Changes within the write interval (1 s) are merged into one later write."""
    clock = FakeClock()
    tracker = Tracker(kube, h.DRIVER, clock=clock)
    for informer in tracker.informers:  # informers only: this test drives flush() itself
        informer.start()
    try:
        assert tracker.wait_synced(DEADLINE_S)
        assert tracker.flush() > 0  # creates the objects
        cluster.add_claim("x", [h.result("node-a", "gpu-0", cores=1, memory="256Mi")])
        eventually(lambda: bool(tracker.gpus()[0].status.allocations), timeout_s=DEADLINE_S)
        assert tracker.flush() == 0, "a second write within the interval"
        assert not tracker.idle()
        clock.advance(0.9)
        assert tracker.flush() == 0
        clock.advance(0.2)
        assert tracker.flush() == 1
        eventually(lambda: tracker.idle() or (tracker.flush() == 0 and tracker.idle()))
        assert cluster.converged()
    finally:
        tracker.stop()


def test_deletion_waits_for_the_grace_period(
    apiserver: KubeAPIServer, kube: KubeRest, cluster: h.Cluster
) -> None:
    clock = FakeClock()
    tracker = _tracker(kube, delete_grace_s=10.0, clock=clock)
    try:
        _converge(apiserver, cluster, tracker)
        cluster.delete_slice(h.node_slice("node-c")["metadata"]["name"])
        eventually(lambda: len(tracker.gpus()) == 16, timeout_s=DEADLINE_S)
        tracker.flush()
        assert "node-c-gpu-0" in cluster.stored()
        assert not tracker.idle()
        clock.advance(9.9)
        tracker.flush()
        assert "node-c-gpu-0" in cluster.stored()
        clock.advance(0.2)
        _converge(apiserver, cluster, tracker)
        assert "node-c-gpu-0" not in cluster.stored()
    finally:
        tracker.stop()


def test_gpu_objects_carry_the_node_and_driver_labels(
    apiserver: KubeAPIServer, kube: KubeRest, cluster: h.Cluster
) -> None:
    from api.names import GPU_DRIVER_LABEL, GPU_NODE_LABEL

    tracker = _tracker(kube)
    try:
        _converge(apiserver, cluster, tracker)
        items, _ = kube.list_all("/apis/resource.sharegpu.dev/v1alpha1/gpus")
        assert len(items) == 24
        for obj in items:
            name, labels = obj["metadata"]["name"], obj["metadata"]["labels"]
            assert labels[GPU_NODE_LABEL] == obj["spec"]["node"], name
            assert labels[GPU_DRIVER_LABEL] == h.DRIVER
    finally:
        tracker.stop()
    # an object written before the label existed gets it on the next leader's first round
    path = "/apis/resource.sharegpu.dev/v1alpha1/gpus/node-a-gpu-0"
    obj = kube.get(path)
    obj["metadata"]["labels"] = {GPU_DRIVER_LABEL: h.DRIVER}
    kube.request("PUT", path, body=obj)
    tracker = _tracker(kube)
    try:
        eventually(
            lambda: kube.get(path)["metadata"]["labels"].get(GPU_NODE_LABEL) == "node-a",
            timeout_s=DEADLINE_S,
        )
    finally:
        tracker.stop()


def test_informers_keep_compact_records_not_the_json(
    apiserver: KubeAPIServer, kube: KubeRest, cluster: h.Cluster
) -> None:
    """What the tracker holds per object is a record of the fields it reads (memory at scale)."""
    from controller.records import AllocatedClaim, PodInfo, SliceRecord
    from controller.stored import StoredGpu

    cluster.add_claim("a", [h.result("node-a", "gpu-1", cores=10, memory="1Gi")])
    cluster.add_pod(h.pod("p", "a", {"main": None}))
    tracker = _tracker(kube)
    try:
        _converge(apiserver, cluster, tracker)
        kinds = {i.name: {type(v) for v in i.store.values()} for i in tracker.informers if i.store}
        assert kinds == {
            "resourceslices": {SliceRecord},
            "pods": {PodInfo},
            "resourceclaims": {AllocatedClaim},
            "gpus": {StoredGpu},
        }
    finally:
        tracker.stop()


def test_writes_keep_the_metadata_others_set(
    apiserver: KubeAPIServer, kube: KubeRest, cluster: h.Cluster
) -> None:
    """The tracker writes spec and status over the stored metadata: labels and annotations that
    others set stay."""
    path = "/apis/resource.sharegpu.dev/v1alpha1/gpus/node-a-gpu-0"
    tracker = _tracker(kube)
    try:
        _converge(apiserver, cluster, tracker)
        obj = kube.get(path)
        obj["metadata"]["labels"]["team"] = "ml"
        obj["metadata"]["annotations"] = {"owner": "ops"}
        kube.request("PUT", path, body=obj)
        cluster.add_claim("a", [h.result("node-a", "gpu-0", cores=10, memory="1Gi")])
        _converge(apiserver, cluster, tracker)
        meta = kube.get(path)["metadata"]
        assert meta["labels"]["team"] == "ml" and meta["annotations"] == {"owner": "ops"}
    finally:
        tracker.stop()


def test_gauges_and_manifests_match_the_gpu_objects(
    apiserver: KubeAPIServer, kube: KubeRest, cluster: h.Cluster
) -> None:
    from controller.metrics import gpu_gauge

    cluster.add_claim("a", [h.result("node-b", "gpu-2", cores=10, memory="1Gi")])
    cluster.add_claim("b", [h.result("node-b", "gpu-2", cores=5, memory="2Gi")])
    tracker = _tracker(kube)
    try:
        _converge(apiserver, cluster, tracker)
        gpus = tracker.gpus()
        assert tracker.gauges() == [gpu_gauge(g) for g in gpus]
        assert tracker.manifests() == [g.manifest() for g in gpus]
        assert tracker.manifests("node-b") == [g.manifest() for g in tracker.gpus("node-b")]
        busy = next(g for g in tracker.gauges() if g.name == "node-b-gpu-2")
        assert (busy.cores_allocated, busy.memory_allocated, busy.claims) == (15, 3 * 1024**3, 2)
    finally:
        tracker.stop()


@pytest.mark.parametrize("freeze_gc", [True, False])
def test_collector_frozen_after_each_list_unless_disabled(
    apiserver: KubeAPIServer,
    kube: KubeRest,
    cluster: h.Cluster,
    monkeypatch: pytest.MonkeyPatch,
    freeze_gc: bool,
) -> None:
    import gc

    calls: list[int] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append(1))  # never freeze the test process
    tracker = _tracker(kube, freeze_gc=freeze_gc)
    try:
        assert tracker.wait_synced(DEADLINE_S)
        eventually(lambda: len(calls) >= 4 or not freeze_gc, timeout_s=DEADLINE_S)
        assert (len(calls) >= 4) if freeze_gc else calls == []
    finally:
        tracker.stop()


def test_device_taint_rules_show_in_the_gpu_taints(
    apiserver: KubeAPIServer, kube: KubeRest, cluster: h.Cluster
) -> None:
    tracker = _tracker(kube)
    try:
        _converge(apiserver, cluster, tracker)
        assert "taints" not in cluster.stored()["node-a-gpu-1"]["status"]
        cluster.add_rule(h.taint_rule("drain", {"pool": "node-a", "device": "gpu-1"}, value="swap"))
        cluster.add_rule(h.taint_rule("elsewhere", {"driver": "other.example.com"}))
        _converge(apiserver, cluster, tracker)
        stored = cluster.stored()
        assert stored["node-a-gpu-1"]["status"]["taints"] == [
            {
                "device": "gpu-1",
                "key": "example.com/maintenance",
                "value": "swap",
                "effect": "NoSchedule",
                "deviceTaintRule": "drain",
            }
        ]
        assert stored["node-a-gpu-1"]["status"]["health"] == "Healthy"
        assert not any("taints" in g["status"] for n, g in stored.items() if n != "node-a-gpu-1")
        cluster.delete_rule("drain")
        _converge(apiserver, cluster, tracker)
        assert "taints" not in cluster.stored()["node-a-gpu-1"]["status"]
    finally:
        tracker.stop()
