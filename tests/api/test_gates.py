"""The feature gate table: defaults by version and where gated fields sit."""

from __future__ import annotations

from api import gates


def test_defaults_by_version() -> None:
    capacity = gates.GATES[gates.CONSUMABLE_CAPACITY]
    assert capacity.stage((1, 33)) is None
    assert not capacity.enabled((1, 33), override=True)  # no such field yet
    assert not capacity.enabled((1, 35))
    assert capacity.enabled((1, 35), override=True)
    assert capacity.enabled((1, 36))
    assert not capacity.enabled((1, 37), override=False)
    for name in (
        gates.OPTIONAL_NODE_OPERATIONS,
        gates.PARTITIONABLE_DEVICES_TYPE,
        gates.COMPATIBILITY_GROUPS,
        gates.DERIVED_ATTRIBUTES,
    ):
        gate = gates.GATES[name]
        assert not gate.enabled((1, 37)), name
        assert gate.stage((1, 36)) is None, name


def test_history_text() -> None:
    assert gates.GATES[gates.CONSUMABLE_CAPACITY].history() == (
        "alpha and off by default in 1.34 and 1.35, beta and on by default from 1.36"
    )
    assert gates.GATES[gates.DEVICE_TAINTS].history() == (
        "alpha and off by default in 1.33 to 1.35, beta and on by default in 1.36, "
        "GA and on by default from 1.37"
    )
    assert gates.GATES[gates.DERIVED_ATTRIBUTES].history() == "alpha and off by default from 1.37"


def test_present_finds_list_items_and_map_values_and_skips_empty_or_odd_shapes() -> None:
    slice_obj = {
        "kind": "ResourceSlice",
        "spec": {
            "sharedCounters": [],
            "devices": [
                {"name": "a", "capacity": {"cores": {"value": "100", "requestPolicy": {}}}},
                {
                    "name": "b",
                    "allowMultipleAllocations": True,
                    "capacity": {"memory": {"value": "1", "requestPolicy": {"default": "1"}}},
                    "consumesCounters": [{"counterSet": "s", "compatibilityGroups": ["x"]}],
                },
                "not a device",
            ],
        },
    }
    found = [(path, f.gate) for path, f in gates.gated_fields(slice_obj)]
    assert found == [
        ("spec.devices[1].consumesCounters[0].compatibilityGroups", gates.COMPATIBILITY_GROUPS),
        ("spec.devices[1].allowMultipleAllocations", gates.CONSUMABLE_CAPACITY),
        ("spec.devices[1].capacity[memory].requestPolicy", gates.CONSUMABLE_CAPACITY),
        ("spec.devices[1].consumesCounters", gates.PARTITIONABLE_DEVICES),
    ]
    assert list(gates.gated_fields({"kind": "ConfigMap", "spec": slice_obj["spec"]})) == []
