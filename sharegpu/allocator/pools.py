"""Resource pools as kube-scheduler sees them from one node.

Slices are grouped per (driver, pool) as :func:`gather_pools` describes. A pool is
*invalid* when device names repeat, counter-set names repeat, or a device (on any slice of
the pool's generation, also one for another node) consumes a counter set or counter the pool
does not define. Candidates are ordered by pool, then slice name, then position in the slice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .capacity import Amount, amount
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
    #: False for a device of a ``perDeviceNodeSelection`` slice that is not available on the
    #: node: kube-scheduler still evaluates its selectors (an error stops the allocation)
    #: before its node check leaves it out, so it stays among the candidates in its place.
    on_node: bool = True

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
    #: counter set -> counter -> value (exact).
    counters: dict[str, dict[str, Amount]] = field(default_factory=dict)
    #: Every device of the pool (also those not targeting the node), by name.
    all_devices: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Some device has binding conditions (such pools, when usable, are searched last).
    has_binding_conditions: bool = False

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


def _pool_fields(s: Mapping[str, Any]) -> tuple[int, int]:
    pool = s["spec"]["pool"]
    return int(pool.get("generation", 0)), int(pool.get("resourceSliceCount", 1))


def _relevant(spec: Mapping[str, Any], node: str, labels: Mapping[str, str]) -> bool:
    """Whether a slice takes part in the node's pools (kube-scheduler's ``GatherPools``).

    The slice's ``nodeName``, ``allNodes`` or ``nodeSelector`` decides (a counter-set slice
    too); with ``perDeviceNodeSelection`` some device must be available on the node; a slice
    with none of these (an unknown extension) never takes part.
    """
    node_name, all_nodes, selector = (
        spec.get("nodeName"),
        spec.get("allNodes"),
        spec.get("nodeSelector"),
    )
    if node_name or all_nodes or selector is not None:
        return node_matches(node, labels, node_name, bool(all_nodes), selector)
    if spec.get("perDeviceNodeSelection"):
        return any(
            node_matches(
                node, labels, d.get("nodeName"), bool(d.get("allNodes")), d.get("nodeSelector")
            )
            for d in spec.get("devices") or []
        )
    return False


def _uses_compatibility_groups(spec: Mapping[str, Any]) -> bool:
    """Whether a device of the slice declares ``compatibilityGroups`` on a counter set."""
    return any(
        consumption.get("compatibilityGroups")
        for device in spec.get("devices") or []
        for consumption in device.get("consumesCounters") or []
    )


def _validate(slices: Iterable[Mapping[str, Any]]) -> None:
    for i, s in enumerate(slices):
        spec = s.get("spec")
        if not isinstance(spec, Mapping):
            raise AllocatorInputError(f"slices[{i}].spec: missing")
        pool = spec.get("pool")
        if not spec.get("driver") or not isinstance(pool, Mapping) or not pool.get("name"):
            raise AllocatorInputError(f"slices[{i}].spec: driver and pool.name are required")


def gather_pools(
    slices: Iterable[Mapping[str, Any]], node: str, node_labels: Mapping[str, str] | None = None
) -> list[Pool]:
    """The pools of ``node`` as kube-scheduler gathers them, sorted by (driver, pool name),
    pools with binding conditions last.

    Only slices that take part for this node (:func:`_relevant`) make a pool; per pool the
    newest generation among them. When those are ``resourceSliceCount`` slices the pool is
    theirs alone. Otherwise all slices of that generation (on any node) are counted: when a
    newer generation exists elsewhere the pool is left out (obsolete); when they are not
    ``resourceSliceCount`` either the pool is *incomplete* (and not validated); else the
    other nodes' slices complete it (their counter sets, and their devices' consumption).
    A slice with a device declaring ``compatibilityGroups`` is ignored throughout
    (DRADeviceCompatibilityGroups is alpha and off in Kubernetes 1.37: kube-scheduler cannot
    honour the groups), which leaves its pool incomplete.
    """
    labels = node_labels or {}
    all_slices = list(slices)
    _validate(all_slices)
    grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for s in all_slices:
        spec = s["spec"]
        if _uses_compatibility_groups(spec) or not _relevant(spec, node, labels):
            continue
        key = (str(spec["driver"]), str(spec["pool"]["name"]))
        members = grouped.get(key)
        generation = _pool_fields(s)[0]
        if members is None or generation > _pool_fields(members[0])[0]:
            grouped[key] = [s]
        elif generation == _pool_fields(members[0])[0]:
            members.append(s)

    pools: list[Pool] = []
    for (driver, pool_name), members in grouped.items():
        generation, expected = _pool_fields(members[0])
        everywhere: list[Mapping[str, Any]] = []
        if len(members) != expected:
            same = [
                s
                for s in all_slices
                if s["spec"]["driver"] == driver and s["spec"]["pool"]["name"] == pool_name
            ]
            if any(_pool_fields(s)[0] > generation for s in same):
                continue  # obsolete: a newer generation is being published elsewhere
            everywhere = [
                s
                for s in same
                if _pool_fields(s)[0] == generation and not _uses_compatibility_groups(s["spec"])
            ]
        pool = Pool(driver, pool_name, generation)
        pool.incomplete = len(members) != expected and len(everywhere) != expected
        _fill(pool, members, everywhere, node, labels)
        pools.append(pool)
    # An incomplete or invalid pool has no devices for kube-scheduler, so none with
    # binding conditions: it stays among the others.
    pools.sort(key=lambda p: (p.has_binding_conditions and p.usable, p.driver, p.name))
    position = 0
    for pool in pools:
        for c in pool.candidates:
            c.position = position
            position += 1
    return pools


def _fill(
    pool: Pool,
    members: list[Mapping[str, Any]],
    everywhere: list[Mapping[str, Any]],
    node: str,
    labels: Mapping[str, str],
) -> None:
    """Candidates, counter sets and validity of one pool from its slices for the node
    (``members``) and, when those are not the whole pool, all slices of its generation
    (``everywhere``). An incomplete pool keeps its candidates (to explain why none is taken)
    but is not validated: kube-scheduler does not look into it."""
    members = sorted(members, key=_slice_name)
    names = {_slice_name(s) for s in members}
    others = [s for s in everywhere if _slice_name(s) not in names]
    device_slices = [s for s in members if not s["spec"].get("sharedCounters")]
    other_device_slices = [s for s in others if not s["spec"].get("sharedCounters")]
    counter_slices = [s for s in [*members, *others] if s["spec"].get("sharedCounters")]
    problems: list[str] = []
    seen: set[str] = set()
    for s in device_slices:
        for device in s["spec"].get("devices") or []:
            name = str(device.get("name"))
            if name in seen:
                problems.append(f"duplicate device name {name}")
            seen.add(name)
    for s in counter_slices:
        slice_name = _slice_name(s)
        for counter_set in s["spec"].get("sharedCounters") or []:
            set_name = str(counter_set.get("name"))
            if set_name in pool.counters:
                problems.append(f"duplicate counter set name {set_name}")
            pool.counters[set_name] = {
                n: amount(c.get("value"), f"slice {slice_name}: counter {set_name}/{n}")
                for n, c in (counter_set.get("counters") or {}).items()
            }
    for s in [*device_slices, *other_device_slices]:
        for device in s["spec"].get("devices") or []:
            pool.all_devices.setdefault(str(device.get("name")), device)
            problems.append(_counter_problem(pool.counters, device))
    if not pool.incomplete:
        pool.invalid_reason = next((p for p in problems if p), None)
    for s in device_slices:
        spec = s["spec"]
        per_device = bool(spec.get("perDeviceNodeSelection"))
        for device in spec.get("devices") or []:
            if device.get("bindingConditions"):
                pool.has_binding_conditions = True
            on_node = True
            if per_device:
                node_name, selector = device.get("nodeName"), device.get("nodeSelector")
                on_node = node_matches(
                    node, labels, node_name, bool(device.get("allNodes")), selector
                )
            else:
                node_name, selector = spec.get("nodeName"), spec.get("nodeSelector")
            pool.candidates.append(
                Candidate(
                    id=DeviceId(pool.driver, pool.name, str(device.get("name"))),
                    device=device,
                    slice_name=_slice_name(s),
                    node_name=node_name,
                    node_selector=selector if not node_name else None,
                    multi=bool(device.get("allowMultipleAllocations")),
                    on_node=on_node,
                )
            )


def _counter_problem(counters: Mapping[str, Mapping[str, Any]], device: Mapping[str, Any]) -> str:
    """Why a device's ``consumesCounters`` makes its pool invalid ("" when it does not)."""
    for consumption in device.get("consumesCounters") or []:
        set_name = str(consumption.get("counterSet"))
        counter_set = counters.get(set_name)
        if counter_set is None:
            return f"counter set {set_name} not found"
        for counter in consumption.get("counters") or {}:
            if counter not in counter_set:
                return f"counter {counter} not found in counter set {set_name}"
    return ""
