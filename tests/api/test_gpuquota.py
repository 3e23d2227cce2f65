"""The GpuQuota model: valid objects decode; hostile ones (negative, huge, wrong types, unknown
fields, not an object) give one clear error naming each field, never a traceback."""

from __future__ import annotations

from typing import Any

import pytest

from api.gpuquota import GpuQuotaError, parse_gpu_quota


def obj(spec: Any, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.sharegpu.dev/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": "q", "namespace": "team-a"},
        "spec": spec,
        **extra,
    }


def test_a_valid_quota_decodes_with_canonical_memory() -> None:
    q = parse_gpu_quota(
        obj(
            {"hard": {"cores": 150, "memory": 85899345920, "devices": 2}, "deviceClassNames": ["x"]}
        )
    )
    assert (q.spec.hard.cores, q.spec.hard.memory, q.spec.hard.devices) == (150, "80Gi", 2)
    assert q.spec.device_class_names == ["x"]
    assert q.status.claims == {}


def test_every_limit_is_optional() -> None:
    q = parse_gpu_quota(obj({"hard": {}}))
    assert q.spec.hard.cores is None and q.spec.hard.memory is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"hard": {"cores": -1}}, "spec.hard.cores: must be an integer between 0 and 100000000"),
        ({"hard": {"cores": 10**12}}, "spec.hard.cores: must be an integer between 0 and"),
        ({"hard": {"cores": "100"}}, "spec.hard.cores: must be an integer"),
        ({"hard": {"cores": True}}, "spec.hard.cores: must be an integer"),
        ({"hard": {"cores": 1.5}}, "spec.hard.cores: must be an integer"),
        ({"hard": {"devices": -3}}, "spec.hard.devices: must be an integer between 0 and 1000000"),
        ({"hard": {"memory": "-1Gi"}}, "spec.hard.memory: must not be negative"),
        ({"hard": {"memory": "1e40"}}, "spec.hard.memory: invalid quantity"),
        ({"hard": {"memory": "lots"}}, "spec.hard.memory:"),
        ({"hard": {"memory": [1]}}, 'spec.hard.memory: must be a quantity such as "80Gi"'),
        ({"hard": {"gpus": 1}}, "spec.hard.gpus: unknown field"),
        ({"hard": "all"}, "spec.hard: must be an object"),
        ({}, "spec.hard: required"),
        ({"hard": {}, "deviceClassNames": "x"}, "spec.deviceClassNames: must be a list"),
        ({"hard": {}, "deviceClassNames": ["a"] * 33}, "must list at most 32 names"),
        ({"hard": {}, "deviceClassNames": [""]}, "[0] must be a DeviceClass name"),
    ],
)
def test_hostile_quotas_are_refused_naming_the_field(spec: Any, message: str) -> None:
    with pytest.raises(GpuQuotaError) as caught:
        parse_gpu_quota(obj(spec))
    assert message in str(caught.value)


@pytest.mark.parametrize("value", [None, "q", 3, [1]])
def test_a_quota_that_is_not_an_object_is_refused(value: Any) -> None:
    with pytest.raises(GpuQuotaError, match=r"\(root\): must be an object"):
        parse_gpu_quota(value)


def test_wrong_kind_and_status_shape_are_named() -> None:
    with pytest.raises(GpuQuotaError) as caught:
        parse_gpu_quota(obj({"hard": {}}, kind="ResourceQuota", status={"used": {"cores": -1}}))
    assert "kind: must be GpuQuota" in str(caught.value)
    assert "status.used.cores" in str(caught.value)
