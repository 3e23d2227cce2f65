"""The pure reconcile function: slices, claims and pods in, desired GPU objects out."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from api.crd import CRD_PATH, render
from api.gpu import GpuObject
from api.names import gpu_object_name
from api.quantity import quantity_int
from controller.reconcile import reconcile
from tests.controller import helpers as h


def _one(objs: dict[str, GpuObject], node: str, index: int) -> GpuObject:
    return objs[gpu_object_name(node, index)]


def test_one_object_per_gpu_with_hardware_spec() -> None:
    objs = reconcile([h.node_slice("n1", 3), h.node_slice("n2", 2)], [], [], h.DRIVER)
    assert sorted(objs) == ["n1-gpu-0", "n1-gpu-1", "n1-gpu-2", "n2-gpu-0", "n2-gpu-1"]
    g = _one(objs, "n2", 1)
    assert g.spec.node == "n2" and g.spec.index == 1
    assert g.spec.uuid == h.gpu_uuid("n2", 1)
    assert g.spec.model == h.MODEL
    assert g.spec.memory == "80Gi" and g.spec.cores == 100
    assert g.spec.sharing_mode == "consumable"
    assert g.status.health == "Healthy"
    assert g.status.allocated.cores == 0 and g.status.allocatable.memory == "80Gi"
    assert g.status.cores_summary == "0/100" and g.status.memory_summary == "0/80Gi"


def test_consumable_shares_sum_on_one_gpu() -> None:
    claims = [
        h.claim("a", [h.result("n1", "gpu-0", cores=30, memory="10Gi")]),
        h.claim("b", [h.result("n1", "gpu-0", cores=20, memory="20Gi")]),
    ]
    g = _one(reconcile([h.node_slice("n1", 2)], claims, [], h.DRIVER), "n1", 0)
    assert g.status.allocated.cores == 50
    assert g.status.allocated.memory == "30Gi"
    assert g.status.allocatable.cores == 50 and g.status.allocatable.memory == "50Gi"
    assert [a.claim_name for a in g.status.allocations] == ["a", "b"]
    assert all(a.share_id for a in g.status.allocations)
    assert g.status.claim_count == 2
    assert g.status.cores_summary == "50/100" and g.status.memory_summary == "30Gi/80Gi"


def test_whole_gpu_without_consumed_capacity_takes_everything() -> None:
    s = h.node_slice("n1", devices=[h.whole_device("n1", 0, shared=False)])
    g = _one(reconcile([s], [h.claim("a", [h.result("n1", "gpu-0")])], [], h.DRIVER), "n1", 0)
    assert g.spec.sharing_mode == "exclusive"
    assert g.status.allocated.cores == 100 and g.status.allocated.memory == "80Gi"
    assert g.status.allocatable.cores == 0 and g.status.allocatable.memory == "0"


def test_partition_devices_map_to_parent_gpu() -> None:
    devices = [h.whole_device("n1", 0, shared=False), *h.half_devices("n1", 0)]
    s = h.node_slice("n1", devices=devices)
    claims = [h.claim("a", [h.result("n1", "gpu-0-half-1")])]
    objs = reconcile([s], claims, [], h.DRIVER)
    assert list(objs) == ["n1-gpu-0"]
    g = objs["n1-gpu-0"]
    assert g.spec.sharing_mode == "partitions"
    assert g.spec.devices == ["gpu-0", "gpu-0-half-0", "gpu-0-half-1"]
    assert g.status.allocated.cores == 50 and g.status.allocated.memory == "40Gi"
    assert g.status.allocations[0].device == "gpu-0-half-1"


def test_unhealthy_taint_sets_health_and_reason() -> None:
    s = h.node_slice("n1", devices=[h.whole_device("n1", 0, unhealthy="Xid79")])
    g = _one(reconcile([s], [], [], h.DRIVER), "n1", 0)
    assert g.status.health == "Unhealthy" and g.status.health_reason == "Xid79"


def test_pods_and_containers_from_reserved_for() -> None:
    c = h.claim(
        "a",
        [h.result("n1", "gpu-0", cores=10, memory="1Gi")],
        pods=[("p1", "uid-p1"), ("p2", "uid-p2")],
    )
    pods = [
        h.pod("p1", "a", {"main": None, "helper": "gpu"}, uid="uid-p1"),
        h.pod("p2", "a", {"other": "different-request"}, uid="uid-p2"),
    ]
    g = _one(reconcile([h.node_slice("n1", 1)], [c], pods, h.DRIVER), "n1", 0)
    refs = g.status.allocations[0].pods
    assert [(p.name, p.containers) for p in refs] == [("p1", ["helper", "main"]), ("p2", [])]


def test_pod_resolves_template_claim_through_status() -> None:
    c = h.claim("p1-gpu-x7", [h.result("n1", "gpu-0", cores=10, memory="1Gi")], pods=[("p1", "u")])
    p = h.pod("p1", "unused", {"main": None}, uid="u")
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "tmpl"}]
    p["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p1-gpu-x7"}]}
    g = _one(reconcile([h.node_slice("n1", 1)], [c], [p], h.DRIVER), "n1", 0)
    assert g.status.allocations[0].pods[0].containers == ["main"]


def test_other_drivers_old_generations_and_unknown_devices_ignored() -> None:
    slices = [
        h.node_slice("n1", 2, generation=2),
        {**h.node_slice("n1", 4, generation=1), "metadata": {"name": "old"}},
        h.node_slice("n9", 1, driver="other.example.com"),
    ]
    claims = [
        h.claim("x", [h.result("n1", "gpu-0", driver="other.example.com")]),
        h.claim("y", [h.result("n1", "gpu-7")]),
        h.claim("z"),
    ]
    objs = reconcile(slices, claims, [], h.DRIVER)
    assert sorted(objs) == ["n1-gpu-0", "n1-gpu-1"]
    assert all(not o.status.allocations for o in objs.values())


def test_admin_access_listed_but_not_counted() -> None:
    r = h.result("n1", "gpu-0")
    r["adminAccess"] = True
    g = _one(reconcile([h.node_slice("n1", 1)], [h.claim("a", [r])], [], h.DRIVER), "n1", 0)
    assert len(g.status.allocations) == 1 and g.status.allocated.cores == 0


def test_order_independent_and_consistent_sums() -> None:
    rng = random.Random(7)
    slices = [h.node_slice(f"n{i}", 4) for i in range(3)]
    claims = []
    for i in range(40):
        node, dev = f"n{rng.randrange(3)}", f"gpu-{rng.randrange(4)}"
        claims.append(
            h.claim(f"c{i}", [h.result(node, dev, cores=rng.randint(1, 5), memory="256Mi")])
        )
    first = reconcile(slices, claims, [], h.DRIVER)
    rng.shuffle(slices)
    rng.shuffle(claims)
    second = reconcile(slices, claims, [], h.DRIVER)
    assert first == second
    for g in first.values():
        assert g.status.allocated.cores == sum(a.cores for a in g.status.allocations)
        assert quantity_int(g.status.allocated.memory) == 256 * 1024**2 * len(g.status.allocations)


def test_manifest_shape() -> None:
    g = _one(reconcile([h.node_slice("n1", 1)], [], [], h.DRIVER), "n1", 0)
    m = g.manifest()
    assert m["apiVersion"] == "resource.sharegpu.dev/v1alpha1" and m["kind"] == "GPU"
    assert m["metadata"]["name"] == "n1-gpu-0"
    assert m["spec"]["sharingMode"] == "consumable"
    assert m["status"]["coresSummary"] == "0/100"
    assert "healthReason" not in m["status"]


@pytest.mark.process
def test_committed_crd_is_up_to_date() -> None:
    assert CRD_PATH.read_text() == render(), "run `python -m api.crd`"
    out = subprocess.run([sys.executable, "-m", "api.crd", "--check"], capture_output=True)
    assert out.returncode == 0, out.stderr


def test_objects_validate_against_crd_schema() -> None:
    import jsonschema
    import yaml

    crd = yaml.safe_load(CRD_PATH.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    claims = [h.claim("a", [h.result("n1", "gpu-0", cores=30, memory="10Gi")], pods=[("p", "u")])]
    s = h.node_slice("n1", devices=[h.whole_device("n1", 0, unhealthy="Xid48")])
    g = _one(reconcile([s], claims, [h.pod("p", "a", {"c": None}, uid="u")], h.DRIVER), "n1", 0)
    jsonschema.validate(g.manifest(), schema)
    bad = g.manifest()
    bad["status"]["health"] = "Fine"
    try:
        jsonschema.validate(bad, schema)
    except jsonschema.ValidationError as exc:
        assert "Fine" in str(exc)
    else:
        raise AssertionError("schema accepted an unknown health value")


def test_incomplete_newer_generation_keeps_the_complete_one() -> None:
    old = h.node_slice("n1", 2, generation=1)
    new = h.node_slice("n1", 3, generation=2)
    new["metadata"]["name"] = "n1-new-0"
    new["spec"]["pool"]["resourceSliceCount"] = 2  # second slice not written yet
    assert sorted(reconcile([old, new], [], [], h.DRIVER)) == ["n1-gpu-0", "n1-gpu-1"]
    second = h.node_slice("n1", 0, generation=2, devices=[h.whole_device("n1", 5)])
    second["metadata"]["name"] = "n1-new-1"
    second["spec"]["pool"]["resourceSliceCount"] = 2
    objs = reconcile([old, new, second], [], [], h.DRIVER)
    assert sorted(objs) == ["n1-gpu-0", "n1-gpu-1", "n1-gpu-2", "n1-gpu-5"]
    # with no complete generation at all, the newest one is used
    assert sorted(reconcile([new], [], [], h.DRIVER)) == ["n1-gpu-0", "n1-gpu-1", "n1-gpu-2"]


def test_a_slice_for_another_nodes_pool_never_replaces_its_gpus() -> None:
    """A plugin on n1 writing a newer generation of pool n2 (nodeName n1): n2's GPU objects stay
    the ones n2 publishes, and the forged devices appear nowhere."""
    real = h.node_slice("n2", 2, generation=1)
    forged = h.node_slice("n1", 4, generation=7)
    forged["metadata"]["name"] = "forged"
    forged["spec"]["pool"]["name"] = "n2"
    assert forged["spec"]["nodeName"] == "n1"
    objs = reconcile([real, forged], [], [], h.DRIVER)
    assert sorted(objs) == ["n2-gpu-0", "n2-gpu-1"]
    assert {o.spec.uuid for o in objs.values()} == {h.gpu_uuid("n2", 0), h.gpu_uuid("n2", 1)}


def test_reconciled_gpu_objects_carry_the_node_label() -> None:
    """Every object is selectable by node: ``kubectl get gpus -l resource.sharegpu.dev/node=n2``."""
    from api.names import GPU_NODE_LABEL

    objs = reconcile([h.node_slice("n1", 2), h.node_slice("n2", 1)], [], [], h.DRIVER)
    for g in objs.values():
        assert g.labels == {GPU_NODE_LABEL: g.spec.node}
        assert g.manifest()["metadata"]["labels"] == {GPU_NODE_LABEL: g.spec.node}
    selected = sorted(n for n, g in objs.items() if g.labels.get(GPU_NODE_LABEL) == "n2")
    assert selected == ["n2-gpu-0"]
    assert GPU_NODE_LABEL == "resource.sharegpu.dev/node"


def test_node_names_too_long_for_a_label_value_get_no_node_label() -> None:
    """A node name of 64 characters or more is a valid node name but not a label value: the
    object is still written, without the label (never a truncated, possibly shared value)."""
    node = "n" * 64
    g = _one(reconcile([h.node_slice(node, 1)], [], [], h.DRIVER), node, 0)
    assert g.labels == {}
    assert "labels" not in g.manifest()["metadata"]
    edge = "n" * 63
    g = _one(reconcile([h.node_slice(edge, 1)], [], [], h.DRIVER), edge, 0)
    assert g.labels == {"resource.sharegpu.dev/node": edge}


def test_crd_has_short_name_and_category() -> None:
    """``kubectl get sgpu`` and ``kubectl get sharegpu`` list GPU objects; the short name must not
    collide with the plural or singular, which kubectl resolves first."""
    from api.crd import crd_manifest

    names = crd_manifest()["spec"]["names"]
    assert names["shortNames"] == ["sgpu"]
    assert names["categories"] == ["sharegpu"]
    assert not {names["plural"], names["singular"]} & set(names["shortNames"])


def test_gpu_json_built_directly_is_what_the_model_validates_and_writes() -> None:
    """The tracker builds spec and status as JSON without the pydantic model; the model accepts
    exactly that JSON (unknown or misnamed fields are refused) and writes it back unchanged."""
    from controller.reconcile import (
        claim_allocations,
        gpu_manifest,
        gpu_object,
        newest_generation,
        pool_hardware,
    )
    from controller.records import claim_record, pod_info, slice_record

    r = h.result("n1", "gpu-1")
    r["adminAccess"] = True
    devices = [h.whole_device("n1", 0, unhealthy="Xid79"), h.whole_device("n1", 1, shared=False)]
    devices += h.half_devices("n1", 2)
    slices = [h.node_slice("n1", devices=devices), h.node_slice("n" * 64, 1)]
    claims = [
        h.claim("a", [h.result("n1", "gpu-0", cores=30, memory="10Gi")], pods=[("p", "u")]),
        h.claim("b", [r, h.result("n1", "gpu-2-half-0")], pods=[("gone", "")]),
    ]
    pods = {"default/p": pod_info(h.pod("p", "a", {"c": None}, uid="u"))}
    records = [slice_record(s, h.DRIVER) for s in slices]
    checked = 0
    for pool, pool_slices in newest_generation(records).items():
        gpus, devs = pool_hardware(pool, pool_slices)
        by_key = {(pool, n): d for n, d in devs.items()}
        allocs = [
            a
            for c in claims
            if (rec := claim_record(c, h.DRIVER)) is not None
            for a in claim_allocations(rec, by_key, gpus, pods)
        ]
        for name, hw in gpus.items():
            mine = [a for a in allocs if a.gpu == name]
            assert gpu_manifest(hw, mine) == gpu_object(hw, mine).manifest(), name
            checked += 1
    assert checked == 4


def test_a_missing_consumed_amount_counts_the_device_whole_as_the_node_grants_it() -> None:
    """The tracker and the node plugin count a consumedCapacity without ``cores`` alike: the
    device's whole amount (the node: kubeletplugin.prepare.shares.device_share)."""
    from controller.reconcile import claim_allocations, newest_generation, pool_hardware
    from controller.records import claim_record, slice_record

    r = h.result("n1", "gpu-0", cores=30, memory="10Gi")
    del r["consumedCapacity"]["cores"]
    rec = claim_record(h.claim("a", [r]), h.DRIVER)
    assert rec is not None
    records = [slice_record(h.node_slice("n1", devices=[h.whole_device("n1", 0)]), h.DRIVER)]
    [(pool, pool_slices)] = newest_generation(records).items()
    gpus, devs = pool_hardware(pool, pool_slices)
    [alloc] = claim_allocations(rec, {(pool, n): d for n, d in devs.items()}, gpus, {})
    assert (alloc.cores, alloc.memory) == (100, 10 * 1024**3)


def test_burstable_shares_show_their_limits_and_the_overcommit_ratio() -> None:
    """Requests sum as before (what the scheduler reserves); limits sum beside them, an
    allocation without a burstLimit counting its request, and the ratio is the larger one."""
    burstable = h.claim("a", [h.result("n1", "gpu-0", cores=30, memory="10Gi")])
    burstable["status"]["allocation"]["devices"]["config"] = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {
                "driver": h.DRIVER,
                "parameters": {
                    "apiVersion": "resource.sharegpu.dev/v1alpha1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "MPS", "burstLimit": {"cores": 100, "memory": "40Gi"}},
                },
            },
        }
    ]
    plain = h.claim("b", [h.result("n1", "gpu-0", cores=50, memory="20Gi")])
    g = _one(reconcile([h.node_slice("n1", 1)], [burstable, plain], [], h.DRIVER), "n1", 0)
    assert g.status.cores_summary == "80/100" and g.status.memory_summary == "30Gi/80Gi"
    a, b = g.status.allocations
    assert a.limit is not None and (a.limit.cores, a.limit.memory) == (100, "40Gi")
    assert b.limit is None
    assert g.status.limits is not None
    assert (g.status.limits.cores, g.status.limits.memory) == (150, "60Gi")
    assert g.status.limits_summary == "150/100 cores, 60Gi/80Gi"
    assert g.status.overcommit == "1.50"
    # Without a burstable share the fields are left out.
    g = _one(reconcile([h.node_slice("n1", 1)], [plain], [], h.DRIVER), "n1", 0)
    assert g.status.limits is None and g.status.overcommit is None
