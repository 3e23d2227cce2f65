"""DeviceTaintRule checks and selector matching."""

from __future__ import annotations

from typing import Any

import pytest

from sharegpu.kube.devicetaints import (
    rule_matches,
    rule_taints,
    validate_device_taint_rule,
    with_rule_taints,
)

Obj = dict[str, Any]


def rule(selector: Obj | None = None, **taint: Any) -> Obj:
    spec: Obj = {"taint": {"key": "example.com/k", "effect": "NoSchedule", **taint}}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {"metadata": {"name": "r"}, "spec": spec}


@pytest.mark.parametrize(
    ("obj", "problems"),
    [
        (rule({}), []),
        ({"metadata": {"name": "r"}}, ["spec: Required value"]),
        ({"spec": {"deviceSelector": {}}}, ["spec.taint: Required value"]),
        (
            {"spec": {"deviceSelector": [], "taint": {"key": "k", "effect": "None"}}},
            ["spec.deviceSelector: must be an object"],
        ),
        (rule({"pool": "a/b"}), []),
        (
            rule({"pool": "a//b"}),
            [
                "spec.deviceSelector.pool: invalid value 'a//b': must be a pool "
                "name (DNS subdomains separated by slashes)"
            ],
        ),
        (
            rule({}, key="bad key"),
            ["spec.taint.key: invalid taint key 'bad key': must be a qualified name"],
        ),
        (
            rule({}, value="-x"),
            ["spec.taint.value: invalid taint value '-x': must be a label value"],
        ),
        (
            {**rule({}), "status": {"conditions": [{}] * 9}},
            ["status.conditions: Too many: 9: must have at most 8 items"],
        ),
    ],
)
def test_validate(obj: Obj, problems: list[str]) -> None:
    assert validate_device_taint_rule(obj) == problems


def test_matching_and_the_empty_and_absent_selector() -> None:
    assert rule_matches(rule({}), "d", "p", "x")
    assert not rule_matches(rule(None), "d", "p", "x")
    assert rule_matches(rule({"driver": "d", "device": "x"}), "d", "p", "x")
    assert not rule_matches(rule({"driver": "d", "device": "x"}), "d", "p", "y")
    assert rule_taints([rule({"pool": "p"})], "d", "p", "x") == [
        {"key": "example.com/k", "effect": "NoSchedule", "deviceTaintRule": "r"}
    ]


def test_with_rule_taints_copies_only_what_it_changes() -> None:
    slices = [
        {"spec": {"driver": "d", "pool": {"name": "p"}, "devices": [{"name": "x"}, {"name": "y"}]}},
        {"spec": {"driver": "d", "pool": {"name": "q"}, "devices": [{"name": "x"}]}},
    ]
    out = with_rule_taints(slices, [rule({"pool": "p", "device": "x"}), rule({}, effect="Bad")])
    assert out[1] is slices[1]
    assert out[0]["spec"]["devices"][1] is slices[0]["spec"]["devices"][1]
    assert out[0]["spec"]["devices"][0]["taints"] == [
        {"key": "example.com/k", "effect": "NoSchedule", "deviceTaintRule": "r"}
    ]
    assert "taints" not in slices[0]["spec"]["devices"][0]
