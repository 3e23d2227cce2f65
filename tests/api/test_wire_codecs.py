"""The fast dict codecs of the wire objects agree with the pydantic models on random values: what
they write the model accepts and writes back unchanged, what they read is what was written, and
what the model refuses the strict reader refuses too, naming the same field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from api.gpu import Allocation, GpuSpec, GpuStatus, ShareUsage
from api.gpustatus import allocation_json, gpu_spec_json, gpu_status_json
from api.names import GROUP_VERSION, OVERCOMMIT_RESOURCES, SHARE_USAGE_KIND, SHARING_MODES
from api.quantity import quantity_int
from api.shareusage import (
    MAX_ESCAPED_PODS,
    MeasuredUsage,
    UsageError,
    read_usage,
    read_usage_data,
    usage_data,
    usage_json,
)
from controller.reconcile import Alloc, GpuHardware

_names = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)
_bytes = st.integers(min_value=0, max_value=2**50)
_over = st.lists(st.sampled_from(OVERCOMMIT_RESOURCES), unique=True).map(
    lambda names: tuple(r for r in OVERCOMMIT_RESOURCES if r in names)
)

usages = st.builds(
    MeasuredUsage,
    used_memory=_bytes,
    sm_utilization=st.none() | st.integers(0, 100),
    processes=st.integers(0, 1000),
    sampled_at=st.none() | st.just("2026-01-02T03:04:05Z"),
    overcommitted=_over,
    outside_mps=st.none() | st.integers(0, 50),
    escaped_pods=st.lists(_names, unique=True, max_size=5).map(lambda u: tuple(sorted(u))),
)


def _written_by_model(model_out: Any, written: Any) -> Any:
    """``model_out`` with the empty lists the codec leaves out removed (the model writes an
    absent list as ``[]``); any other key the codec did not write stays, so it fails the
    comparison."""
    if isinstance(model_out, dict) and isinstance(written, dict):
        return {
            k: _written_by_model(v, written.get(k))
            for k, v in model_out.items()
            if k in written or v != []
        }
    if isinstance(model_out, list) and isinstance(written, list) and len(model_out) == len(written):
        return [_written_by_model(m, w) for m, w in zip(model_out, written, strict=True)]
    return model_out


def _agrees(model: type[ShareUsage | GpuSpec | Allocation | GpuStatus], written: Any) -> None:
    assert _written_by_model(model.model_validate(written).to_json_dict(), written) == written


def _path(error: ValidationError) -> str:
    """The first error's location written as the strict reader writes a path."""
    out = ""
    for part in error.errors()[0]["loc"]:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


@given(usages)
@settings(max_examples=200, deadline=None)
def test_usage_codec_agrees_with_the_model_and_reads_back(u: MeasuredUsage) -> None:
    written = usage_json(u)
    _agrees(ShareUsage, written)
    model = ShareUsage.model_validate(written)
    assert quantity_int(model.used_memory) == u.used_memory
    assert (model.processes, model.sm_utilization, model.processes_outside_mps) == (
        u.processes,
        u.sm_utilization,
        u.outside_mps,
    )
    assert (tuple(model.overcommitted), tuple(model.escaped_pods)) == (
        u.overcommitted,
        u.escaped_pods,
    )
    assert read_usage(written) == u
    data = usage_data(u)
    assert data["apiVersion"] == GROUP_VERSION and data["kind"] == SHARE_USAGE_KIND
    assert read_usage(data) == u
    assert read_usage_data(data) == u


#: Values of the wrong type or out of range for each field, that the model refuses.
_BAD: dict[str, list[Any]] = {
    "usedMemory": [3, None, ["1Gi"]],
    "processes": [-1, "x", 1.5, None, [1]],
    "smUtilization": [101, -1, "x", 2.5],
    "sampledAt": [7, ["t"]],
    "overcommitted": ["memory", ["disk"], [1]],
    "processesOutsideMPS": [-3, "x"],
    "escapedPods": ["p", [3], ["p"] * (MAX_ESCAPED_PODS + 1)],
    "unknownField": [1],
}


@given(usages, st.sampled_from(sorted(_BAD)), st.data())
@settings(max_examples=200, deadline=None)
def test_bad_usage_is_refused_by_both_with_the_same_field_path(
    u: MeasuredUsage, field: str, data: st.DataObject
) -> None:
    bad = {**usage_json(u), field: data.draw(st.sampled_from(_BAD[field]))}
    with pytest.raises(ValidationError) as model_error:
        ShareUsage.model_validate(bad)
    with pytest.raises(UsageError) as codec_error:
        read_usage(bad, "status.allocations[0].usage.")
    assert codec_error.value.path == "status.allocations[0].usage." + _path(model_error.value)
    assert codec_error.value.path in str(codec_error.value)


def test_a_memory_that_is_no_quantity_is_refused_with_its_path() -> None:
    with pytest.raises(UsageError, match=r"^data\.usedMemory: .*'lots'"):
        read_usage({"usedMemory": "lots", "processes": 1}, "data.")
    with pytest.raises(UsageError, match=r"^data\.kind: must be ShareUsage"):
        read_usage({"kind": "Other", "usedMemory": "1Gi", "processes": 1}, "data.")


_pods = st.lists(
    st.tuples(_names, _names, st.lists(_names, max_size=3).map(tuple)), max_size=3
).map(tuple)
allocs = st.builds(
    Alloc,
    gpu=st.just("n-gpu-0"),
    claim_namespace=_names,
    claim_name=_names,
    claim_uid=_names,
    request=_names,
    device=_names,
    share_id=st.none() | _names,
    cores=st.integers(0, 100),
    memory=_bytes,
    pods=_pods,
    usage=st.none() | usages,
)
hardware = st.builds(
    GpuHardware,
    name=st.just("n-gpu-0"),
    node=_names,
    pool=_names,
    index=st.integers(0, 64),
    uuid=_names,
    model=_names,
    memory=_bytes,
    cores=st.integers(0, 100),
    sharing_mode=st.sampled_from(SHARING_MODES),
    devices=st.lists(_names, max_size=4).map(tuple),
    unhealthy_reason=st.none() | _names,
    taints=st.lists(
        st.tuples(_names, _names, _names, st.just("NoSchedule"), st.none() | _names), max_size=3
    ).map(tuple),
)
_condition = st.fixed_dictionaries(
    {"type": _names, "status": st.sampled_from(["True", "False"]), "reason": _names}
)


@given(hardware, st.lists(allocs, max_size=4), st.lists(_condition, max_size=2), _bytes)
@settings(max_examples=150, deadline=None)
def test_gpu_codec_agrees_with_the_model(
    hw: GpuHardware, allocations: list[Alloc], conditions: list[dict[str, Any]], used: int
) -> None:
    spec = gpu_spec_json(hw)
    _agrees(GpuSpec, spec)
    for a in allocations:
        entry = allocation_json(a)
        _agrees(Allocation, entry)
    status = gpu_status_json(
        capacity=(hw.cores, hw.memory),
        allocated=(sum(a.cores for a in allocations), used),
        allocations=[allocation_json(a) for a in allocations],
        claim_count=len({a.claim_uid for a in allocations}),
        unhealthy_reason=hw.unhealthy_reason,
        taints=hw.taints,
        conditions=[{**c, "message": ""} for c in conditions],
    )
    _agrees(GpuStatus, status)
