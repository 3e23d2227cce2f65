"""Table-driven tests of the ResourceSlice rules in sharegpu.kube.slicerules."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharegpu.kube import slicerules as sr

Obj = dict[str, Any]
DRIVER = "gpu.sharegpu.dev"


def device(name: str = "gpu-0", **extra: Any) -> Obj:
    dev: Obj = {
        "name": name,
        "attributes": {
            "uuid": {"string": "GPU-0000"},
            "index": {"int": 0},
            "driverVersion": {"version": "570.86.15"},
            "mig": {"bool": False},
            "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        },
        "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}},
    }
    dev.update(extra)
    return dev


def shared_device(name: str = "gpu-0") -> Obj:
    dev = device(name, allowMultipleAllocations=True)
    dev["capacity"] = {
        "memory": {
            "value": "80Gi",
            "requestPolicy": {
                "default": "1Gi",
                "validRange": {"min": "256Mi", "max": "80Gi", "step": "256Mi"},
            },
        },
        "cores": {
            "value": "100",
            "requestPolicy": {"default": "10", "validValues": ["10", "25", "50", "100"]},
        },
    }
    return dev


def good_slice(devices: list[Obj] | None = None, **spec_extra: Any) -> Obj:
    spec: Obj = {
        "driver": DRIVER,
        "pool": {"name": "node-1", "generation": 3, "resourceSliceCount": 1},
        "nodeName": "node-1",
        "devices": devices if devices is not None else [device("gpu-0"), device("gpu-1")],
    }
    spec.update(spec_extra)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-1-gpu.sharegpu.dev-abcde"},
        "spec": spec,
    }


def counter_slice(sets: list[Obj], **spec_extra: Any) -> Obj:
    obj = good_slice(devices=[], **spec_extra)
    del obj["spec"]["devices"]
    obj["spec"]["sharedCounters"] = sets
    return obj


def counter_set(name: str = "gpu-0-counters", **counters: str) -> Obj:
    counters = counters or {"memory": "80Gi", "cores": "100"}
    return {"name": name, "counters": {k: {"value": v} for k, v in counters.items()}}


def consuming_device(name: str, set_name: str = "gpu-0-counters", **counters: str) -> Obj:
    counters = counters or {"memory": "40Gi", "cores": "50"}
    return device(
        name,
        consumesCounters=[
            {"counterSet": set_name, "counters": {k: {"value": v} for k, v in counters.items()}}
        ],
    )


# --- predicates ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("gpu-0", True),
        ("a", True),
        ("0abc", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("-gpu", False),
        ("gpu-", False),
        ("GPU", False),
        ("gpu.0", False),
        ("", False),
        (3, False),
    ],
)
def test_is_dns_label(value: object, expected: bool) -> None:
    assert sr.is_dns_label(value) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("gpu.sharegpu.dev", True),
        ("node-1", True),
        (".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61]), True),
        (".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 62]), False),
        ("a..b", False),
        ("Upper.case", False),
        ("", False),
        ("x" * 254, False),
    ],
)
def test_is_dns_subdomain(value: str, expected: bool) -> None:
    assert sr.is_dns_subdomain(value) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("uuid", True),
        ("_x1", True),
        ("cudaComputeCapability", True),
        ("a" * 32, True),
        ("a" * 33, False),
        ("1abc", False),
        ("with-dash", False),
        ("", False),
    ],
)
def test_is_c_identifier(value: str, expected: bool) -> None:
    assert sr.is_c_identifier(value) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("memory", True),
        ("gpu.sharegpu.dev/uuid", True),
        ("resource.kubernetes.io/pciBusID", True),
        (f"{'d' * 63}/x", True),
        (f"{'d' * 64}/x", False),
        ("gpu.sharegpu.dev/" + "a" * 33, False),
        ("gpu.sharegpu.dev/bad-name", False),
        ("Bad.Domain/x", False),
        ("/x", False),
        ("a/b/c", False),
        ("bad-name", False),
    ],
)
def test_is_qualified_name(value: str, expected: bool) -> None:
    assert sr.is_qualified_name(value) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1.2.3", True),
        ("0.0.0", True),
        ("570.86.15", True),
        ("1.0.0-rc.1+build.5", True),
        ("1.0.0-alpha-1", True),
        ("v1.2.3", False),
        ("1.2", False),
        ("01.2.3", False),
        ("1.2.3-01", False),
        ("1.2.3.4", False),
        ("", False),
    ],
)
def test_is_strict_semver(value: str, expected: bool) -> None:
    assert sr.is_strict_semver(value) is expected


# --- valid slices pass -----------------------------------------------------------------------


def _max_devices() -> Obj:
    return good_slice(devices=[device(f"gpu-{i}") for i in range(sr.MAX_DEVICES_PER_SLICE)])


def _max_attributes() -> Obj:
    dev = device("gpu-0")
    dev["attributes"] = {f"a{i}": {"int": i} for i in range(30)}
    dev["capacity"] = {"memory": {"value": "1Gi"}, "cores": {"value": 100}}
    return good_slice(devices=[dev])


VALID: dict[str, Callable[[], Obj]] = {
    "node-local": good_slice,
    "shared device with policies": lambda: good_slice(devices=[shared_device()]),
    "128 devices": _max_devices,
    "64 tainted devices": lambda: good_slice(
        devices=[
            device(f"gpu-{i}", taints=[{"key": f"{DRIVER}/unhealthy", "effect": "NoSchedule"}])
            for i in range(sr.MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS)
        ]
    ),
    "32 attributes and capacities": _max_attributes,
    "64-char string and version": lambda: good_slice(
        devices=[
            device(
                "gpu-0",
                attributes={
                    "s": {"string": "x" * 64},
                    "v": {"version": "1.0.0-" + "a" * 58},
                },
            )
        ]
    ),
    "all nodes": lambda: {
        **good_slice(),
        "spec": {
            **{k: v for k, v in good_slice()["spec"].items() if k != "nodeName"},
            "allNodes": True,
        },
    },
    "node selector": lambda: {
        **good_slice(),
        "spec": {
            **{k: v for k, v in good_slice()["spec"].items() if k != "nodeName"},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            },
        },
    },
    "per-device node selection": lambda: {
        **good_slice(),
        "spec": {
            **{k: v for k, v in good_slice()["spec"].items() if k != "nodeName"},
            "perDeviceNodeSelection": True,
            "devices": [device("gpu-0", nodeName="node-1"), device("gpu-1", allNodes=True)],
        },
    },
    "counter slice": lambda: counter_slice(
        [counter_set("gpu-0-counters"), counter_set("gpu-1-counters")]
    ),
    "consuming devices": lambda: good_slice(
        devices=[consuming_device("gpu-0-half-0"), consuming_device("gpu-0-half-1")]
    ),
    "empty slice": lambda: good_slice(devices=[]),
    "generation zero": lambda: {
        **good_slice(),
        "spec": {
            **good_slice()["spec"],
            "pool": {"name": "a/b.c", "generation": 0, "resourceSliceCount": 2},
        },
    },
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_slices_pass(name: str) -> None:
    assert sr.validate_resource_slice(VALID[name]()) == []


# --- each rule violated fails with the field path --------------------------------------------


def _mutate(change: Callable[[Obj], None], base: Callable[[], Obj] = good_slice) -> Obj:
    obj = copy.deepcopy(base())
    change(obj)
    return obj


def _dev(obj: Obj, i: int = 0) -> Obj:
    d: Obj = obj["spec"]["devices"][i]
    return d


def _set_policy(obj: Obj, cap: str, policy: Obj) -> None:
    _dev(obj)["capacity"][cap]["requestPolicy"] = policy


def _shared() -> Obj:
    return good_slice(devices=[shared_device()])


INVALID: list[tuple[str, Obj, str]] = [
    (
        "duplicate device name",
        good_slice(devices=[device("gpu-0"), device("gpu-0")]),
        "spec.devices[1].name: Duplicate value",
    ),
    ("device name not a DNS label", good_slice(devices=[device("GPU_0")]), "spec.devices[0].name:"),
    (
        "device name missing",
        _mutate(lambda o: _dev(o).pop("name")),
        "spec.devices[0].name: Required",
    ),
    (
        "attribute with two values",
        _mutate(
            lambda o: _dev(o)["attributes"].update(
                {"gpu.sharegpu.dev/uuid": {"string": "a", "int": 1}}
            )
        ),
        "spec.devices[0].attributes[gpu.sharegpu.dev/uuid]: must have exactly one of int, bool, "
        "string, version",
    ),
    (
        "attribute with no value",
        _mutate(lambda o: _dev(o)["attributes"].update({"empty": {}})),
        "spec.devices[0].attributes[empty]: must have exactly one of",
    ),
    (
        "list attribute (gate off)",
        _mutate(lambda o: _dev(o)["attributes"].update({"ids": {"ints": [1, 2]}})),
        "spec.devices[0].attributes[ids]: ints: list-typed attributes",
    ),
    (
        "string too long",
        _mutate(lambda o: _dev(o)["attributes"].update({"uuid": {"string": "x" * 65}})),
        "spec.devices[0].attributes[uuid].string: Too long",
    ),
    (
        "version too long",
        _mutate(lambda o: _dev(o)["attributes"].update({"v": {"version": "1.0.0-" + "a" * 59}})),
        "spec.devices[0].attributes[v].version: Too long",
    ),
    (
        "version not strict semver",
        _mutate(lambda o: _dev(o)["attributes"].update({"driverVersion": {"version": "570.86"}})),
        "spec.devices[0].attributes[driverVersion].version: invalid version",
    ),
    (
        "attribute name not qualified",
        _mutate(lambda o: _dev(o)["attributes"].update({"bad-name": {"int": 1}})),
        "spec.devices[0].attributes[bad-name]: invalid attribute name",
    ),
    (
        "attribute qualified and unqualified",
        _mutate(lambda o: _dev(o)["attributes"].update({f"{DRIVER}/uuid": {"string": "x"}})),
        f"spec.devices[0].attributes[{DRIVER}/uuid]: Duplicate value",
    ),
    (
        "capacity name not qualified",
        _mutate(lambda o: _dev(o)["capacity"].update({"x/y/z": {"value": "1"}})),
        "spec.devices[0].capacity[x/y/z]: invalid capacity name",
    ),
    (
        "capacity without value",
        _mutate(lambda o: _dev(o)["capacity"].update({"memory": {}})),
        "spec.devices[0].capacity[memory].value: Required value",
    ),
    (
        "33 attributes and capacities",
        _mutate(lambda o: _dev(o)["attributes"].update({f"x{i}": {"int": i} for i in range(26)})),
        "spec.devices[0]: Too many: 33",
    ),
    (
        "129 devices",
        good_slice(devices=[device(f"gpu-{i}") for i in range(129)]),
        "spec.devices: Too many: 129: must have at most 128",
    ),
    (
        "65 devices with a taint",
        good_slice(
            devices=[device(f"gpu-{i}") for i in range(64)]
            + [device("gpu-64", taints=[{"key": "k", "effect": "NoExecute"}])]
        ),
        "spec.devices: Too many: 65: must have at most 64",
    ),
    (
        "65 devices consuming counters",
        good_slice(devices=[consuming_device(f"gpu-{i}") for i in range(65)]),
        "spec.devices: Too many: 65: must have at most 64",
    ),
    (
        "devices and sharedCounters together",
        good_slice(sharedCounters=[counter_set()]),
        "spec: devices and sharedCounters must not be set in the same ResourceSlice",
    ),
    (
        "no node selection",
        _mutate(lambda o: o["spec"].pop("nodeName")),
        "spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection",
    ),
    (
        "two node selections",
        good_slice(allNodes=True),
        "spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection is "
        "required (set: nodeName, allNodes)",
    ),
    (
        "allNodes false",
        _mutate(lambda o: (o["spec"].pop("nodeName"), o["spec"].update({"allNodes": False}))),
        "spec.allNodes: must be either unset or set to true",
    ),
    (
        "two node selector terms",
        _mutate(
            lambda o: (
                o["spec"].pop("nodeName"),
                o["spec"].update({"nodeSelector": {"nodeSelectorTerms": [{}, {}]}}),
            )
        ),
        "spec.nodeSelector.nodeSelectorTerms: must have exactly one node selector term",
    ),
    (
        "device node field without perDeviceNodeSelection",
        good_slice(devices=[device("gpu-0", nodeName="node-1")]),
        "spec.devices[0]: nodeName may only be set when spec.perDeviceNodeSelection is true",
    ),
    (
        "perDeviceNodeSelection device without node field",
        _mutate(
            lambda o: (
                o["spec"].pop("nodeName"),
                o["spec"].update({"perDeviceNodeSelection": True}),
            )
        ),
        "spec.devices[0]: exactly one of nodeName, nodeSelector, allNodes is required",
    ),
    (
        "requestPolicy without allowMultipleAllocations",
        _mutate(lambda o: _set_policy(o, "memory", {"default": "1Gi"})),
        "spec.devices[0].capacity[memory].requestPolicy: may only be set when "
        "allowMultipleAllocations is true",
    ),
    (
        "validValues without default",
        _mutate(lambda o: _set_policy(o, "cores", {"validValues": ["10"]}), _shared),
        "spec.devices[0].capacity[cores].requestPolicy.default: Required value",
    ),
    (
        "validValues not ascending",
        _mutate(
            lambda o: _set_policy(o, "cores", {"default": "10", "validValues": ["50", "10"]}),
            _shared,
        ),
        "spec.devices[0].capacity[cores].requestPolicy.validValues[1]: must be sorted",
    ),
    (
        "validValues missing the default",
        _mutate(
            lambda o: _set_policy(o, "cores", {"default": "20", "validValues": ["10", "50"]}),
            _shared,
        ),
        "spec.devices[0].capacity[cores].requestPolicy.default: must be one of validValues",
    ),
    (
        "validValues above the capacity",
        _mutate(
            lambda o: _set_policy(o, "cores", {"default": "10", "validValues": ["10", "200"]}),
            _shared,
        ),
        "spec.devices[0].capacity[cores].requestPolicy.validValues[1]: must be less than or equal",
    ),
    (
        "11 validValues",
        _mutate(
            lambda o: _set_policy(
                o, "cores", {"default": "1", "validValues": [str(i) for i in range(1, 12)]}
            ),
            _shared,
        ),
        "spec.devices[0].capacity[cores].requestPolicy.validValues: Too many: 11",
    ),
    (
        "validValues and validRange",
        _mutate(
            lambda o: _set_policy(
                o, "cores", {"default": "10", "validValues": ["10"], "validRange": {"min": "1"}}
            ),
            _shared,
        ),
        "spec.devices[0].capacity[cores].requestPolicy: validValues and validRange are mutually",
    ),
    (
        "validRange without min",
        _mutate(
            lambda o: _set_policy(o, "memory", {"default": "1Gi", "validRange": {"max": "2Gi"}}),
            _shared,
        ),
        "spec.devices[0].capacity[memory].requestPolicy.validRange.min: Required value",
    ),
    (
        "min + step above the capacity",
        _mutate(
            lambda o: _set_policy(
                o, "memory", {"default": "60Gi", "validRange": {"min": "60Gi", "step": "40Gi"}}
            ),
            _shared,
        ),
        "spec.devices[0].capacity[memory].requestPolicy.validRange.step: min + step must be",
    ),
    (
        "max off the step grid",
        _mutate(
            lambda o: _set_policy(
                o,
                "memory",
                {"default": "1Gi", "validRange": {"min": "1Gi", "max": "3000Mi", "step": "1Gi"}},
            ),
            _shared,
        ),
        "spec.devices[0].capacity[memory].requestPolicy.validRange.max: must be min plus a "
        "multiple of step",
    ),
    (
        "default off the step grid",
        _mutate(
            lambda o: _set_policy(
                o, "memory", {"default": "1500Mi", "validRange": {"min": "1Gi", "step": "1Gi"}}
            ),
            _shared,
        ),
        "spec.devices[0].capacity[memory].requestPolicy.default: must be min plus a multiple of "
        "step",
    ),
    (
        "default below min",
        _mutate(
            lambda o: _set_policy(o, "memory", {"default": "1Gi", "validRange": {"min": "2Gi"}}),
            _shared,
        ),
        "spec.devices[0].capacity[memory].requestPolicy.default: must be greater than or equal "
        "to min",
    ),
    (
        "max above the capacity",
        _mutate(
            lambda o: _set_policy(
                o, "memory", {"default": "1Gi", "validRange": {"min": "1Gi", "max": "81Gi"}}
            ),
            _shared,
        ),
        "spec.devices[0].capacity[memory].requestPolicy.validRange.max: must be less than or equal",
    ),
    (
        "three consumesCounters",
        good_slice(
            devices=[
                device(
                    "gpu-0",
                    consumesCounters=[
                        {"counterSet": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(3)
                    ],
                )
            ]
        ),
        "spec.devices[0].consumesCounters: Too many: 3: must have at most 2",
    ),
    (
        "consumesCounters naming one set twice",
        good_slice(
            devices=[
                device(
                    "gpu-0",
                    consumesCounters=[
                        {"counterSet": "s", "counters": {"c": {"value": "1"}}} for _ in range(2)
                    ],
                )
            ]
        ),
        "spec.devices[0].consumesCounters[1].counterSet: Duplicate value",
    ),
    (
        "17 taints",
        good_slice(
            devices=[
                device(
                    "gpu-0", taints=[{"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)]
                )
            ]
        ),
        "spec.devices[0].taints: Too many: 17: must have at most 16",
    ),
    (
        "bad taint effect",
        good_slice(devices=[device("gpu-0", taints=[{"key": "k", "effect": "PreferNoSchedule"}])]),
        "spec.devices[0].taints[0].effect: Unsupported value: 'PreferNoSchedule'",
    ),
    (
        "taint without key",
        good_slice(devices=[device("gpu-0", taints=[{"effect": "NoSchedule"}])]),
        "spec.devices[0].taints[0].key: Required value",
    ),
    (
        "five binding conditions",
        good_slice(devices=[device("gpu-0", bindingConditions=[f"c{i}" for i in range(5)])]),
        "spec.devices[0].bindingConditions: Too many: 5",
    ),
    (
        "nine counter sets",
        counter_slice([counter_set(f"set-{i}") for i in range(9)]),
        "spec.sharedCounters: Too many: 9: must have at most 8",
    ),
    (
        "33 counters in a set",
        counter_slice([counter_set("set-0", **{f"c{i}": "1" for i in range(33)})]),
        "spec.sharedCounters[0].counters: Too many: 33",
    ),
    (
        "duplicate counter set",
        counter_slice([counter_set("set-0"), counter_set("set-0")]),
        "spec.sharedCounters[1].name: Duplicate value",
    ),
    (
        "counter set name not a DNS label",
        counter_slice([counter_set("Set_0")]),
        "spec.sharedCounters[0].name: invalid counter set name",
    ),
    (
        "counter set without counters",
        counter_slice([{"name": "set-0", "counters": {}}]),
        "spec.sharedCounters[0].counters: Required value",
    ),
    (
        "pool name with empty segment",
        _mutate(lambda o: o["spec"]["pool"].update({"name": "a//b"})),
        "spec.pool.name: invalid pool name",
    ),
    (
        "pool name too long",
        _mutate(lambda o: o["spec"]["pool"].update({"name": "/".join(["a" * 60] * 5)})),
        "spec.pool.name: invalid pool name",
    ),
    (
        "negative generation",
        _mutate(lambda o: o["spec"]["pool"].update({"generation": -1})),
        "spec.pool.generation: must be an integer >= 0",
    ),
    (
        "zero resourceSliceCount",
        _mutate(lambda o: o["spec"]["pool"].update({"resourceSliceCount": 0})),
        "spec.pool.resourceSliceCount: must be an integer > 0",
    ),
    ("missing pool", _mutate(lambda o: o["spec"].pop("pool")), "spec.pool: Required value"),
    (
        "bad driver name",
        _mutate(lambda o: o["spec"].update({"driver": "GPU.example"})),
        "spec.driver: invalid driver name",
    ),
    (
        "driver name longer than 63",
        _mutate(lambda o: o["spec"].update({"driver": "a" * 30 + "." + "b" * 33})),
        "spec.driver: invalid driver name",
    ),
    ("missing driver", _mutate(lambda o: o["spec"].pop("driver")), "spec.driver: Required value"),
]


@pytest.mark.parametrize(
    ("obj", "expected"), [(o, e) for _, o, e in INVALID], ids=[n for n, _, _ in INVALID]
)
def test_each_rule_violation_is_reported_with_its_path(obj: Obj, expected: str) -> None:
    messages = sr.validate_resource_slice(obj)
    assert any(m.startswith(expected) for m in messages), messages


def test_validation_never_raises_on_garbage() -> None:
    for obj in [
        {},
        {"spec": None},
        {"spec": {"devices": "x", "pool": []}},
        {"spec": {"devices": [1]}},
    ]:
        messages = sr.validate_resource_slice(obj)
        assert messages, obj


# --- pools ---------------------------------------------------------------------------------


def pool_slice(name: str, generation: int, count: int, **spec: Any) -> Obj:
    obj = good_slice(devices=[])
    obj["metadata"]["name"] = name
    obj["spec"]["pool"] = {"name": "node-1", "generation": generation, "resourceSliceCount": count}
    del obj["spec"]["devices"]
    obj["spec"].update(spec)
    return obj


def test_valid_partitioned_pool() -> None:
    slices = [
        pool_slice("s-counters", 1, 2, sharedCounters=[counter_set("gpu-0-counters")]),
        pool_slice(
            "s-devices",
            1,
            2,
            devices=[consuming_device("gpu-0-half-0"), consuming_device("gpu-0-half-1")],
        ),
    ]
    assert sr.validate_pool(slices) == []


def test_pool_duplicate_device_across_slices() -> None:
    slices = [
        pool_slice("a", 2, 2, devices=[device("gpu-0")]),
        pool_slice("b", 2, 2, devices=[device("gpu-0")]),
    ]
    messages = sr.validate_pool(slices)
    assert any(
        m.startswith("slices[1](b).spec.devices[0].name: Duplicate value in pool") for m in messages
    )


def test_pool_old_generation_is_ignored() -> None:
    slices = [
        pool_slice("old", 1, 1, devices=[device("gpu-0")]),
        pool_slice("new", 2, 1, devices=[device("gpu-0")]),
    ]
    assert sr.validate_pool(slices) == []
    assert [s["metadata"]["name"] for s in sr.newest_generation(slices)] == ["new"]


def test_pool_duplicate_counter_set() -> None:
    slices = [
        pool_slice("a", 0, 2, sharedCounters=[counter_set("c")]),
        pool_slice("b", 0, 2, sharedCounters=[counter_set("c")]),
    ]
    assert any(
        "spec.sharedCounters[0].name: Duplicate value in pool" in m
        for m in sr.validate_pool(slices)
    )


def test_pool_missing_counter_set_and_counter() -> None:
    slices = [
        pool_slice("a", 0, 2, sharedCounters=[counter_set("c", memory="1Gi")]),
        pool_slice(
            "b",
            0,
            2,
            devices=[
                consuming_device("d0", "nope"),
                consuming_device("d1", "c", memory="1Gi", cores="1"),
            ],
        ),
    ]
    messages = sr.validate_pool(slices)
    assert any(
        m.startswith(
            "slices[1](b).spec.devices[0].consumesCounters[0].counterSet: counter set 'nope'"
        )
        for m in messages
    ), messages
    assert any(
        m.startswith(
            "slices[1](b).spec.devices[1].consumesCounters[0].counters[cores]: counter 'cores'"
        )
        for m in messages
    ), messages
    assert len(messages) == 2


def test_pool_disagreeing_slice_counts_and_pools() -> None:
    a = pool_slice("a", 0, 2)
    b = pool_slice("b", 0, 3)
    b["spec"]["pool"]["name"] = "other"
    messages = sr.validate_pool([a, b])
    assert any("resourceSliceCount" in m for m in messages)
    assert any("must all belong to one driver and pool" in m for m in messages)


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_slices_also_pass_the_official_schema(name: str) -> None:
    from sharegpuctl.local.apiserver.validation import schema_validator

    assert schema_validator("resource.k8s.io/v1", "ResourceSlice")(VALID[name]()) == []


@given(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), min_size=0, max_size=100)
)
def test_string_attribute_length_limit(value: str) -> None:
    obj = good_slice(devices=[device("gpu-0", attributes={"s": {"string": value}})])
    messages = sr.validate_resource_slice(obj)
    assert (messages == []) == (len(value) <= sr.MAX_STRING_ATTRIBUTE_LENGTH)


@given(
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=0, max_value=10**6),
)
def test_numeric_semver_is_strict(major: int, minor: int, patch: int) -> None:
    assert sr.is_strict_semver(f"{major}.{minor}.{patch}")
    assert not sr.is_strict_semver(f"v{major}.{minor}.{patch}")
    assert not sr.is_strict_semver(f"{major}.{minor}")
    assert not sr.is_strict_semver(f"0{major + 1}.{minor}.{patch}")


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=160))
def test_device_count_limits(count: int) -> None:
    plain = good_slice(devices=[device(f"gpu-{i}") for i in range(count)])
    assert (sr.validate_resource_slice(plain) == []) == (count <= sr.MAX_DEVICES_PER_SLICE)
    tainted = good_slice(
        devices=[
            device(f"gpu-{i}", taints=[{"key": "k", "effect": "NoSchedule"}]) for i in range(count)
        ]
    )
    assert (sr.validate_resource_slice(tainted) == []) == (
        count <= sr.MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
    )


def test_string_attribute_limit_counts_utf8_bytes_like_the_api_server() -> None:
    # 40 characters, 80 bytes: the API server (Go's len) counts bytes.
    value = "é" * 40
    obj = good_slice(devices=[device("gpu-0", attributes={"s": {"string": value}})])
    assert sr.validate_resource_slice(obj) == [
        "spec.devices[0].attributes[s].string: Too long: may not be more than 64 bytes (got 80)"
    ]
    assert sr.truncate_utf8(value, 64) == "é" * 32
    assert sr.truncate_utf8("a" + "é" * 40, 64) == "a" + "é" * 31


@pytest.mark.parametrize(
    ("extra", "lower"),
    [
        ({}, False),
        ({"taints": [{"key": "k", "effect": "NoSchedule"}]}, True),
        ({"taints": []}, False),
        ({"consumesCounters": [{"counterSet": "gpu-0", "counters": {}}]}, True),
        ({"attributes": {"ids": {"ints": [1, 2]}}}, True),
        ({"attributes": {"ok": {"bools": [True]}}}, True),
        ({"attributes": {"names": {"strings": ["a"]}}}, True),
        ({"attributes": {"vs": {"versions": ["1.0.0"]}}}, True),
        ({"attributes": {"one": {"int": 1}, "s": {"string": "x"}}}, False),
        ({"attributes": "junk"}, False),
    ],
)
def test_which_devices_take_the_lower_device_limit(extra: Obj, lower: bool) -> None:
    """Taints, consumesCounters and list-typed attributes (k8s.io/api v0.37
    ``ResourceSliceMaxDevicesWithAdvancedFeatures``) lower the limit of the device's slice; the
    node plugin packs its slices by the same :func:`sr.device_limit`."""
    dev = device("gpu-0", **extra)
    assert sr.takes_lower_device_limit(dev) is lower
    want = sr.MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS if lower else sr.MAX_DEVICES_PER_SLICE
    assert sr.device_limit([device("gpu-1"), dev]) == want
    assert sr.device_limit([]) == sr.MAX_DEVICES_PER_SLICE
    assert not sr.takes_lower_device_limit("junk")


def test_a_list_attribute_lowers_the_device_limit_the_validator_reports() -> None:
    devices = [
        device(f"gpu-{i}") for i in range(sr.MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS + 1)
    ]
    devices[0]["attributes"]["ids"] = {"ints": [1, 2]}
    msgs = sr.validate_resource_slice(good_slice(devices=devices))
    assert (
        "spec.devices: Too many: 65: must have at most 64 items when a device has taints, "
        "consumesCounters or list-typed attributes" in msgs
    )
