"""Allocator semantics, one table row or test per rule, with the exact allocation shape."""

from __future__ import annotations

from typing import Any

import pytest

from sharegpu.allocator import (
    AllocationOutcome,
    AllocatorInputError,
    allocate,
    allocate_many,
    seeded_share_ids,
)
from tests.allocator.helpers import (
    CLASS,
    DRIVER,
    allocated,
    claim,
    consumable_device,
    consumable_slices,
    device_class,
    exactly,
    exclusive_device,
    exclusive_slices,
    first_available,
    partition_slices,
    resource_slice,
    share,
)

NODE_SELECTOR = {
    "nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    ]
}
CLASSES = [device_class()]
SMALL = {"cores": "10", "memory": "1Gi"}


def run(
    c: dict[str, Any],
    slices: list[dict[str, Any]],
    classes: Any = None,
    existing: list[dict[str, Any]] | None = None,
) -> AllocationOutcome:
    return allocate(
        c, slices, classes or CLASSES, existing or [], "n1", share_ids=seeded_share_ids(7)
    )


def devices_of(outcome: AllocationOutcome) -> list[str]:
    assert outcome.allocation is not None, outcome.to_dict()
    return [r["device"] for r in outcome.allocation["devices"]["results"]]


def kinds(outcome: AllocationOutcome, request: str | None = None) -> list[str]:
    reports = [r for r in outcome.reports if request is None or r.request == request]
    return [rej.kind for r in reports for rej in r.rejections]


def test_whole_gpu_share_has_the_exact_scheduler_shape() -> None:
    out = run(claim("c", [exactly()]), consumable_slices(2))
    share_id = seeded_share_ids(7)()
    assert out.allocation == {
        "devices": {
            "results": [
                {
                    "request": "gpu",
                    "driver": DRIVER,
                    "pool": "n1",
                    "device": "gpu-0",
                    "shareID": share_id,
                    "consumedCapacity": {"cores": "100", "memory": "79Gi"},
                }
            ]
        },
        "nodeSelector": NODE_SELECTOR,
    }
    assert share_id == share_id.lower() and len(share_id) == 36


@pytest.mark.parametrize(
    ("capacity", "consumed"),
    [
        ({"cores": "30", "memory": "10Gi"}, {"cores": "30", "memory": "10Gi"}),
        ({"cores": "0.5", "memory": "1000Mi"}, {"cores": "1", "memory": "1Gi"}),
        ({"memory": "100Mi"}, {"cores": "100", "memory": "256Mi"}),
        ({"cores": "50"}, {"cores": "50", "memory": "79Gi"}),
        ({"memory": "257Mi"}, {"cores": "100", "memory": "512Mi"}),
    ],
)
def test_request_policy_rounding(capacity: dict[str, str], consumed: dict[str, str]) -> None:
    out = run(claim("c", [exactly(capacity=capacity)]), consumable_slices(1))
    assert out.allocation is not None
    assert out.allocation["devices"]["results"][0]["consumedCapacity"] == consumed


def test_policy_violation_when_rounding_exceeds_max() -> None:
    # 81000Mi fits the 81079Mi device, but rounds up to 81152Mi, above the 80896Mi maximum.
    out = run(claim("c", [exactly(capacity={"memory": "81000Mi"})]), consumable_slices(1))
    assert not out.ok
    rej = out.reports[0].rejections[0]
    assert rej.kind == "capacity-policy"
    assert rej.details["capacity"] == "memory"
    assert rej.details["rounded"] == "81152Mi"
    assert "validRange" in rej.details["policy"]


def test_valid_values_policy() -> None:
    dev = consumable_device(0)
    dev["capacity"]["cores"]["requestPolicy"] = {
        "default": "100",
        "validValues": ["25", "50", "100"],
    }
    slices = [resource_slice("s", [dev])]
    out = run(claim("c", [exactly(capacity={"cores": "30"})]), slices)
    assert out.allocation["devices"]["results"][0]["consumedCapacity"]["cores"] == "50"
    dev["capacity"]["cores"]["requestPolicy"] = {"default": "10", "validValues": ["10", "20"]}
    out = run(claim("c", [exactly(capacity={"cores": "30"})]), slices)
    assert kinds(out) == ["capacity-policy"]


def test_memory_larger_than_any_gpu_is_capacity_short_with_amounts() -> None:
    out = run(share("big", memory="100Gi"), consumable_slices(2))
    assert not out.ok and out.error is None
    report = out.reports[0]
    assert report.eligible == []
    assert [r.kind for r in report.rejections] == ["capacity-short", "capacity-short"]
    details = report.rejections[0].details
    assert details == {
        "capacity": "memory",
        "requested": "100Gi",
        "available": "81079Mi",
        "shortBy": "21321Mi",
    }
    assert "short by 21321Mi" in report.rejections[0].message


def test_device_lacking_a_requested_capacity_is_ineligible() -> None:
    out = run(
        claim("c", [exactly(capacity={"gpu.sharegpu.dev/nvlinks": "1"})]), consumable_slices(1)
    )
    rej = out.reports[0].rejections[0]
    assert rej.kind == "capacity-short" and rej.details["available"] is None
    assert "no capacity" in rej.message


def test_capacity_requests_filter_exclusive_devices() -> None:
    out = run(claim("c", [exactly(capacity={"memory": "40Gi"})]), exclusive_slices(1))
    assert devices_of(out) == ["gpu-0"]
    assert "consumedCapacity" not in out.allocation["devices"]["results"][0]
    out = run(claim("c", [exactly(capacity={"memory": "90Gi"})]), exclusive_slices(1))
    assert kinds(out) == ["capacity-short"]


def test_shares_fill_a_gpu_then_move_on() -> None:
    claims = [share(f"s{i}", cores="40", memory="20Gi") for i in range(3)]
    outs = allocate_many(
        claims, consumable_slices(2), CLASSES, node="n1", share_ids=seeded_share_ids(1)
    )
    assert [devices_of(o) for o in outs] == [["gpu-0"], ["gpu-0"], ["gpu-1"]]
    ids = [o.allocation["devices"]["results"][0]["shareID"] for o in outs]
    assert len(set(ids)) == 3


def test_full_node_of_shares_reports_capacity_short_per_gpu() -> None:
    first = allocate_many(
        [share(f"w{i}") for i in range(2)],
        consumable_slices(2),
        CLASSES,
        node="n1",
        share_ids=seeded_share_ids(1),
    )
    existing = [allocated(share(f"w{i}"), o.allocation) for i, o in enumerate(first)]
    out = run(share("late", cores="10", memory="1Gi"), consumable_slices(2), existing=existing)
    assert not out.ok
    rejections = out.reports[0].rejections
    assert [r.kind for r in rejections] == ["capacity-short", "capacity-short"]
    assert rejections[0].details["available"] == "0"
    assert "shared with default/w0" in rejections[0].message


def test_full_node_of_exclusive_gpus_reports_the_holders() -> None:
    outs = allocate_many(
        [claim(f"x{i}", [exactly()]) for i in range(3)], exclusive_slices(2), CLASSES, node="n1"
    )
    assert [o.ok for o in outs] == [True, True, False]
    rejections = outs[2].reports[0].rejections
    assert [(r.kind, r.details["by"]) for r in rejections] == [
        ("already-allocated", "default/x0"),
        ("already-allocated", "default/x1"),
    ]
    assert outs[0].allocation["devices"]["results"][0].keys() == {
        "request",
        "driver",
        "pool",
        "device",
    }


def test_exact_count_and_all() -> None:
    out = run(claim("c", [exactly(count=3)]), exclusive_slices(4))
    assert devices_of(out) == ["gpu-0", "gpu-1", "gpu-2"]
    out = run(claim("c", [exactly(all_mode=True)]), exclusive_slices(4))
    assert devices_of(out) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    out = run(claim("c", [exactly(count=5)]), exclusive_slices(4))
    assert not out.ok and "needs 5 device(s), 4 of 4 eligible" in out.reports[0].summary


def test_all_mode_fails_when_one_matching_device_is_taken() -> None:
    existing = [
        allocated(
            claim("x", [exactly()]), run(claim("x", [exactly()]), exclusive_slices(2)).allocation
        )
    ]
    out = run(claim("c", [exactly(all_mode=True)]), exclusive_slices(2), existing=existing)
    assert not out.ok and kinds(out) == ["already-allocated"]


def test_all_mode_with_incomplete_pool_is_an_error() -> None:
    slices = [resource_slice("s0", [exclusive_device(0)], count=2)]
    out = run(claim("c", [exactly(all_mode=True)]), slices)
    assert out.error is not None and "being updated" in out.error


def test_first_available_takes_subrequests_in_order() -> None:
    subs = [
        {
            "name": "a100",
            "deviceClassName": CLASS,
            "selectors": [
                {
                    "cel": {
                        "expression": f"device.attributes['{DRIVER}'].productName.contains('A100')"
                    }
                }
            ],
        },
        {
            "name": "h100",
            "deviceClassName": CLASS,
            "count": 2,
            "selectors": [
                {
                    "cel": {
                        "expression": f"device.attributes['{DRIVER}'].productName.contains('H100')"
                    }
                }
            ],
        },
        {"name": "any", "deviceClassName": CLASS},
    ]
    out = run(claim("c", [first_available("gpu", subs)]), exclusive_slices(2))
    assert [r["request"] for r in out.allocation["devices"]["results"]] == ["gpu/h100"] * 2
    out = run(claim("c", [first_available("gpu", subs)]), exclusive_slices(1))
    assert [r["request"] for r in out.allocation["devices"]["results"]] == ["gpu/any"]
    out = run(claim("c", [first_available("gpu", subs[:2])]), exclusive_slices(1))
    assert [r.request for r in out.reports] == ["gpu/a100", "gpu/h100"]


def test_configs_from_class_and_claim() -> None:
    """Kubernetes 1.37: each config once; ``requests`` cleared when they cover every request."""
    opaque = {"driver": DRIVER, "parameters": {"kind": "GpuConfig"}}
    classes = [device_class(config=[{"opaque": opaque}])]
    c = claim(
        "c",
        [exactly("a"), exactly("b"), exactly("c")],
        config=[
            {"opaque": {"driver": DRIVER, "parameters": {"x": 1}}},
            {"requests": ["b", "c"], "opaque": {"driver": DRIVER, "parameters": {"y": 2}}},
            {"requests": ["c", "b", "a"], "opaque": {"driver": DRIVER, "parameters": {"w": 4}}},
            {"requests": ["nothing"], "opaque": {"driver": DRIVER, "parameters": {"v": 5}}},
        ],
    )
    out = run(c, exclusive_slices(3), classes)
    assert out.allocation["devices"]["config"] == [
        {"source": "FromClass", "opaque": opaque},
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"x": 1}}},
        {
            "source": "FromClaim",
            "requests": ["b", "c"],
            "opaque": {"driver": DRIVER, "parameters": {"y": 2}},
        },
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"w": 4}}},
    ]


def test_class_config_lists_its_requests_when_not_all_use_the_class() -> None:
    opaque = {"driver": DRIVER, "parameters": {"kind": "GpuConfig"}}
    classes = [device_class(config=[{"opaque": opaque}]), device_class("other")]
    c = claim("c", [exactly("a"), exactly("b", device_class_name="other"), exactly("c")])
    out = run(c, exclusive_slices(3), classes)
    assert out.allocation["devices"]["config"] == [
        {"source": "FromClass", "requests": ["a", "c"], "opaque": opaque}
    ]


def test_class_and_request_selectors_both_apply() -> None:
    classes = [device_class(selectors=[f"device.attributes['{DRIVER}'].index >= 1"])]
    c = claim("c", [exactly(selectors=[f"device.attributes['{DRIVER}'].index != 1"])])
    out = run(c, exclusive_slices(3), classes)
    assert devices_of(out) == ["gpu-2"]
    out = run(c, exclusive_slices(2), classes)
    reasons = [(r.kind, r.details["source"]) for r in out.reports[0].rejections]
    assert reasons == [("selector-false", f"class {CLASS}"), ("selector-false", "request")]


def test_mistyped_attribute_is_a_selector_error_naming_it() -> None:
    c = claim("c", [exactly(selectors=[f"device.attributes['{DRIVER}'].productNam == 'H100'"])])
    out = run(c, exclusive_slices(2))
    assert not out.ok
    assert out.error is not None and "productNam" in out.error
    assert "CEL runtime error" in out.error
    rej = out.reports[0].rejections[0]
    assert rej.kind == "selector-error"
    assert "productNam" in rej.details["error"] and "productNam" in rej.message
    assert rej.details["missingKey"] == "productNam"


def test_selector_compile_error_in_class() -> None:
    out = run(claim("c", [exactly()]), exclusive_slices(1), [device_class(selectors=["device."])])
    assert out.error is not None and f"class {CLASS}: selector #0" in out.error
    assert kinds(out) == ["selector-error"]


def test_missing_class_is_an_error() -> None:
    out = run(claim("c", [exactly(device_class_name="nope")]), exclusive_slices(1))
    assert (
        out.error == "claim default/c, request gpu: could not retrieve device class nope: not found"
    )


@pytest.mark.parametrize(
    ("effect", "tolerations", "ok"),
    [
        ("NoSchedule", None, False),
        ("NoExecute", None, False),
        ("None", None, True),
        ("NoSchedule", [{"key": f"{DRIVER}/unhealthy", "operator": "Exists"}], True),
        ("NoSchedule", [{"operator": "Exists"}], True),
        ("NoSchedule", [{"key": f"{DRIVER}/unhealthy", "operator": "Equal", "value": "xid"}], True),
        (
            "NoSchedule",
            [{"key": f"{DRIVER}/unhealthy", "operator": "Equal", "value": "ecc"}],
            False,
        ),
        (
            "NoExecute",
            [{"key": f"{DRIVER}/unhealthy", "operator": "Exists", "effect": "NoSchedule"}],
            False,
        ),
    ],
)
def test_taints_and_tolerations(
    effect: str, tolerations: list[dict[str, Any]] | None, ok: bool
) -> None:
    dev = exclusive_device(0)
    dev["taints"] = [{"key": f"{DRIVER}/unhealthy", "value": "xid", "effect": effect}]
    out = run(claim("c", [exactly(tolerations=tolerations)]), [resource_slice("s", [dev])])
    assert out.ok is ok
    if ok and tolerations:
        assert out.allocation["devices"]["results"][0]["tolerations"] == tolerations
    if not ok:
        rej = out.reports[0].rejections[0]
        assert rej.kind == "tainted"
        assert rej.details == {"key": f"{DRIVER}/unhealthy", "value": "xid", "effect": effect}


def test_only_the_highest_generation_counts() -> None:
    slices = [
        resource_slice("old", [exclusive_device(0)], generation=1),
        resource_slice("new", [exclusive_device(5)], generation=2),
    ]
    assert devices_of(run(claim("c", [exactly()]), slices)) == ["gpu-5"]


def test_incomplete_pool_is_skipped() -> None:
    slices = [resource_slice("s0", [exclusive_device(0)], count=2)]
    out = run(claim("c", [exactly()]), slices)
    assert not out.ok and out.error is None
    assert kinds(out) == ["pool-incomplete"]


def test_pool_with_duplicate_device_names_is_invalid() -> None:
    slices = [
        resource_slice("s0", [exclusive_device(0)], count=2),
        resource_slice("s1", [exclusive_device(0)], count=2),
    ]
    out = run(claim("c", [exactly()]), slices)
    assert kinds(out) == ["pool-invalid", "pool-invalid"]
    assert "duplicate device name gpu-0" in out.reports[0].rejections[0].message


def test_slice_order_and_node_reachability() -> None:
    slices = [
        resource_slice("b", [exclusive_device(1)], pool="p"),
        resource_slice("other-node", [exclusive_device(7)], node="n2"),
        resource_slice("a", [exclusive_device(2)], pool="p", count=2),
    ]
    for s in slices:
        s["spec"]["pool"]["resourceSliceCount"] = 2 if s["spec"]["pool"]["name"] == "p" else 1
    out = run(claim("c", [exactly(count=2)]), slices)
    assert devices_of(out) == ["gpu-2", "gpu-1"]


def test_all_nodes_and_node_selector_slices() -> None:
    slices = [resource_slice("net", [exclusive_device(0)], pool="shared", all_nodes=True)]
    out = run(claim("c", [exactly()]), slices)
    assert devices_of(out) == ["gpu-0"] and "nodeSelector" not in out.allocation
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n3"]}]}
        ]
    }
    sel_slice = resource_slice("sel", [exclusive_device(0)], pool="rack")
    del sel_slice["spec"]["nodeName"]
    sel_slice["spec"]["nodeSelector"] = selector
    out = run(claim("c", [exactly()]), [sel_slice])
    assert out.allocation["nodeSelector"] == selector
    selector["nodeSelectorTerms"][0]["matchFields"][0]["values"] = ["n2"]
    out = run(claim("c", [exactly()]), [sel_slice])
    assert not out.ok and out.reports[0].rejections == []
    assert "no device of any pool is visible from node n1" in out.reports[0].summary


def test_match_attribute_picks_devices_on_one_pcie_root() -> None:
    slices = [
        resource_slice(
            "s",
            [
                exclusive_device(0, pcie_root="r0"),
                exclusive_device(1, pcie_root="r1"),
                exclusive_device(2, pcie_root="r1"),
            ],
        )
    ]
    c = claim(
        "c",
        [exactly("a"), exactly("b")],
        constraints=[{"requests": ["a", "b"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
    )
    assert devices_of(run(c, slices)) == ["gpu-1", "gpu-2"]


def test_unsatisfiable_match_attribute_is_explained() -> None:
    slices = [resource_slice("s", [exclusive_device(i, pcie_root=f"r{i}") for i in range(3)])]
    c = claim(
        "c",
        [exactly("a"), exactly("b")],
        constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}],
    )
    out = run(c, slices)
    assert not out.ok and out.error is None
    for report in out.reports:
        assert [r.kind for r in report.rejections] == ["constraint"] * 3
        rej = report.rejections[0]
        assert rej.details["constraint"] == "matchAttribute"
        assert rej.details["attribute"] == "resource.kubernetes.io/pcieRoot"
        assert "no eligible device of request" in rej.message


def test_match_attribute_on_missing_attribute() -> None:
    c = claim("c", [exactly("a")], constraints=[{"matchAttribute": f"{DRIVER}/numaNode"}])
    out = run(c, exclusive_slices(1))
    assert kinds(out) == ["constraint"]
    assert "lacks the attribute" in out.reports[0].rejections[0].message
    out = run(c, [resource_slice("s", [exclusive_device(0, numa=0)])])
    assert out.ok


def test_distinct_attribute_spreads_shares_over_gpus() -> None:
    c = claim(
        "c",
        [exactly("a", capacity=SMALL), exactly("b", capacity=SMALL)],
        constraints=[{"distinctAttribute": f"{DRIVER}/uuid"}],
    )
    assert devices_of(run(c, consumable_slices(2))) == ["gpu-0", "gpu-1"]
    no_constraint = claim("c", [exactly("a", capacity=SMALL), exactly("b", capacity=SMALL)])
    assert devices_of(run(no_constraint, consumable_slices(2))) == ["gpu-0", "gpu-0"]
    assert not run(c, consumable_slices(1)).ok


def test_partitions_consume_shared_counters() -> None:
    half = [f"device.attributes['{DRIVER}'].partition == 'half'"]
    whole = [f"device.attributes['{DRIVER}'].partition == 'whole'"]
    claims = [
        claim("h0", [exactly(selectors=half)]),
        claim("h1", [exactly(selectors=half)]),
        claim("w", [exactly(selectors=whole)]),
    ]
    outs = allocate_many(claims, partition_slices(1), CLASSES, node="n1")
    assert [devices_of(o) for o in outs[:2]] == [["gpu-0-half-0"], ["gpu-0-half-1"]]
    assert not outs[2].ok
    rej = outs[2].reports[0].rejections
    counter = [r for r in rej if r.kind == "counter-short"]
    assert counter and counter[0].device.device == "gpu-0"
    assert counter[0].details["counterSet"] == "gpu-0-counters"
    assert counter[0].details["counter"] in ("cores", "memory")
    assert counter[0].details["available"] == "0"


def test_partitions_spill_to_the_next_gpu() -> None:
    quarter = [f"device.attributes['{DRIVER}'].partition == 'quarter'"]
    claims = [claim(f"q{i}", [exactly(selectors=quarter)]) for i in range(5)]
    outs = allocate_many(claims, partition_slices(2), CLASSES, node="n1")
    assert [devices_of(o)[0] for o in outs] == [
        "gpu-0-quarter-0",
        "gpu-0-quarter-1",
        "gpu-0-quarter-2",
        "gpu-0-quarter-3",
        "gpu-1-quarter-0",
    ]


def test_shared_device_charges_counters_on_first_share_only() -> None:
    dev = consumable_device(0)
    dev["consumesCounters"] = [{"counterSet": "set", "counters": {"slots": {"value": "1"}}}]
    slices = [
        resource_slice(
            "a",
            node="n1",
            count=2,
            shared_counters=[{"name": "set", "counters": {"slots": {"value": "1"}}}],
        ),
        resource_slice("b", [dev], count=2),
    ]
    outs = allocate_many(
        [share(f"s{i}", cores="10", memory="1Gi") for i in range(3)],
        slices,
        CLASSES,
        node="n1",
        share_ids=seeded_share_ids(3),
    )
    assert all(o.ok for o in outs)


def test_admin_access_ignores_exclusive_holders() -> None:
    first = run(claim("x", [exactly()]), exclusive_slices(1))
    existing = [allocated(claim("x", [exactly()]), first.allocation)]
    out = run(claim("admin", [exactly(admin=True)]), exclusive_slices(1), existing=existing)
    assert out.allocation["devices"]["results"][0]["adminAccess"] is True
    out = run(claim("y", [exactly()]), exclusive_slices(1), existing=existing)
    assert kinds(out) == ["already-allocated"]


def test_bad_input_names_the_field() -> None:
    with pytest.raises(AllocatorInputError, match=r"spec.devices.requests\[0\].exactly.count"):
        run(claim("c", [exactly(count=0)]), exclusive_slices(1))
    with pytest.raises(AllocatorInputError, match="must be fully qualified"):
        run(claim("c", [exactly()], constraints=[{"matchAttribute": "uuid"}]), exclusive_slices(1))
    with pytest.raises(AllocatorInputError, match="node name is required"):
        allocate(claim("c", [exactly()]), exclusive_slices(1), CLASSES, [], "")


def test_outcome_serialises_to_json() -> None:
    import json

    out = run(share("big", memory="100Gi"), consumable_slices(1))
    data = json.loads(json.dumps(out.to_dict()))
    assert data["allocated"] is False
    assert data["reports"][0]["rejections"][0]["kind"] == "capacity-short"


def test_an_allocated_claim_can_be_allocated_again_for_explaining() -> None:
    c = claim("x", [exactly()])
    first = run(c, exclusive_slices(1))
    again = run(c, exclusive_slices(1), existing=[allocated(c, first.allocation)])
    assert again.allocation == first.allocation


def test_admin_access_cannot_reuse_a_device_picked_in_the_same_claim() -> None:
    c = claim("c", [exactly("one"), exactly("admin", admin=True)])
    out = run(c, exclusive_slices(2))
    assert devices_of(out) == ["gpu-0", "gpu-1"]
    assert "adminAccess" not in out.allocation["devices"]["results"][0]
    assert out.allocation["devices"]["results"][1]["adminAccess"] is True


def test_admin_access_on_a_shared_device_takes_a_share() -> None:
    """As kube-scheduler: a device with allowMultipleAllocations gives every pick a share,
    admin access included; here the admin share (the default, all of it) no longer fits
    beside the first share on gpu-0."""
    c = claim("c", [exactly("share", capacity=SMALL), exactly("admin", admin=True)])
    out = run(c, consumable_slices(2))
    assert devices_of(out) == ["gpu-0", "gpu-1"]
    admin = out.allocation["devices"]["results"][1]
    assert admin["adminAccess"] is True and "shareID" in admin


def test_per_device_node_selection() -> None:
    devices = [exclusive_device(0), exclusive_device(1)]
    devices[0]["nodeName"] = "n2"
    devices[1]["nodeName"] = "n1"
    s = resource_slice("s", devices, pool="fabric")
    del s["spec"]["nodeName"]
    s["spec"]["perDeviceNodeSelection"] = True
    out = run(claim("c", [exactly()]), [s])
    assert devices_of(out) == ["gpu-1"]
    assert out.allocation["nodeSelector"] == NODE_SELECTOR


def test_node_selector_on_labels() -> None:
    s = resource_slice("s", [exclusive_device(0)], pool="rack")
    del s["spec"]["nodeName"]
    s["spec"]["nodeSelector"] = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}
        ]
    }
    c = claim("c", [exactly()])
    assert allocate(c, [s], CLASSES, [], "n1", node_labels={"rack": "r1"}).ok
    assert not allocate(c, [s], CLASSES, [], "n1", node_labels={"rack": "r2"}).ok
    assert not allocate(c, [s], CLASSES, [], "n1").ok


def test_claim_config_for_a_selected_subrequest() -> None:
    subs = [
        {"name": "big", "deviceClassName": CLASS, "count": 4},
        {"name": "one", "deviceClassName": CLASS},
    ]
    opaque = {"driver": DRIVER, "parameters": {"z": 3}}
    c = claim(
        "c",
        [first_available("gpu", subs)],
        config=[
            {"requests": ["gpu/one"], "opaque": opaque},
            {"requests": ["gpu/big"], "opaque": opaque},
        ],
    )
    out = run(c, exclusive_slices(2))
    # the config of the selected subrequest covers the claim's only request: requests cleared
    assert out.allocation["devices"]["config"] == [{"source": "FromClaim", "opaque": opaque}]
    assert [r["request"] for r in out.allocation["devices"]["results"]] == ["gpu/one"]


def test_search_limit_stops_with_an_error() -> None:
    # Six devices with distinct PCIe roots out of twelve that have only five roots.
    slices = [resource_slice("s", [exclusive_device(i, pcie_root=f"r{i % 5}") for i in range(12)])]
    c = claim(
        "c",
        [exactly("a", count=6)],
        constraints=[{"distinctAttribute": "resource.kubernetes.io/pcieRoot"}],
    )
    out = allocate(c, slices, CLASSES, [], "n1", max_steps=50)
    assert out.error is not None and "search limit of 50 steps" in out.error
    assert not allocate(c, slices, CLASSES, [], "n1").ok
