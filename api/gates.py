"""Kubernetes feature gates of the ``resource.k8s.io`` fields this project reads or writes.

One table, :data:`GATED_FIELDS`, says which field of which kind needs which gate, and
:data:`GATES` when each gate became alpha, beta or GA and whether it is on by default there
(kube-apiserver's ``kube_features.go``). An API server with a gate off drops the gate's fields
from what it stores, so a manifest that uses them loses them without an error.

``supported`` marks what sharegpu's allocator and kubelet plugin implement: the alpha fields of
Kubernetes 1.37 (optional node operations, partition types, device compatibility groups,
derived attributes) are not, and are named as unsupported when a cluster turns their gate on.

Invariant: versions are ``(major, minor)``; stages of a gate are in version order.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from api.upstream import UPSTREAM

Version = tuple[int, int]

#: The newest Kubernetes release this project targets (the default of ``sharegpu validate``):
#: the minor of ``api/upstream.toml``'s ``kubernetes``.
LATEST_KUBERNETES: Final[Version] = UPSTREAM.minor


@dataclass(frozen=True)
class Stage:
    """From ``since`` on, the gate is at ``maturity`` (alpha, beta, GA) with ``default``."""

    since: Version
    maturity: str
    default: bool


@dataclass(frozen=True)
class Gate:
    """A feature gate and its history."""

    name: str
    stages: tuple[Stage, ...]

    def stage(self, version: Version) -> Stage | None:
        """The stage at ``version``; None before the gate existed."""
        current = None
        for stage in self.stages:
            if stage.since <= version:
                current = stage
        return current

    def enabled(self, version: Version, override: bool | None = None) -> bool:
        """Whether the gate is on at ``version`` (``override``: set with ``--feature-gates``)."""
        stage = self.stage(version)
        if stage is None:
            return False
        if override is not None:
            return override
        return stage.default

    def history(self) -> str:
        """``alpha and off by default in 1.34 and 1.35, beta and on by default from 1.36``."""
        parts = []
        for i, stage in enumerate(self.stages):
            state = f"{stage.maturity} and {'on' if stage.default else 'off'} by default"
            if i + 1 == len(self.stages):
                parts.append(f"{state} from {_show(stage.since)}")
                continue
            last = (self.stages[i + 1].since[0], self.stages[i + 1].since[1] - 1)
            if last == stage.since:
                parts.append(f"{state} in {_show(stage.since)}")
            elif (last[1] - stage.since[1]) == 1:
                parts.append(f"{state} in {_show(stage.since)} and {_show(last)}")
            else:
                parts.append(f"{state} in {_show(stage.since)} to {_show(last)}")
        return ", ".join(parts)


def _show(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


def _gate(name: str, *stages: tuple[Version, str, bool]) -> Gate:
    return Gate(name, tuple(Stage(v, m, d) for v, m, d in stages))


CONSUMABLE_CAPACITY: Final = "DRAConsumableCapacity"
PARTITIONABLE_DEVICES: Final = "DRAPartitionableDevices"
DEVICE_TAINTS: Final = "DRADeviceTaints"
BINDING_CONDITIONS: Final = "DRADeviceBindingConditions"
EXTENDED_RESOURCE: Final = "DRAExtendedResource"
OPTIONAL_NODE_OPERATIONS: Final = "DRAOptionalNodeOperations"
PARTITIONABLE_DEVICES_TYPE: Final = "DRAPartitionableDevicesType"
COMPATIBILITY_GROUPS: Final = "DRADeviceCompatibilityGroups"
DERIVED_ATTRIBUTES: Final = "DRADerivedAttributes"
LIST_ATTRIBUTES: Final = "DRAListTypeAttributes"
NODE_ALLOCATABLE_RESOURCES: Final = "DRANodeAllocatableResources"

GATES: Final[Mapping[str, Gate]] = {
    g.name: g
    for g in (
        _gate(CONSUMABLE_CAPACITY, ((1, 34), "alpha", False), ((1, 36), "beta", True)),
        _gate(PARTITIONABLE_DEVICES, ((1, 33), "alpha", False), ((1, 36), "beta", True)),
        _gate(
            DEVICE_TAINTS,
            ((1, 33), "alpha", False),
            ((1, 36), "beta", True),
            ((1, 37), "GA", True),
        ),
        _gate(BINDING_CONDITIONS, ((1, 34), "alpha", False), ((1, 36), "beta", True)),
        _gate(
            EXTENDED_RESOURCE,
            ((1, 34), "alpha", False),
            ((1, 36), "beta", True),
            ((1, 37), "GA", True),
        ),
        _gate(OPTIONAL_NODE_OPERATIONS, ((1, 37), "alpha", False)),
        _gate(PARTITIONABLE_DEVICES_TYPE, ((1, 37), "alpha", False)),
        _gate(COMPATIBILITY_GROUPS, ((1, 37), "alpha", False)),
        _gate(DERIVED_ATTRIBUTES, ((1, 37), "alpha", False)),
        _gate(LIST_ATTRIBUTES, ((1, 36), "alpha", False)),
        _gate(NODE_ALLOCATABLE_RESOURCES, ((1, 36), "alpha", False)),
    )
}


@dataclass(frozen=True)
class GatedField:
    """A field of ``kind`` at ``pattern`` (dotted; ``[]`` is every list item, ``{}`` every map
    value) that the API server keeps only with ``gate`` on."""

    kind: str
    pattern: str
    gate: str
    #: Short name of what is dropped, for messages (``capacity requests``).
    what: str
    #: What happens when the API server drops it.
    consequence: str
    supported: bool = True


_REQUEST_PARENTS: Final = (
    "devices.requests[].exactly",
    "devices.requests[].firstAvailable[]",
)
_DEVICE: Final = "spec.devices[]"


def _claim_fields(base: str, kind: str) -> list[GatedField]:
    out = []
    for parent in _REQUEST_PARENTS:
        out.append(
            GatedField(
                kind,
                f"{base}.{parent}.capacity",
                CONSUMABLE_CAPACITY,
                "capacity requests",
                "the request would get a whole device; enable the gate on the API server and "
                f"scheduler (then pass --feature-gates {CONSUMABLE_CAPACITY}=true here), or use "
                "sharegpu's partitions mode, which needs no capacity requests",
            )
        )
        out.append(
            GatedField(
                kind,
                f"{base}.{parent}.tolerations",
                DEVICE_TAINTS,
                "device taint tolerations",
                "the request tolerates no device taint (with the gate off, device taints are "
                "ignored as well)",
            )
        )
        out.append(
            GatedField(
                kind,
                f"{base}.{parent}.derivedAttributes",
                DERIVED_ATTRIBUTES,
                "derived attributes",
                "constraints that name a derived attribute compare the device attribute of "
                "that name instead",
                supported=False,
            )
        )
    out.append(
        GatedField(
            kind,
            f"{base}.devices.constraints[].distinctAttribute",
            CONSUMABLE_CAPACITY,
            "distinctAttribute constraints",
            "the constraint is left without an attribute, so the API server refuses the claim "
            "(matchAttribute or distinctAttribute required)",
        )
    )
    return out


#: Every gated field this project knows, per kind.
GATED_FIELDS: Final[tuple[GatedField, ...]] = (
    *_claim_fields("spec", "ResourceClaim"),
    *_claim_fields("spec.spec", "ResourceClaimTemplate"),
    GatedField(
        "DeviceClass",
        "spec.extendedResourceName",
        EXTENDED_RESOURCE,
        "the extended resource name",
        "pods asking for that extended resource in resources.limits are not served by this "
        "DeviceClass",
    ),
    GatedField(
        "ResourceClaim",
        "status.allocation.devices.results[].skipNodeOperations",
        OPTIONAL_NODE_OPERATIONS,
        "skipped node operations",
        "the kubelet calls the plugin's NodePrepareResources and NodeUnprepareResources",
        supported=False,
    ),
    GatedField(
        "ResourceSlice",
        "spec.skipNodeOperations",
        OPTIONAL_NODE_OPERATIONS,
        "skipped node operations",
        "the kubelet calls the plugin's NodePrepareResources and NodeUnprepareResources",
        supported=False,
    ),
    GatedField(
        "ResourceSlice",
        "spec.partitionTypeAttribute",
        PARTITIONABLE_DEVICES_TYPE,
        "the partition type attribute",
        "devices are not grouped by partition type",
        supported=False,
    ),
    GatedField(
        "ResourceSlice",
        f"{_DEVICE}.consumesCounters[].compatibilityGroups",
        COMPATIBILITY_GROUPS,
        "device compatibility groups",
        "devices of one counter set are allocated together whatever their groups",
        supported=False,
    ),
    GatedField(
        "ResourceSlice",
        f"{_DEVICE}.allowMultipleAllocations",
        CONSUMABLE_CAPACITY,
        "shared devices (allowMultipleAllocations)",
        "every share becomes a whole GPU: each device is allocated to one claim only",
    ),
    GatedField(
        "ResourceSlice",
        f"{_DEVICE}.capacity{{}}.requestPolicy",
        CONSUMABLE_CAPACITY,
        "capacity request policies",
        "capacity requests are not rounded to the policy's steps nor bounded by it",
    ),
    GatedField(
        "ResourceSlice",
        "spec.sharedCounters",
        PARTITIONABLE_DEVICES,
        "shared counters",
        "partitions of one GPU no longer exclude each other: overlapping partitions can be "
        "allocated to different claims",
    ),
    GatedField(
        "ResourceSlice",
        "spec.perDeviceNodeSelection",
        PARTITIONABLE_DEVICES,
        "per-device node selection",
        "the slice is left without nodeName, nodeSelector or allNodes, so the API server "
        "refuses it",
    ),
    *(
        GatedField(
            "ResourceSlice",
            f"{_DEVICE}.{field}",
            PARTITIONABLE_DEVICES,
            f"a device's {field}",
            "the device loses its own node selection",
        )
        for field in ("nodeName", "nodeSelector", "allNodes")
    ),
    GatedField(
        "ResourceSlice",
        f"{_DEVICE}.consumesCounters",
        PARTITIONABLE_DEVICES,
        "device counter consumption",
        "partitions of one GPU no longer exclude each other: overlapping partitions can be "
        "allocated to different claims",
    ),
    *(
        GatedField(
            "ResourceSlice",
            f"{_DEVICE}.attributes{{}}.{form}",
            LIST_ATTRIBUTES,
            "list-valued attributes",
            "the attribute is left without a value, so the API server refuses the slice "
            "(exactly one value must be specified)",
        )
        for form in ("ints", "bools", "strings", "versions")
    ),
    GatedField(
        "ResourceSlice",
        f"{_DEVICE}.nodeAllocatableResources",
        NODE_ALLOCATABLE_RESOURCES,
        "node-allocatable resources",
        "pods using the device are not charged the node CPU or memory it maps to",
        supported=False,
    ),
    GatedField(
        "ResourceSlice",
        f"{_DEVICE}.taints",
        DEVICE_TAINTS,
        "device taints",
        "tainted devices are allocated as if they were healthy",
    ),
    GatedField(
        "ResourceSlice",
        f"{_DEVICE}.bindingConditions",
        BINDING_CONDITIONS,
        "binding conditions",
        "pods are bound without waiting for the device's binding conditions",
    ),
    GatedField(
        "ResourceSlice",
        f"{_DEVICE}.bindingFailureConditions",
        BINDING_CONDITIONS,
        "binding failure conditions",
        "pods are bound without waiting for the device's binding conditions",
    ),
    GatedField(
        "ResourceSlice",
        f"{_DEVICE}.bindsToNode",
        BINDING_CONDITIONS,
        "binding to the node (bindsToNode)",
        "the allocation is not limited to the node kube-scheduler picked",
    ),
)


def present(obj: Any, pattern: str) -> Iterator[str]:
    """The concrete paths (``spec.devices[0].taints``) where ``obj`` sets a non-empty value at
    ``pattern``. Parts that are not the expected type are skipped."""
    yield from _walk(obj, pattern.replace("[]", ".[]").replace("{}", ".{}").split("."), "")


def _walk(node: Any, parts: list[str], path: str) -> Iterator[str]:
    if not parts:
        if node not in (None, [], {}, "", False):
            yield path
        return
    head, rest = parts[0], parts[1:]
    if head == "[]":
        if isinstance(node, list):
            for i, item in enumerate(node):
                yield from _walk(item, rest, f"{path}[{i}]")
    elif head == "{}":
        if isinstance(node, Mapping):
            for key, value in node.items():
                yield from _walk(value, rest, f"{path}[{key}]")
    elif isinstance(node, Mapping) and head in node:
        yield from _walk(node[head], rest, f"{path}.{head}" if path else head)


def gated_fields(obj: Mapping[str, Any]) -> Iterator[tuple[str, GatedField]]:
    """``(path, field)`` of every gated field ``obj`` sets, in table order."""
    kind = obj.get("kind")
    for gated in GATED_FIELDS:
        if gated.kind == kind:
            for path in present(obj, gated.pattern):
                yield path, gated


def without(obj: Mapping[str, Any], gate_names: Collection[str]) -> dict[str, Any]:
    """A deep copy of ``obj`` without the fields of its kind that ``gate_names`` guard: what an
    API server with those gates off stores of it."""
    out: dict[str, Any] = copy.deepcopy(dict(obj))
    for gated in GATED_FIELDS:
        if gated.kind == out.get("kind") and gated.gate in gate_names:
            _remove(out, gated.pattern.replace("[]", ".[]").replace("{}", ".{}").split("."))
    return out


def _remove(node: Any, parts: list[str]) -> None:
    head, rest = parts[0], parts[1:]
    if head == "[]":
        children = node if isinstance(node, list) else []
    elif head == "{}":
        children = list(node.values()) if isinstance(node, Mapping) else []
    elif isinstance(node, dict) and head in node:
        if not rest:
            del node[head]
            return
        children = [node[head]]
    else:
        return
    for child in children:
        if rest:
            _remove(child, rest)
