"""The ``device`` variable: domain resolution, typed attributes, capacities, missing keys."""

from __future__ import annotations

import pytest

from api import names
from sharegpu.cel import CelEvalError, Quantity, Semver, compile_selector, device_activation

D = names.DEFAULT_DRIVER_NAME

SLICE_DEVICE = {
    "name": "gpu-0",
    "attributes": {
        "uuid": {"string": "GPU-1234"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "index": {"int": 0},
        "driverVersion": {"version": "580.159.4"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "healthy": {"bool": True},
        f"{D}/qualifiedOwn": {"string": "own"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
    },
    "capacity": {"memory": {"value": "81079Mi"}, "cores": {"value": "100"}},
    "allowMultipleAllocations": True,
}


@pytest.fixture(scope="module")
def device() -> dict[str, object]:
    return device_activation(D, SLICE_DEVICE)


def ev(expression: str, device: dict[str, object]) -> bool:
    return compile_selector(expression).evaluate(device)


def test_activation_shape(device: dict[str, object]) -> None:
    attrs = device["attributes"]
    assert isinstance(attrs, dict)
    assert attrs[D]["uuid"] == "GPU-1234"
    assert attrs[D]["qualifiedOwn"] == "own"
    assert isinstance(attrs[D]["driverVersion"], Semver)
    assert attrs["resource.kubernetes.io"]["pcieRoot"] == "pci0000:00"
    caps = device["capacity"]
    assert isinstance(caps, dict)
    assert isinstance(caps[D]["memory"], Quantity)
    assert device["allowMultipleAllocations"] is True


@pytest.mark.parametrize(
    "expression",
    [
        f"device.driver == '{D}'",
        f"device.attributes['{D}'].uuid == 'GPU-1234'",
        f"device.attributes['{D}'].productName.startsWith('NVIDIA H100')",
        f"device.attributes['{D}'].index == 0",
        f"device.attributes['{D}'].healthy",
        f"device.attributes['{D}'].qualifiedOwn == 'own'",
        "device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:00'",
        f"device.attributes['{D}'].driverVersion.isGreaterThan(semver('550.0.0'))",
        f"device.attributes['{D}'].cudaComputeCapability.major() >= 9",
        f"device.attributes['{D}'].driverVersion == semver('580.159.4')",
        f"device.capacity['{D}'].memory.compareTo(quantity('40Gi')) >= 0",
        f"device.capacity['{D}'].cores.asInteger() == 100",
        "device.allowMultipleAllocations",
        "device.attributes['unknown.example.com'].size() == 0",
        "!('x' in device.attributes['unknown.example.com'])",
        f"!('numaNode' in device.attributes['{D}'])",
        f"'uuid' in device.attributes['{D}']",
        f"has(device.attributes['{D}'].uuid)",
        f"!has(device.attributes['{D}'].numaNode)",
        f"'{D}' in device.attributes && !('other.io' in device.attributes)",
        f"!('numaNode' in device.attributes['{D}']) || device.attributes['{D}'].numaNode == 0",
        f"device.attributes['{D}'].exists(k, k == 'uuid')",
    ],
)
def test_device_expressions(expression: str, device: dict[str, object]) -> None:
    assert ev(expression, device) is True


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (f"device.attributes['{D}'].numaNode == 0", "no such key: numaNode"),
        (f"device.attributes['{D}'].productNam == 'x'", "no such key: productNam"),
        ("device.attributes['other.io'].x == 1", "no such key: x"),
        (f"device.capacity['{D}'].gpuMemory.compareTo(quantity('1Gi')) > 0", "gpuMemory"),
        (f"device.attributes['{D}'].uuid == 1 || device.attributes['{D}'].x", "no such key"),
        (f"device.attributes['{D}'].productName.major() == 1", "no such overload"),
    ],
)
def test_missing_keys_error_like_kubernetes(
    expression: str, message: str, device: dict[str, object]
) -> None:
    with pytest.raises(CelEvalError, match=message):
        ev(expression, device)


@pytest.mark.parametrize(
    "expression",
    [
        f"!(device.attributes['{D}'].numaNode in [])",
        f"device.attributes['{D}'].numaNode in [] ? false : true",
        "!((1 / 0) in [])",
    ],
)
def test_membership_in_a_constant_empty_list_is_false_without_the_left_operand(
    expression: str, device: dict[str, object]
) -> None:
    # Kubernetes plans ``x in []`` as the constant false; a non-constant or non-empty list
    # still evaluates x (below).
    assert ev(expression, device) is True


@pytest.mark.parametrize(
    "expression",
    [
        f"device.attributes['{D}'].numaNode in [1]",
        f"device.attributes['{D}'].numaNode in {{}}",
        f"device.attributes['{D}'].numaNode in dyn([])",
        f"device.attributes['{D}'].numaNode in [].map(x, x)",
    ],
)
def test_membership_in_any_other_list_evaluates_the_left_operand(
    expression: str, device: dict[str, object]
) -> None:
    with pytest.raises(CelEvalError, match="no such key: numaNode"):
        ev(expression, device)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # a lookup finds an unknown domain (its empty default), as Kubernetes' map does
        ("device.attributes[?'other.io'].hasValue()", True),
        ("device.capacity[?'other.io'].hasValue()", True),
        ("device.attributes.?other.hasValue()", True),
        ("has(device.attributes.other)", True),
        ("dyn(device.attributes)[?'other.io'].value().size() == 0", True),
        ("optional.of(device.attributes)[?'other.io'].hasValue()", True),
        ("device.attributes[?'other.io'].hasValue() && 1 / 0 == 1", None),
        # membership, size and names inside a domain stay exact
        ("'other.io' in device.attributes", False),
        ("device.attributes.exists(k, k == 'other.io')", False),
        ("device.attributes[?'other.io'][?'x'].hasValue()", False),
        (f"device.attributes['{D}'].?numaNode.hasValue()", False),
    ],
)
def test_lookups_find_an_unknown_domain(
    expression: str, expected: bool | None, device: dict[str, object]
) -> None:
    if expected is None:
        with pytest.raises(CelEvalError, match="division by zero"):
            ev(expression, device)
    else:
        assert ev(expression, device) is expected


def test_missing_key_is_named_on_the_error(device: dict[str, object]) -> None:
    with pytest.raises(CelEvalError) as info:
        ev(f"device.attributes['{D}'].productNam == 'x'", device)
    assert info.value.missing_key == "productNam"


def test_device_without_flag_defaults_to_exclusive() -> None:
    dev = device_activation(D, {"name": "gpu-1"})
    assert ev("!device.allowMultipleAllocations", dev)
    assert ev(f"device.attributes['{D}'].size() == 0", dev)


def test_malformed_version_attribute_is_an_evaluation_error() -> None:
    with pytest.raises(CelEvalError, match="semver"):
        device_activation(D, {"name": "x", "attributes": {"v": {"version": "1.2"}}})
