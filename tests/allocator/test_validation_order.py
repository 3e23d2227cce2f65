"""The order in which the allocator meets a claim's problems, as kube-scheduler 1.37's:
requests validated one by one (device class, then for ``All`` the pools one by one), the
result limit per request, then the search, which stops on an ``All`` device breaking a
constraint and never evaluates what it does not reach."""

from __future__ import annotations

from typing import Any

from sharegpu.allocator import allocate
from tests.allocator.helpers import (
    CLASS,
    DRIVER,
    claim,
    device_class,
    exactly,
    exclusive_device,
    exclusive_slices,
    first_available,
    resource_slice,
)

Obj = dict[str, Any]
CLASSES = [device_class()]
UNKNOWN_KEY = f"device.attributes['{DRIVER}'].nosuch == 1"


def _pools(first_complete: bool = True, second_complete: bool = True) -> list[Obj]:
    """Pool ``a`` (gpu-0) and pool ``b`` (gpu-1); an incomplete pool lacks its second slice."""
    return [
        resource_slice("a", [exclusive_device(0)], pool="a", count=1 if first_complete else 2),
        resource_slice("b", [exclusive_device(1)], pool="b", count=1 if second_complete else 2),
    ]


def _version(device: Obj, version: str) -> Obj:
    device["attributes"][f"{DRIVER}/driverVersion"] = {"version": version}
    return device


def test_an_earlier_all_request_over_a_pool_being_updated_comes_before_a_missing_class() -> None:
    c = claim(
        "c",
        [
            exactly("all", all_mode=True),
            first_available("later", [{"name": "x", "deviceClassName": "missing"}]),
        ],
    )
    out = allocate(c, _pools(second_complete=False), CLASSES, node="n1")
    assert out.error == (
        "claim default/c, request all: asks for all devices, but resource pool "
        f"{DRIVER}/b is currently being updated"
    )


def test_a_missing_class_names_the_request_and_comes_before_the_search() -> None:
    c = claim(
        "c", [exactly("a", selectors=[UNKNOWN_KEY]), exactly("b", device_class_name="missing")]
    )
    out = allocate(c, exclusive_slices(1), CLASSES, node="n1")
    assert (
        out.error
        == "claim default/c, request b: could not retrieve device class missing: not found"
    )


def test_an_all_request_evaluates_its_selectors_pool_by_pool() -> None:
    c = claim("c", [exactly("all", all_mode=True, selectors=[UNKNOWN_KEY])])
    out = allocate(c, _pools(second_complete=False), CLASSES, node="n1")
    assert out.error is not None
    assert out.error.startswith(f"claim default/c: selector #0 on device {DRIVER}/a/gpu-0: ")
    assert "CEL runtime error" in out.error
    out = allocate(c, _pools(first_complete=False), CLASSES, node="n1")
    assert out.error is not None and "resource pool gpu.sharegpu.dev/a is currently" in out.error


def test_a_selector_of_an_all_request_fails_before_a_later_missing_class() -> None:
    c = claim(
        "c",
        [
            exactly("all", all_mode=True, selectors=[UNKNOWN_KEY]),
            exactly("b", device_class_name="missing"),
        ],
    )
    out = allocate(c, exclusive_slices(1), CLASSES, node="n1")
    assert out.error is not None and "CEL runtime error" in out.error


def test_the_result_limit_is_checked_request_by_request() -> None:
    c = claim(
        "c", [exactly("a", count=30), exactly("b", count=3), exactly("z", device_class_name="no")]
    )
    out = allocate(c, exclusive_slices(40), CLASSES, node="n1")
    assert out.error == (
        "claim default/c, request b: adding 3 devices exceeds the claim limit of 32, with 30 "
        "already accounted for"
    )


def test_an_all_device_breaking_a_constraint_stops_even_when_another_request_cannot_be_met() -> (
    None
):
    """gpu-1's version differs: the All request meets it and stops with an error, although the
    second request (three devices of one version out of two) could never be met."""
    devices = [_version(exclusive_device(i), v) for i, v in enumerate(["1.0.0", "2.0.0"])]
    c = claim(
        "c",
        [exactly("all", all_mode=True), exactly("three", count=3)],
        constraints=[{"matchAttribute": f"{DRIVER}/driverVersion"}],
    )
    out = allocate(c, [resource_slice("s", devices)], CLASSES, node="n1")
    assert out.error == (
        f"claim default/c, request all: cannot add device {DRIVER}/n1/gpu-1 because a claim "
        "constraint would not be satisfied"
    )


def _held_memory(device: str) -> Obj:
    """An allocated claim holding all memory (1Gi) of a shared ``device``."""
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "n1",
        "device": device,
        "shareID": "00000000-0000-4000-8000-000000000001",
        "consumedCapacity": {"memory": "1Gi"},
    }
    return {
        **claim("held", [exactly()]),
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def _shared_1gi(device: Obj) -> Obj:
    device["allowMultipleAllocations"] = True
    device["capacity"] = {"memory": {"value": "1Gi"}}
    return device


def test_an_all_device_is_checked_against_constraints_before_the_capacity_left() -> None:
    """gpu-1 is shared and another claim holds all its memory: the constraint it breaks is
    still what stops the allocation, as kube-scheduler checks capacity after constraints."""
    devices = [_version(exclusive_device(i), v) for i, v in enumerate(["1.0.0", "2.0.0"])]
    _shared_1gi(devices[1])
    c = claim(
        "c",
        [exactly("all", all_mode=True)],
        constraints=[{"matchAttribute": f"{DRIVER}/driverVersion"}],
    )
    out = allocate(c, [resource_slice("s", devices)], CLASSES, [_held_memory("gpu-1")], node="n1")
    assert out.error is not None and "cannot add device" in out.error


def test_a_selector_the_search_never_reaches_is_not_evaluated() -> None:
    """The All request keeps gpu-1, whose memory another claim holds, so the search fails on
    it before the second request, whose selector would fail on every device."""
    devices = [_shared_1gi(exclusive_device(0)), _shared_1gi(exclusive_device(1))]
    c = claim(
        "c",
        [
            exactly("all", all_mode=True, selectors=["device.allowMultipleAllocations"]),
            exactly("b", selectors=[UNKNOWN_KEY]),
        ],
    )
    out = allocate(c, [resource_slice("s", devices)], CLASSES, [_held_memory("gpu-1")], node="n1")
    assert not out.ok and out.error is None


def test_class_selectors_name_the_class_and_device_in_a_runtime_error() -> None:
    classes = [device_class(selectors=[UNKNOWN_KEY])]
    out = allocate(claim("c", [exactly()]), exclusive_slices(1), classes, node="n1")
    assert out.error is not None
    assert out.error.startswith(f"class {CLASS}: selector #0 on device {DRIVER}/n1/gpu-0: ")
