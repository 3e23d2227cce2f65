"""Measured usage from the claims' status.devices into the GPU objects."""

from __future__ import annotations

from typing import Any

from api import names
from api.gpu import GpuObject
from controller.reconcile import reconcile
from controller.records import claim_record
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.slices import desired_slices, resource_slice_objects
from kubeletplugin.devices.table import node_devices

DRIVER = names.DEFAULT_DRIVER_NAME


def slices() -> list[dict[str, Any]]:
    gpus = MockBackend("node-a", 1).discover()
    objs = resource_slice_objects(
        desired_slices(node_devices(gpus, names.SHARING_MODE_CONSUMABLE)), DRIVER, "node-a", None, 1
    )
    for i, o in enumerate(objs):
        o["metadata"] = {"name": f"s-{i}"}
    return objs


def claim(name: str, sid: str, data: Any) -> dict[str, Any]:
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "node-a",
        "device": "gpu-0",
        "shareID": sid,
        "consumedCapacity": {"cores": "30", "memory": "10Gi"},
    }
    entry = {"driver": DRIVER, "pool": "node-a", "device": "gpu-0", "shareID": sid, "data": data}
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "status": {"allocation": {"devices": {"results": [result]}}, "devices": [entry]},
    }


def usage(memory: str, over: list[str] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"kind": "ShareUsage", "usedMemory": memory, "processes": 1}
    if over is not None:
        data["overcommitted"] = over
    return data


def gpu(claims: list[dict[str, Any]]) -> GpuObject:
    return next(iter(reconcile(slices(), claims, [], DRIVER).values()))


def test_usage_and_overcommitted_condition() -> None:
    obj = gpu([claim("a", "s-a", usage("12Gi", ["memory"])), claim("b", "s-b", usage("1Gi"))])
    allocs = {a.claim_name: a for a in obj.status.allocations}
    assert allocs["a"].usage is not None and allocs["a"].usage.used_memory == "12Gi"
    assert allocs["a"].usage.overcommitted == ["memory"]
    assert allocs["b"].usage is not None and allocs["b"].usage.sm_utilization is None
    assert obj.status.conditions is not None
    (cond,) = obj.status.conditions
    assert (cond.type, cond.status, cond.reason) == (
        "Overcommitted",
        "True",
        "UsageExceedsReservation",
    )
    assert "ml/a (memory)" in cond.message and "ml/b" not in cond.message


def test_within_reservation_and_unmeasured() -> None:
    (cond,) = gpu([claim("a", "s-a", usage("1Gi"))]).status.conditions or []
    assert cond.status == "False"
    # No measurement at all: no usage, no condition (objects stay as before).
    plain = gpu([claim("a", "s-a", {"kind": "Other"})])
    assert plain.status.conditions is None and plain.status.allocations[0].usage is None
    assert "conditions" not in plain.manifest()["status"]


def test_hostile_usage_data_is_ignored() -> None:
    for data in (
        "text",
        {"kind": "ShareUsage", "usedMemory": "lots", "processes": 1},
        {"kind": "ShareUsage", "usedMemory": "1Gi", "processes": True},
        {"kind": "ShareUsage", "usedMemory": "1Gi", "processes": -1},
    ):
        record = claim_record(claim("a", "s-a", data), DRIVER)
        assert record is not None and record.results[0].usage is None
    odd = {**usage("1Gi", ["memory", "disk", 3]), "smUtilization": 900, "sampledAt": "x" * 999}
    record = claim_record(claim("a", "s-a", odd), DRIVER)
    assert record is not None and record.results[0].usage is not None
    u = record.results[0].usage
    assert (u.sm_utilization, u.sampled_at, u.overcommitted) == (None, None, ())


def mps_usage(outside: int | None, pods: list[str] | None = None) -> dict[str, Any]:
    data = usage("3Gi")
    if outside is not None:
        data["processesOutsideMPS"] = outside
    if pods is not None:
        data["escapedPods"] = pods
    return data


def conditions(obj: GpuObject) -> dict[str, Any]:
    return {c.type: c for c in obj.status.conditions or []}


def test_mps_escaped_condition_names_the_claims_whose_pods_escaped() -> None:
    # Each share reports its own escapes: the GPU's count is their sum.
    obj = gpu([claim("a", "s-a", mps_usage(2, ["pod-1"])), claim("b", "s-b", mps_usage(1, ["p"]))])
    cond = conditions(obj)[names.CONDITION_MPS_ESCAPED]
    assert (cond.status, cond.reason) == ("True", "ProcessOutsideMPS")
    assert cond.message.startswith("3 compute processes outside MPS get the whole GPU")
    assert cond.message.endswith("pods of claims: ml/a (1 pod), ml/b (1 pod)")
    allocs = {a.claim_name: a for a in obj.status.allocations}
    a_usage = allocs["a"].usage
    assert a_usage is not None
    assert (a_usage.processes_outside_mps, a_usage.escaped_pods) == (2, ["pod-1"])
    assert obj.manifest()["status"]["allocations"][0]["usage"]["processesOutsideMPS"] == 2
    # A share's process of no known pod: still True, no claim named.
    (other,) = [
        c
        for c in (gpu([claim("a", "s-a", mps_usage(1))]).status.conditions or [])
        if c.type == names.CONDITION_MPS_ESCAPED
    ]
    assert other.status == "True" and "claims" not in other.message


def test_mps_escaped_condition_false_or_absent() -> None:
    cond = conditions(gpu([claim("a", "s-a", mps_usage(0))]))[names.CONDITION_MPS_ESCAPED]
    assert (cond.status, cond.reason) == ("False", "AllProcessesInMPS")
    # Not judged (no MPS share, or escapes could not be told): no condition.
    assert names.CONDITION_MPS_ESCAPED not in conditions(gpu([claim("a", "s-a", mps_usage(None))]))


def test_hostile_escape_fields_are_bounded_or_dropped() -> None:
    odd = {**usage("1Gi"), "processesOutsideMPS": -3, "escapedPods": ["x" * 100, 7, "p", "p"]}
    record = claim_record(claim("a", "s-a", odd), DRIVER)
    assert record is not None and record.results[0].usage is not None
    assert (record.results[0].usage.outside_mps, record.results[0].usage.escaped_pods) == (
        None,
        ("p",),
    )
    many = {
        **usage("1Gi"),
        "processesOutsideMPS": True,
        "escapedPods": [f"p{i}" for i in range(999)],
    }
    record = claim_record(claim("a", "s-a", many), DRIVER)
    assert record is not None and record.results[0].usage is not None
    assert record.results[0].usage.outside_mps is None
    assert len(record.results[0].usage.escaped_pods) == 256
