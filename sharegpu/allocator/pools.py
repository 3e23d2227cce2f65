"""Resource pools as kube-scheduler sees them from one node.

Slices are grouped per (driver, pool); only the highest ``generation`` counts. A pool with
fewer slices than ``resourceSliceCount`` is *incomplete*; duplicate device or counter-set
names make it *invalid*. A pool is visible from a node when one of its current slices (or,
with ``perDeviceNodeSelection``, one of its devices) targets the node. Candidates are
ordered by pool, then slice name, then position in the slice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from api.quantity import QuantityError, quantity_int

from .model import AllocatorInputError, DeviceId


@dataclass
class Candidate:
    """One device of a visible pool, with the facts the allocator needs precomputed."""

    id: DeviceId
    device: Mapping[str, Any]
    slice_name: str
    node_name: str | None
    node_selector: Mapping[str, Any] | None
    multi: bool
    position: int = 0

    @property
    def name(self) -> str:
        """Device name."""
        return self.id.device


@dataclass
class Pool:
    """The current generation of one pool, as visible from the node."""

    driver: str
    name: str
    generation: int
    incomplete: bool = False
    invalid_reason: str | None = None
    candidates: list[Candidate] = field(default_factory=list)
    #: counter set -> counter -> value (integer, ``Quantity.Value()`` rounding).
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Every device of the pool (also those not targeting the node), by name.
    all_devices: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        """Devices may be taken only from complete, valid pools."""
        return not self.incomplete and self.invalid_reason is None


def node_matches(
    node: str,
    labels: Mapping[str, str],
    node_name: str | None,
    all_nodes: bool,
    selector: Mapping[str, Any] | None,
) -> bool:
    """Whether a slice (or device) with these node fields is available on ``node``.

    ``nodeSelector`` terms are ORed; each term's ``matchFields`` (``metadata.name`` only) and
    ``matchExpressions`` (on ``labels``) are ANDed, as for core/v1 node affinity.
    """
    if node_name:
        return node_name == node
    if all_nodes:
        return True
    if selector:
        return any(_term_matches(node, labels, t) for t in selector.get("nodeSelectorTerms") or [])
    return False


def _term_matches(node: str, labels: Mapping[str, str], term: Mapping[str, Any]) -> bool:
    fields = term.get("matchFields") or []
    expressions = term.get("matchExpressions") or []
    if not fields and not expressions:
        return False
    for req in fields:
        if req.get("key") != "metadata.name" or not _requirement(node, True, req):
            return False
    for req in expressions:
        key = req.get("key", "")
        if not _requirement(labels.get(key, ""), key in labels, req):
            return False
    return True


def _requirement(value: str, present: bool, req: Mapping[str, Any]) -> bool:
    op = req.get("operator")
    values = req.get("values") or []
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and values:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _slice_name(s: Mapping[str, Any]) -> str:
    """``metadata.name`` (``generateName`` for a slice not yet created)."""
    meta = s.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName") or "")


def _quantity(value: Any, path: str) -> int:
    try:
        return quantity_int(value)
    except QuantityError as exc:
        raise AllocatorInputError(f"{path}: {exc}") from None


def gather_pools(
    slices: Iterable[Mapping[str, Any]], node: str, node_labels: Mapping[str, str] | None = None
) -> list[Pool]:
    """The pools visible from ``node``, sorted by (driver, pool name)."""
    labels = node_labels or {}
    grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for i, s in enumerate(slices):
        spec = s.get("spec")
        if not isinstance(spec, Mapping):
            raise AllocatorInputError(f"slices[{i}].spec: missing")
        pool = spec.get("pool") or {}
        driver = spec.get("driver")
        if not driver or not pool.get("name"):
            raise AllocatorInputError(f"slices[{i}].spec: driver and pool.name are required")
        grouped[(str(driver), str(pool["name"]))].append(s)

    pools = []
    for (driver, pool_name), members in sorted(grouped.items()):
        generation = max(int(m["spec"]["pool"].get("generation", 0)) for m in members)
        current = sorted(
            (m for m in members if int(m["spec"]["pool"].get("generation", 0)) == generation),
            key=_slice_name,
        )
        pool = Pool(driver, pool_name, generation)
        expected = max(int(m["spec"]["pool"].get("resourceSliceCount", 1)) for m in current)
        pool.incomplete = len(current) < expected
        visible = False
        for s in current:
            spec = s["spec"]
            slice_name = _slice_name(s)
            per_device = bool(spec.get("perDeviceNodeSelection"))
            slice_visible = per_device or node_matches(
                node,
                labels,
                spec.get("nodeName"),
                bool(spec.get("allNodes")),
                spec.get("nodeSelector"),
            )
            for counter_set in spec.get("sharedCounters") or []:
                set_name = str(counter_set.get("name"))
                if set_name in pool.counters:
                    pool.invalid_reason = f"duplicate counter set name {set_name!r}"
                pool.counters[set_name] = {
                    n: _quantity(c.get("value"), f"slice {slice_name}: counter {set_name}/{n}")
                    for n, c in (counter_set.get("counters") or {}).items()
                }
            for device in spec.get("devices") or []:
                dev_name = str(device.get("name"))
                if dev_name in pool.all_devices:
                    pool.invalid_reason = f"duplicate device name {dev_name!r}"
                pool.all_devices[dev_name] = device
                if per_device:
                    node_name = device.get("nodeName")
                    selector = device.get("nodeSelector")
                    if not node_matches(
                        node, labels, node_name, bool(device.get("allNodes")), selector
                    ):
                        continue
                elif not slice_visible:
                    continue
                else:
                    node_name, selector = spec.get("nodeName"), spec.get("nodeSelector")
                visible = True
                pool.candidates.append(
                    Candidate(
                        id=DeviceId(driver, pool_name, dev_name),
                        device=device,
                        slice_name=slice_name,
                        node_name=node_name,
                        node_selector=selector if not node_name else None,
                        multi=bool(device.get("allowMultipleAllocations")),
                    )
                )
            visible = visible or (slice_visible and not spec.get("devices"))
        if visible:
            pools.append(pool)
    position = 0
    for pool in pools:
        for c in pool.candidates:
            c.position = position
            position += 1
    return pools
