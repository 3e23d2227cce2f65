"""Kubernetes' DRA CEL compile test table (``TestCEL``), run against :mod:`sharegpu.cel`.

The table is data (``upstream/compile_cases.yaml``, with the upstream repository, path and
commit): the compile error, the estimated cost (``MaxCost``), and the match or evaluation
error of every case, with the DRAListTypeAttributes gate off and on where upstream runs both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sharegpu.cel import CelCompileError, CelEvalError, CompileOptions, compile_selector
from sharegpu.cel.device import device_activation

TABLE = yaml.safe_load((Path(__file__).parent / "upstream" / "compile_cases.yaml").read_text())


def _runs() -> list[Any]:
    runs = []
    for case in TABLE["cases"]:
        gates = [case["listTypeAttributes"]] if "listTypeAttributes" in case else [False, True]
        for gate in gates:
            runs.append(pytest.param(case, gate, id=f"{case['name']}/list-type-attributes={gate}"))
    return runs


def test_table_records_its_source() -> None:
    source = TABLE["source"]
    assert source["repository"] == "kubernetes/kubernetes"
    assert source["path"].endswith("dynamic-resource-allocation/cel/compile_test.go")
    assert len(source["commit"]) == 40


@pytest.mark.parametrize(("case", "gate"), _runs())
def test_upstream_case(case: dict[str, Any], gate: bool) -> None:
    options = CompileOptions(
        stored=case.get("env", "stored") == "stored",
        list_type_attributes=gate,
        consumable_capacity=case.get("consumableCapacity", False),
    )
    expression = case["expression"]
    if "expectCompileError" in case:
        with pytest.raises(CelCompileError) as info:
            compile_selector(expression, options)
        assert case["expectCompileError"] in info.value.message
        return
    program = compile_selector(expression, options)
    assert program.max_cost == case.get("expectCost", 0)
    slice_device: dict[str, Any] = {
        "attributes": case.get("attributes", {}),
        "capacity": {name: {"value": value} for name, value in case.get("capacity", {}).items()},
    }
    if "allowMultipleAllocations" in case:
        slice_device["allowMultipleAllocations"] = case["allowMultipleAllocations"]
    device = device_activation(case.get("driver", ""), slice_device)
    if "expectMatchError" in case:
        with pytest.raises(CelEvalError) as error:
            program.evaluate(device)
        assert case["expectMatchError"] in error.value.message
        return
    assert program.evaluate(device) is case["expectMatch"]
