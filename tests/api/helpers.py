"""GpuConfig cases shared by the decoder tests and the chart values schema tests: valid configs
with their normalized form, invalid ones with the exact messages."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from api.gpuconfig import (
    SOURCE_FROM_CLAIM,
    SOURCE_FROM_CLASS,
    GpuConfig,
    decode_driver_configs,
)

BASE = {"apiVersion": "resource.sharegpu.dev/v1alpha1", "kind": "GpuConfig"}
SHARING_FIELDS = "(fields here: strategy, timeSlicing, mps, limits, burstLimit, burstPolicy)"
MPS_FIELDS = "(fields here: activeThreadPercentage, pinnedMemoryLimit)"


def cfg(sharing: Any) -> dict[str, Any]:
    return {**BASE, "sharing": sharing}


def config_entries_from(
    class_configs: Iterable[Mapping[str, Any]], claim_configs: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """DeviceClass and claim config entries tagged with their source, as
    ``status.allocation.devices.config`` holds them."""
    tagged = [{**c, "source": SOURCE_FROM_CLASS} for c in class_configs]
    tagged += [{**c, "source": SOURCE_FROM_CLAIM} for c in claim_configs]
    return tagged


def resolve_config(
    config_entries: Sequence[Any], request_name: str, driver: str, *, shared: bool = False
) -> GpuConfig:
    """The config of one request: :meth:`api.gpuconfig.DriverConfigs.resolve` of the decoded
    ``config_entries``."""
    return decode_driver_configs(config_entries, driver).resolve(request_name, shared=shared)


GOOD: list[tuple[str, Any, dict[str, Any]]] = [
    ("minimal", BASE, BASE),
    ("exclusive", cfg({"strategy": "Exclusive"}), cfg({"strategy": "Exclusive"})),
    (
        "time slicing default interval",
        cfg({"strategy": "TimeSlicing", "timeSlicing": {}}),
        cfg({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}}),
    ),
    (
        "time slicing long",
        cfg({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
        cfg({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
    ),
    (
        "mps overrides",
        cfg({"strategy": "MPS", "mps": {"activeThreadPercentage": 1, "pinnedMemoryLimit": "1Mi"}}),
        cfg({"strategy": "MPS", "mps": {"activeThreadPercentage": 1, "pinnedMemoryLimit": "1Mi"}}),
    ),
    (
        "mps integer quantity",
        cfg(
            {"strategy": "MPS", "mps": {"activeThreadPercentage": 100, "pinnedMemoryLimit": 2**30}}
        ),
        cfg(
            {
                "strategy": "MPS",
                "mps": {"activeThreadPercentage": 100, "pinnedMemoryLimit": "1073741824"},
            }
        ),
    ),
    (
        "limits",
        cfg({"strategy": "Limits", "limits": {"deviceMemoryLimit": "10Gi", "smLimit": 30}}),
        cfg({"strategy": "Limits", "limits": {"deviceMemoryLimit": "10Gi", "smLimit": 30}}),
    ),
    ("limits without overrides", cfg({"strategy": "Limits"}), cfg({"strategy": "Limits"})),
    ("empty sharing", cfg({}), cfg({})),
]


BAD: list[tuple[str, Any, list[str]]] = [
    (
        "wrong case strategy",
        cfg({"strategy": "Mps"}),
        ['sharing.strategy: must be one of Exclusive, TimeSlicing, MPS, Limits (got "Mps")'],
    ),
    (
        "strategy not a string",
        cfg({"strategy": 3}),
        ["sharing.strategy: must be one of Exclusive, TimeSlicing, MPS, Limits (got 3)"],
    ),
    (
        "thread percentage zero",
        cfg({"strategy": "MPS", "mps": {"activeThreadPercentage": 0}}),
        ["sharing.mps.activeThreadPercentage: must be between 1 and 100 (got 0)"],
    ),
    (
        "thread percentage above 100",
        cfg({"strategy": "MPS", "mps": {"activeThreadPercentage": 101}}),
        ["sharing.mps.activeThreadPercentage: must be between 1 and 100 (got 101)"],
    ),
    (
        "thread percentage as string",
        cfg({"strategy": "MPS", "mps": {"activeThreadPercentage": "50"}}),
        ['sharing.mps.activeThreadPercentage: must be an integer between 1 and 100 (got "50")'],
    ),
    (
        "thread percentage as boolean",
        cfg({"strategy": "MPS", "mps": {"activeThreadPercentage": True}}),
        ["sharing.mps.activeThreadPercentage: must be an integer between 1 and 100 (got true)"],
    ),
    (
        "thread percentage as float",
        cfg({"strategy": "MPS", "mps": {"activeThreadPercentage": 50.5}}),
        ["sharing.mps.activeThreadPercentage: must be an integer between 1 and 100 (got 50.5)"],
    ),
    (
        "pinned limit not a quantity",
        cfg({"strategy": "MPS", "mps": {"pinnedMemoryLimit": "ten gigs"}}),
        ['sharing.mps.pinnedMemoryLimit: must be a quantity such as "10Gi" (got "ten gigs")'],
    ),
    (
        "pinned limit too small",
        cfg({"strategy": "MPS", "mps": {"pinnedMemoryLimit": "512Ki"}}),
        ['sharing.mps.pinnedMemoryLimit: must be at least 1Mi (got "512Ki")'],
    ),
    (
        "pinned limit a list",
        cfg({"strategy": "MPS", "mps": {"pinnedMemoryLimit": ["1Gi"]}}),
        ['sharing.mps.pinnedMemoryLimit: must be a quantity such as "10Gi" (got ["1Gi"])'],
    ),
    ("unknown field", cfg({"foo": 1}), [f"sharing.foo: unknown field {SHARING_FIELDS}"]),
    (
        "snake case field",
        cfg({"strategy": "MPS", "mps": {"active_thread_percentage": 5}}),
        [
            "sharing.mps.active_thread_percentage: unknown field; did you mean "
            f"activeThreadPercentage? {MPS_FIELDS}"
        ],
    ),
    (
        "unknown top-level field",
        {**BASE, "spec": {}},
        ["spec: unknown field (fields here: apiVersion, kind, sharing)"],
    ),
    (
        "interval",
        cfg({"strategy": "TimeSlicing", "timeSlicing": {"interval": "short"}}),
        ['sharing.timeSlicing.interval: must be one of Default, Short, Medium, Long (got "short")'],
    ),
    (
        "section of another strategy",
        cfg({"strategy": "TimeSlicing", "mps": {"activeThreadPercentage": 10}}),
        ["sharing.mps: only allowed with strategy MPS (strategy is TimeSlicing)"],
    ),
    (
        "section without strategy",
        cfg({"limits": {"smLimit": 10}}),
        ["sharing.limits: only allowed with strategy Limits (strategy is not set)"],
    ),
    ("sharing not an object", cfg("MPS"), ["sharing: must be an object (got a string)"]),
    (
        "mps not an object",
        cfg({"strategy": "MPS", "mps": 5}),
        ["sharing.mps: must be an object (got a number)"],
    ),
    (
        "wrong apiVersion and kind",
        {"apiVersion": "v1", "kind": "Config"},
        [
            'apiVersion: must be resource.sharegpu.dev/v1alpha1 (got "v1")',
            'kind: must be GpuConfig (got "Config")',
        ],
    ),
    (
        "missing apiVersion and kind",
        {},
        [
            "apiVersion: required (must be resource.sharegpu.dev/v1alpha1)",
            "kind: required (must be GpuConfig)",
        ],
    ),
    ("not an object", ["MPS"], ["(root): must be an object (got a list)"]),
    (
        "several problems at once",
        cfg({"strategy": "MPS", "mps": {"activeThreadPercentage": 0, "pinned": "1Gi"}}),
        [
            "sharing.mps.activeThreadPercentage: must be between 1 and 100 (got 0)",
            f"sharing.mps.pinned: unknown field {MPS_FIELDS}",
        ],
    ),
]
