"""Rules where sharegpu follows kube-scheduler (1.36, and 1.37 where it changed them) beyond
what its test table pins down: joint allocation of a pod's claims, the result limit, ``All``
with capacity requests, pool gathering, validity and generations, request policies on
dedicated devices, exact quantities."""

from __future__ import annotations

from typing import Any

from sharegpu.allocator import allocate, allocate_many, allocate_pod, seeded_share_ids
from tests.allocator.helpers import (
    CLASS,
    DRIVER,
    allocated,
    claim,
    device_class,
    exactly,
    exclusive_device,
    exclusive_slices,
    first_available,
    resource_slice,
)

CLASSES = [device_class()]
Obj = dict[str, Any]


def _bytes_device(index: int, memory: str, **capacity: Obj) -> Obj:
    device = exclusive_device(index)
    device["capacity"] = {"memory": {"value": memory}, **capacity}
    return device


def _devices(outcome: Any) -> list[str]:
    assert outcome.allocation is not None, outcome.to_dict()
    return [r["device"] for r in outcome.allocation["devices"]["results"]]


def test_claims_of_one_pod_that_only_fit_together_are_allocated_together() -> None:
    """gpu-0 suits both claims, gpu-1 only the first: one after another the first takes gpu-0
    and the second is left without a device; one search backtracks into the first claim."""
    slices = [
        resource_slice("s", [_bytes_device(0, "2Gi"), _bytes_device(1, "1Gi")], node="n1", pool="p")
    ]
    big = "device.capacity['gpu.sharegpu.dev'].memory.compareTo(quantity('2Gi')) >= 0"
    claims = [claim("any", [exactly()]), claim("big", [exactly(selectors=[big])])]
    separately = allocate_many(claims, slices, CLASSES, node="n1")
    assert separately[0].ok and not separately[1].ok
    together = allocate_pod(claims, slices, CLASSES, node="n1")
    assert [_devices(o) for o in together] == [["gpu-1"], ["gpu-0"]]


def test_a_pod_whose_claims_do_not_fit_gets_no_allocation_at_all() -> None:
    claims = [claim("a", [exactly(count=1)]), claim("b", [exactly(count=2)])]
    outcomes = allocate_pod(claims, exclusive_slices(2), CLASSES, node="n1")
    assert [o.ok for o in outcomes] == [False, False]
    assert all(o.reports for o in outcomes)


def test_first_available_moves_on_when_the_claim_limit_would_be_exceeded() -> None:
    """firstAvailable [32, 16] twice over 64 devices: 32 + 32 would pass the 32-results
    limit of the claim, so each request falls back to 16 devices."""
    subs = [
        {"name": "many", "deviceClassName": CLASS, "count": 32},
        {"name": "some", "deviceClassName": CLASS, "count": 16},
    ]
    c = claim("c", [first_available("a", subs), first_available("b", subs)])
    out = allocate(c, exclusive_slices(64), CLASSES, node="n1")
    assert out.error is None
    requests = [r["request"] for r in (out.allocation or {})["devices"]["results"]]
    assert requests == ["a/some"] * 16 + ["b/some"] * 16


def test_a_claim_needing_more_than_32_devices_is_refused_up_front() -> None:
    c = claim("c", [exactly("a", count=20), exactly("b", count=13)])
    out = allocate(c, exclusive_slices(64), CLASSES, node="n1")
    assert out.error == (
        "claim default/c, request b: adding 13 devices exceeds the claim limit of 32, with 20 "
        "already accounted for"
    )


def test_all_mode_with_a_capacity_request_leaves_out_devices_that_cannot_hold_it() -> None:
    slices = [
        resource_slice("s", [_bytes_device(0, "1Gi"), _bytes_device(1, "4Gi")], node="n1", pool="p")
    ]
    c = claim("c", [exactly(all_mode=True, capacity={"memory": "2Gi"})])
    assert _devices(allocate(c, slices, CLASSES, node="n1")) == ["gpu-1"]


def test_request_policy_applies_to_a_dedicated_device() -> None:
    policy = {"default": "1Gi", "validValues": ["1Gi", "2Gi"]}
    device = _bytes_device(0, "4Gi")
    device["capacity"]["memory"]["requestPolicy"] = policy
    slices = [resource_slice("s", [device], node="n1", pool="p")]
    c = claim("c", [exactly(capacity={"memory": "3Gi"})])
    out = allocate(c, slices, CLASSES, node="n1")
    assert not out.ok
    assert [r.kind for r in out.reports[0].rejections] == ["capacity-policy"]


def test_two_half_shares_fit_a_capacity_of_one() -> None:
    device = exclusive_device(0)
    device["allowMultipleAllocations"] = True
    device["capacity"] = {"slots": {"value": "1"}}
    slices = [resource_slice("s", [device], node="n1", pool="p")]
    claims = [claim(n, [exactly(capacity={"slots": "500m"})]) for n in ("a", "b")]
    outs = allocate_many(claims, slices, CLASSES, node="n1", share_ids=seeded_share_ids(1))
    assert [o.ok for o in outs] == [True, True]
    assert outs[0].allocation is not None
    assert outs[0].allocation["devices"]["results"][0]["consumedCapacity"] == {"slots": "500m"}


def test_unknown_counter_makes_the_pool_invalid_and_says_so() -> None:
    device = exclusive_device(0)
    device["consumesCounters"] = [{"counterSet": "nope", "counters": {"x": {"value": "1"}}}]
    slices = [
        resource_slice("c", node="n1", pool="p", count=2, shared_counters=[]),
        resource_slice("d", [device], node="n1", pool="p", count=2),
    ]
    out = allocate(claim("c", [exactly()]), slices, CLASSES, node="n1")
    assert out.error == "invalid resource pools were encountered"
    assert [r.kind for r in out.reports[0].rejections] == ["pool-invalid"]
    assert "counter set nope not found" in out.reports[0].rejections[0].message


def test_a_device_on_another_node_with_an_unknown_counter_invalidates_the_pool() -> None:
    mine, theirs = exclusive_device(0), exclusive_device(1)
    theirs["consumesCounters"] = [{"counterSet": "nope", "counters": {"x": {"value": "1"}}}]
    slices = [
        resource_slice("a", [mine], node="n1", pool="p", count=2),
        resource_slice("b", [theirs], node="n2", pool="p", count=2),
    ]
    out = allocate(claim("c", [exactly()]), slices, CLASSES, node="n1")
    assert not out.ok and out.error == "invalid resource pools were encountered"


def test_generation_is_the_newest_among_the_slices_for_this_node() -> None:
    """A newer generation for another node does not hide this node's complete pool."""
    slices = [
        resource_slice("n1-s", [exclusive_device(0)], node="n1", pool="n1", generation=1),
        resource_slice("n2-s", [exclusive_device(1)], node="n2", pool="n1", generation=2),
    ]
    assert _devices(allocate(claim("c", [exactly()]), slices, CLASSES, node="n1")) == ["gpu-0"]


def test_more_slices_than_resource_slice_count_is_incomplete() -> None:
    slices = [
        resource_slice("s0", [exclusive_device(0)], node="n1", pool="p", count=1),
        resource_slice("s1", [exclusive_device(1)], node="n1", pool="p", count=1),
    ]
    out = allocate(claim("c", [exactly()]), slices, CLASSES, node="n1")
    assert not out.ok
    assert {r.kind for r in out.reports[0].rejections} == {"pool-incomplete"}


def _counter_device(index: int) -> Obj:
    device = exclusive_device(index)
    device["consumesCounters"] = [{"counterSet": "set", "counters": {"slots": {"value": "1"}}}]
    return device


def _counters(slots: str = "1") -> list[Obj]:
    return [{"name": "set", "counters": {"slots": {"value": slots}}}]


def test_a_counter_slice_for_another_node_makes_no_pool_on_this_node() -> None:
    """A counter-set slice takes part where its node fields say, as any slice: alone on n2
    it gives n1 no pool (an All request finds no device instead of a pool being updated)."""
    slices = [resource_slice("c", node="n2", pool="p", count=2, shared_counters=_counters())]
    out = allocate(claim("c", [exactly(all_mode=True)]), slices, CLASSES, node="n1")
    assert not out.ok and out.error is None


def test_a_counter_slice_for_another_node_still_completes_the_pool() -> None:
    """n1's device slice alone is not the pool (count 2): all slices of the generation
    complete it, the counter set on n2 included, and its counters bound n1's devices."""
    slices = [
        resource_slice("c", node="n2", pool="p", count=2, shared_counters=_counters()),
        resource_slice("d", [_counter_device(0), _counter_device(1)], node="n1", pool="p", count=2),
    ]
    out = allocate(claim("c", [exactly(count=1)]), slices, CLASSES, node="n1")
    assert _devices(out) == ["gpu-0"]
    two = allocate(claim("c", [exactly(count=2)]), slices, CLASSES, node="n1")
    assert not two.ok and two.error is None


def test_an_incomplete_pool_is_skipped_not_invalid() -> None:
    """A pool that is still being published is not validated: a counter set it lacks so far
    does not make it invalid (no "invalid resource pools" error)."""
    slices = [resource_slice("d", [_counter_device(0)], node="n1", pool="p", count=2)]
    out = allocate(claim("c", [exactly()]), slices, CLASSES, node="n1")
    assert not out.ok and out.error is None
    assert {r.kind for r in out.reports[0].rejections} == {"pool-incomplete"}


def _exhausted_share_device() -> tuple[list[Obj], list[Obj]]:
    """gpu-0 shareable and wholly consumed by another claim, gpu-1 shareable and free."""
    devices = []
    for index in (0, 1):
        device = exclusive_device(index)
        device["allowMultipleAllocations"] = True
        device["capacity"] = {"slots": {"value": "1"}}
        devices.append(device)
    slices = [resource_slice("s", devices, node="n1", pool="p")]
    held = {
        "devices": {
            "results": [
                {
                    "request": "gpu",
                    "driver": DRIVER,
                    "pool": "p",
                    "device": "gpu-0",
                    "shareID": "00000000-0000-4000-8000-000000000001",
                    "consumedCapacity": {"slots": "1"},
                }
            ]
        }
    }
    return slices, [allocated(claim("held", []), held)]


def test_all_mode_keeps_a_device_whose_capacity_left_is_too_small() -> None:
    """Kubernetes 1.37: only a device's capacity as published decides whether an All request
    includes it, so a device other claims have consumed entirely makes the request fail
    rather than be met by the other devices."""
    slices, held = _exhausted_share_device()
    out = allocate(claim("c", [exactly(all_mode=True)]), slices, CLASSES, held, node="n1")
    assert not out.ok and out.error is None
    free = allocate(claim("c", [exactly(all_mode=True)]), slices, CLASSES, node="n1")
    assert _devices(free) == ["gpu-0", "gpu-1"]


def test_admin_access_all_does_not_skip_the_capacity_left() -> None:
    """Admin access skips the in-use check, not the capacity check of a shared device."""
    slices, held = _exhausted_share_device()
    c = claim("c", [exactly(all_mode=True, admin=True)])
    out = allocate(c, slices, CLASSES, held, node="n1")
    assert not out.ok and out.error is None


def test_all_mode_checks_constraints_before_the_capacity_left() -> None:
    """Same brand on both devices, distinctAttribute on it: the second device of the All
    request breaks the constraint, which stops the allocation with an error although that
    device has no capacity left either (kube-scheduler checks constraints first)."""
    slices, held = _exhausted_share_device()
    slices[0]["spec"]["devices"].reverse()  # the exhausted gpu-0 comes second
    distinct = {"distinctAttribute": f"{DRIVER}/brand"}
    c = claim("c", [exactly(all_mode=True)], constraints=[distinct])
    out = allocate(c, slices, CLASSES, held, node="n1")
    assert out.error is not None
    assert "cannot add device" in out.error and "constraint would not be satisfied" in out.error


def test_a_slice_declaring_compatibility_groups_is_ignored_and_its_pool_incomplete() -> None:
    """DRADeviceCompatibilityGroups is off in Kubernetes 1.37: kube-scheduler ignores a slice
    whose device declares groups, so its pool is incomplete and none of its devices (also
    those without groups) is allocated; another pool still is."""
    grouped = _counter_device(0)
    grouped["consumesCounters"][0]["compatibilityGroups"] = ["mig"]
    pool_p = [
        resource_slice("p-a", [grouped], node="n1", pool="p", count=3),
        resource_slice("p-b", [_counter_device(1)], node="n1", pool="p", count=3),
        resource_slice("p-c", node="n1", pool="p", count=3, shared_counters=_counters("4")),
    ]
    out = allocate(claim("c", [exactly()]), pool_p, CLASSES, node="n1")
    assert not out.ok and out.error is None
    assert {r.kind for r in out.reports[0].rejections} == {"pool-incomplete"}
    pool_q = [
        resource_slice("q-a", [_counter_device(2)], node="n1", pool="q", count=2),
        resource_slice("q-b", node="n1", pool="q", count=2, shared_counters=_counters()),
    ]
    both = allocate(claim("c", [exactly()]), pool_p + pool_q, CLASSES, node="n1")
    assert _devices(both) == ["gpu-2"]


def test_an_incomplete_pool_with_binding_conditions_is_not_moved_last() -> None:
    """Pools with binding conditions are searched last, but an incomplete pool has no devices
    for kube-scheduler: it keeps its place by name, and the All request names it first."""
    bound = exclusive_device(0)
    bound["bindingConditions"] = ["example.com/ready"]
    bound["bindingFailureConditions"] = ["example.com/failed"]
    slices = [
        resource_slice("a", [bound], node="n1", pool="pool-a", count=2),
        resource_slice("b", [exclusive_device(1)], node="n1", pool="pool-b", count=2),
    ]
    out = allocate(claim("c", [exactly(all_mode=True)]), slices, CLASSES, node="n1")
    assert out.error is not None
    assert f"resource pool {DRIVER}/pool-a is currently being updated" in out.error
