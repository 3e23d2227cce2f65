"""DeviceTaintRules taint the devices they select exactly as a taint in the slice does."""

from __future__ import annotations

from typing import Any

import pytest

from sharegpu.allocator import allocate
from tests.allocator.helpers import (
    DRIVER,
    claim,
    device_class,
    device_taint_rule,
    exactly,
    exclusive_device,
    exclusive_slices,
    resource_slice,
)

Obj = dict[str, Any]
CLASSES = [device_class()]


def devices(outcome: Any) -> list[str]:
    assert outcome.allocation is not None, outcome.error
    return [r["device"] for r in outcome.allocation["devices"]["results"]]


@pytest.mark.parametrize(
    ("selector", "tainted"),
    [
        ({}, {"gpu-0", "gpu-1"}),
        ({"driver": DRIVER}, {"gpu-0", "gpu-1"}),
        ({"driver": "other.example.com"}, set()),
        ({"pool": "n1"}, {"gpu-0", "gpu-1"}),
        ({"pool": "n2"}, set()),
        ({"device": "gpu-0"}, {"gpu-0"}),
        ({"driver": DRIVER, "pool": "n1", "device": "gpu-1"}, {"gpu-1"}),
        ({"driver": DRIVER, "pool": "n2", "device": "gpu-1"}, set()),
        (None, set()),
    ],
)
def test_a_rule_taints_the_devices_its_selector_matches(
    selector: Obj | None, tainted: set[str]
) -> None:
    rule = device_taint_rule("maint", selector)
    out = allocate(
        claim("c", [exactly(count=2)]) if not tainted else claim("c", [exactly()]),
        exclusive_slices(2),
        CLASSES,
        node="n1",
        taint_rules=[rule],
    )
    free = {"gpu-0", "gpu-1"} - tainted
    if not free:
        assert out.allocation is None
        assert {r.device.device for r in out.reports[0].rejections} == tainted
        assert all(r.kind == "tainted" for r in out.reports[0].rejections)
    else:
        assert set(devices(out)) <= free


def test_the_rejection_names_the_rule() -> None:
    rule = device_taint_rule("drain-gpu-0", {"device": "gpu-0"}, value="repair")
    out = allocate(
        claim("c", [exactly()]),
        [resource_slice("s", [exclusive_device(0)])],
        CLASSES,
        node="n1",
        taint_rules=[rule],
    )
    assert out.allocation is None
    rej = out.reports[0].rejections[0]
    assert rej.kind == "tainted"
    assert rej.details == {
        "key": "example.com/maintenance",
        "value": "repair",
        "effect": "NoSchedule",
        "deviceTaintRule": "drain-gpu-0",
    }
    assert "DeviceTaintRule drain-gpu-0" in rej.message


@pytest.mark.parametrize(
    ("effect", "tolerations", "ok"),
    [
        ("None", None, True),
        ("NoSchedule", None, False),
        ("NoExecute", None, False),
        ("NoExecute", [{"key": "example.com/maintenance", "operator": "Exists"}], True),
        (
            "NoSchedule",
            [{"key": "example.com/maintenance", "operator": "Exists", "effect": "NoExecute"}],
            False,
        ),
    ],
)
def test_rule_taints_are_tolerated_as_slice_taints_are(
    effect: str, tolerations: list[Obj] | None, ok: bool
) -> None:
    rule = device_taint_rule("r", {"driver": DRIVER}, effect=effect)
    out = allocate(
        claim("c", [exactly(tolerations=tolerations)]),
        [resource_slice("s", [exclusive_device(0)])],
        CLASSES,
        node="n1",
        taint_rules=[rule],
    )
    assert (out.allocation is not None) is ok


def test_slice_taints_and_rule_taints_add_up() -> None:
    dev = exclusive_device(0)
    dev["taints"] = [{"key": f"{DRIVER}/unhealthy", "value": "xid", "effect": "NoSchedule"}]
    tolerate_slice = [{"key": f"{DRIVER}/unhealthy", "operator": "Exists"}]
    slices = [resource_slice("s", [dev])]
    rule = device_taint_rule("r", {"device": "gpu-0"})
    alone = allocate(claim("c", [exactly(tolerations=tolerate_slice)]), slices, CLASSES, node="n1")
    assert alone.allocation is not None
    both = allocate(
        claim("c", [exactly(tolerations=tolerate_slice)]),
        slices,
        CLASSES,
        node="n1",
        taint_rules=[rule],
    )
    assert both.allocation is None
    assert both.reports[0].rejections[0].details["deviceTaintRule"] == "r"
    # the inputs are left as they were
    assert slices[0]["spec"]["devices"][0]["taints"] == dev["taints"]
    assert len(dev["taints"]) == 1


def test_a_malformed_rule_taints_nothing() -> None:
    rule = device_taint_rule("bad", {}, effect="Sometimes")
    out = allocate(
        claim("c", [exactly()]), exclusive_slices(1), CLASSES, node="n1", taint_rules=[rule]
    )
    assert devices(out) == ["gpu-0"]
