"""A pure-Python allocator with kube-scheduler's structured-parameters semantics.

Depth-first, first-fit search as in ``k8s.io/dynamic-resource-allocation/structured``:
requests in claim order, ``firstAvailable`` subrequests in their order, devices in pool,
slice-name and slice order; a pick that leaves no completion is undone and the next
candidate tried. Per candidate the checks run in this order: exclusively in use, class and
request selectors (a CEL error stops the allocation, as in the scheduler), capacity
(requests filter, request policy, what is left), counters, taints, constraints.

Deterministic: the same input (and the same share-ID generator) gives the same output.
"""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from api.quantity import QuantityError, format_quantity, quantity_int
from sharegpu.cel import CelCompileError, CelEvalError, compile_selector, device_activation

from .capacity import PolicyViolation, capacity_key, consumed_amount
from .model import (
    AllocationOutcome,
    AllocatorInputError,
    DeviceId,
    Rejection,
    RequestReport,
)
from .pools import Candidate, Pool, gather_pools
from .requests import Alternative, Constraint, Request, claim_name, parse_requests
from .usage import Usage, counters_left

ShareIdFactory = Callable[[], str]

#: The search gives up after this many device placements (kube-scheduler bounds it by time).
DEFAULT_MAX_STEPS = 100_000
#: At most this many results per claim (``AllocationResultsMaxSize``).
MAX_RESULTS = 32


def random_share_ids() -> ShareIdFactory:
    """Fresh random lowercase UUIDs, as kube-scheduler generates them."""
    return lambda: str(uuid.uuid4())


def seeded_share_ids(seed: int) -> ShareIdFactory:
    """A reproducible sequence of version-4 UUIDs (for tests and demos)."""
    rng = random.Random(seed)
    return lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4))


class _Abort(Exception):
    """The allocation stops with an error, as kube-scheduler's allocator returns one."""


@dataclass
class _Pick:
    alt: Alternative
    cand: Candidate
    pool_key: tuple[str, str]
    consumed: dict[str, int] | None
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    constraint_values: list[tuple[int, Any]] = field(default_factory=list)


def _attribute(cand: Candidate, qualified: str) -> tuple[str, Any] | None:
    """``(type, value)`` of a fully qualified attribute, resolved as the scheduler does."""
    attributes = cand.device.get("attributes") or {}
    raw = attributes.get(qualified)
    if raw is None:
        domain, _, ident = qualified.partition("/")
        if domain != cand.id.driver:
            return None
        raw = attributes.get(ident)
    if not raw:
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in raw:
            return kind, raw[kind]
    return None


def _show(value: tuple[str, Any]) -> str:
    return str(value[1]).lower() if value[0] == "bool" else str(value[1])


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key")
    if key and key != taint.get("key"):
        return False
    if toleration.get("operator") == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", "") and key)


class Allocator:
    """Allocates claims on one node against a fixed set of slices, classes and claims.

    ``allocated_claims`` are ResourceClaims with ``status.allocation``; :meth:`allocate`
    does not change this state, :meth:`commit` adds an allocation to it (what
    :func:`allocate_many` does between claims).
    """

    def __init__(
        self,
        slices: Iterable[Mapping[str, Any]],
        classes: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
        allocated_claims: Iterable[Mapping[str, Any]] = (),
        node: str = "",
        node_labels: Mapping[str, str] | None = None,
        share_ids: ShareIdFactory | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
    ) -> None:
        if not node:
            raise AllocatorInputError("node: a node name is required")
        self.node = node
        self.pools: list[Pool] = gather_pools(slices, node, node_labels)
        self.pool_by_key = {(p.driver, p.name): p for p in self.pools}
        self.candidates: list[Candidate] = [c for p in self.pools for c in p.candidates]
        if isinstance(classes, Mapping):
            self.classes = dict(classes)
        else:
            self.classes = {str((c.get("metadata") or {}).get("name")): c for c in classes}
        self.usage = Usage.from_claims(allocated_claims)
        self.share_ids = share_ids or random_share_ids()
        self.max_steps = max_steps
        self._activations: dict[DeviceId, dict[str, Any] | CelEvalError] = {}

    def activation(self, cand: Candidate) -> dict[str, Any] | CelEvalError:
        """The CEL ``device`` variable of a candidate, built once."""
        cached = self._activations.get(cand.id)
        if cached is None:
            try:
                cached = device_activation(cand.id.driver, cand.device)
            except CelEvalError as exc:
                cached = exc
            self._activations[cand.id] = cached
        return cached

    def commit(self, claim: Mapping[str, Any], allocation: Mapping[str, Any]) -> None:
        """Count ``allocation`` of ``claim`` as held from now on."""
        self.usage.add_allocation(claim_name(claim), allocation)

    def allocate(self, claim: Mapping[str, Any]) -> AllocationOutcome:
        """Allocate ``claim``: the allocation, or the error and per-request reports."""
        name = claim_name(claim)
        requests, constraints, missing = parse_requests(claim, self.classes)
        search = _Search(self, claim, requests, constraints)
        if missing:
            error = f"claim {name}: device class {', '.join(missing)} not found"
            return AllocationOutcome(name, error=error, reports=search.explain())
        try:
            found = search.run()
        except _Abort as exc:
            return AllocationOutcome(name, error=str(exc), reports=search.explain())
        if not found:
            return AllocationOutcome(name, reports=search.explain())
        return AllocationOutcome(name, allocation=search.build_allocation())


class _Search:
    def __init__(
        self,
        owner: Allocator,
        claim: Mapping[str, Any],
        requests: list[Request],
        constraints: list[Constraint],
    ) -> None:
        self.owner = owner
        self.claim = claim
        self.claim_name = claim_name(claim)
        self.requests = requests
        self.constraints = constraints
        self.steps = 0
        self.picks: list[_Pick] = []
        self.selected: dict[int, Alternative] = {}
        self.run_exclusive: dict[DeviceId, str] = {}
        self.run_consumed: dict[DeviceId, dict[str, int]] = defaultdict(dict)
        self.run_shares: dict[DeviceId, int] = defaultdict(int)
        self.counters_left = {
            k: counters_left(p, owner.usage) for k, p in owner.pool_by_key.items()
        }
        self.run_counters: dict[tuple[str, str], dict[str, dict[str, int]]] = defaultdict(
            lambda: defaultdict(dict)
        )
        self.constraint_state: list[list[Any]] = [[] for _ in constraints]
        self.selector_cache: dict[tuple[int, DeviceId], Rejection | None] = {}
        self.all_cache: dict[int, list[Candidate]] = {}

    # --- search ------------------------------------------------------------------------

    def run(self) -> bool:
        return self._request(0)

    def _tick(self) -> None:
        self.steps += 1
        if self.steps > self.owner.max_steps:
            raise _Abort(
                f"claim {self.claim_name}: search limit of {self.owner.max_steps} steps reached"
            )

    def _request(self, ri: int) -> bool:
        if ri == len(self.requests):
            return True
        for alt in self.requests[ri].alternatives:
            if self._device(ri, alt, 0, 0):
                self.selected[ri] = alt
                return True
        return False

    def _device(self, ri: int, alt: Alternative, k: int, start: int) -> bool:
        self._tick()
        if alt.all_mode:
            devices = self._all_devices(alt)
            if not devices:
                return False
            if k == len(devices):
                return self._request(ri + 1)
            if len(self.picks) + len(devices) - k > MAX_RESULTS:
                return False
            outcome = self.check(alt, devices[k], constraints=True)
            if isinstance(outcome, Rejection):
                if outcome.kind == "constraint":
                    raise _Abort(
                        f"claim {self.claim_name}, request {alt.full_name}: cannot add device "
                        f"{devices[k].id} because a claim constraint would not be satisfied"
                    )
                return False
            self._apply(outcome)
            if self._device(ri, alt, k + 1, 0):
                return True
            self._undo(outcome)
            return False
        if k == alt.count:
            return self._request(ri + 1)
        if len(self.picks) + alt.count - k > MAX_RESULTS:
            return False
        candidates = self.owner.candidates
        for index in range(start, len(candidates)):
            cand = candidates[index]
            if not self.owner.pool_by_key[(cand.id.driver, cand.id.pool)].usable:
                continue
            outcome = self.check(alt, cand, constraints=True)
            if isinstance(outcome, Rejection):
                if outcome.kind == "selector-error":
                    raise _Abort(self._selector_error_text(outcome))
                continue
            self._apply(outcome)
            if self._device(ri, alt, k + 1, index):
                return True
            self._undo(outcome)
        return False

    def _selector_error_text(self, rejection: Rejection) -> str:
        d = rejection.details
        where = d["source"] if d["source"] != "request" else f"claim {self.claim_name}"
        return f"{where}: selector #{d['index']}: {d['error']}"

    def _all_devices(self, alt: Alternative) -> list[Candidate]:
        key = id(alt)
        if key not in self.all_cache:
            for pool in self.owner.pools:
                if pool.incomplete:
                    raise _Abort(
                        f"claim {self.claim_name}, request {alt.full_name}: asks for all "
                        f"devices, but resource pool {pool.driver}/{pool.name} is currently "
                        "being updated"
                    )
                if pool.invalid_reason:
                    raise _Abort(
                        f"claim {self.claim_name}, request {alt.full_name}: asks for all "
                        f"devices, but resource pool {pool.driver}/{pool.name} is currently "
                        f"invalid ({pool.invalid_reason})"
                    )
            selected = []
            for cand in self.owner.candidates:
                rejection = self._selectors(alt, cand)
                if rejection is None:
                    selected.append(cand)
                elif rejection.kind == "selector-error":
                    raise _Abort(self._selector_error_text(rejection))
            self.all_cache[key] = selected
        return self.all_cache[key]

    # --- checks ------------------------------------------------------------------------

    def _selectors(self, alt: Alternative, cand: Candidate) -> Rejection | None:
        key = (id(alt), cand.id)
        if key in self.selector_cache:
            return self.selector_cache[key]
        result: Rejection | None = None
        activation = self.owner.activation(cand)
        for sel in alt.selectors:
            details = {"source": sel.source, "index": sel.index, "expression": sel.expression}
            where = f"{sel.source} selector #{sel.index}"
            try:
                if isinstance(activation, CelEvalError):
                    raise activation
                matched = compile_selector(sel.expression).evaluate(activation)
            except CelCompileError as exc:
                details["error"] = f"CEL compile error: {exc.describe()}"
                result = Rejection(
                    "selector-error", cand.id, f"{where}: {details['error']}", details
                )
                break
            except CelEvalError as exc:
                details["error"] = f"CEL runtime error: {exc.message}"
                if exc.missing_key is not None:
                    details["missingKey"] = exc.missing_key
                result = Rejection(
                    "selector-error",
                    cand.id,
                    f"{where} fails on this device: {exc.message} (expression: {sel.expression})",
                    details,
                )
                break
            if not matched:
                result = Rejection(
                    "selector-false", cand.id, f"{where} is false: {sel.expression}", details
                )
                break
        self.selector_cache[key] = result
        return result

    def check(self, alt: Alternative, cand: Candidate, constraints: bool) -> Rejection | _Pick:
        """First failing check of ``cand`` for ``alt`` in the current state, or the pick."""
        pool_key = (cand.id.driver, cand.id.pool)
        pool = self.owner.pool_by_key[pool_key]
        if pool.incomplete:
            return Rejection(
                "pool-incomplete",
                cand.id,
                f"pool {pool.name} is incomplete (generation {pool.generation} is still being "
                "published)",
                {"pool": pool.name, "problem": "incomplete"},
            )
        if pool.invalid_reason:
            return Rejection(
                "pool-invalid",
                cand.id,
                f"pool {pool.name} is invalid: {pool.invalid_reason}",
                {"pool": pool.name, "problem": pool.invalid_reason},
            )
        in_use = self._in_use(alt, cand)
        if in_use is not None:
            return in_use
        rejection = self._selectors(alt, cand)
        if rejection is not None:
            return rejection
        consumed_or_rejection = self._capacity(alt, cand)
        if isinstance(consumed_or_rejection, Rejection):
            return consumed_or_rejection
        pick = _Pick(alt, cand, pool_key, consumed_or_rejection)
        rejection = self._counters(pick)
        if rejection is not None:
            return rejection
        rejection = self._taints(alt, cand)
        if rejection is not None:
            return rejection
        if constraints:
            rejection = self._constraints(pick)
            if rejection is not None:
                return rejection
        return pick

    def _in_use(self, alt: Alternative, cand: Candidate) -> Rejection | None:
        usage = self.owner.usage
        if alt.admin_access:
            by = self.run_exclusive.get(cand.id)
            if by is None and self.run_shares[cand.id]:
                by = next(p.alt.full_name for p in self.picks if p.cand.id == cand.id)
            if by is None:
                return None
            return Rejection(
                "already-allocated",
                cand.id,
                f"already picked for request {by} of this claim",
                {"by": f"request {by}"},
            )
        holder = usage.exclusive.get(cand.id)
        if holder is not None:
            return Rejection(
                "already-allocated", cand.id, f"allocated to claim {holder}", {"by": holder}
            )
        if not cand.multi:
            sharers = usage.sharers.get(cand.id)
            if sharers:
                return Rejection(
                    "already-allocated",
                    cand.id,
                    f"allocated to claim {sharers[0]}",
                    {"by": sharers[0]},
                )
            by = self.run_exclusive.get(cand.id)
            if by is not None:
                return Rejection(
                    "already-allocated",
                    cand.id,
                    f"already picked for request {by} of this claim",
                    {"by": f"request {by}"},
                )
        return None

    def _capacity(self, alt: Alternative, cand: Candidate) -> Rejection | dict[str, int] | None:
        capacities = cand.device.get("capacity") or {}
        driver = cand.id.driver
        requested: dict[str, int] = {}
        for name, amount in alt.capacity_requests.items():
            key = capacity_key(driver, capacities, name)
            if key is None:
                return Rejection(
                    "capacity-short",
                    cand.id,
                    f"device has no capacity {name!r}",
                    {
                        "capacity": name,
                        "requested": format_quantity(amount),
                        "available": None,
                        "shortBy": None,
                    },
                )
            value = self._value(cand, key)
            if amount > value:
                return self._short(
                    cand, key, amount, value, f"capacity {key} is {format_quantity(value)} in total"
                )
            requested[key] = amount
        if not cand.multi or alt.admin_access:
            return None
        consumed: dict[str, int] = {}
        for key, cap in capacities.items():
            share = consumed_amount(
                key, cap, requested.get(key), f"device {cand.id}: capacity[{key}]"
            )
            if isinstance(share, PolicyViolation):
                return Rejection(
                    "capacity-policy",
                    cand.id,
                    share.message(),
                    {
                        "capacity": key,
                        "requested": format_quantity(share.requested),
                        "rounded": None
                        if share.rounded is None
                        else format_quantity(share.rounded),
                        "policy": share.policy,
                    },
                )
            consumed[key] = share
        base = self.owner.usage.consumed.get(cand.id, {})
        run = self.run_consumed.get(cand.id, {})
        for key, amount in consumed.items():
            value = self._value(cand, key)
            left = value - base.get(key, 0) - run.get(key, 0)
            if amount > left:
                holders = self.owner.usage.sharers.get(cand.id, [])
                why = f"{format_quantity(max(left, 0))} of {format_quantity(value)} left"
                if holders:
                    why += f" (shared with {', '.join(sorted(set(holders)))})"
                return self._short(cand, key, amount, max(left, 0), why)
        return consumed

    def _short(self, cand: Candidate, key: str, amount: int, available: int, why: str) -> Rejection:
        return Rejection(
            "capacity-short",
            cand.id,
            f"needs {format_quantity(amount)} of {key}, {why}; short by "
            f"{format_quantity(amount - available)}",
            {
                "capacity": key,
                "requested": format_quantity(amount),
                "available": format_quantity(available),
                "shortBy": format_quantity(amount - available),
            },
        )

    @staticmethod
    def _value(cand: Candidate, key: str) -> int:
        raw = (cand.device.get("capacity") or {})[key].get("value")
        try:
            return quantity_int(raw)
        except QuantityError as exc:
            raise AllocatorInputError(f"device {cand.id}: capacity[{key}].value: {exc}") from None

    def _counters(self, pick: _Pick) -> Rejection | None:
        cand = pick.cand
        consumption = cand.device.get("consumesCounters") or []
        if not consumption:
            return None
        if cand.multi and (cand.id in self.owner.usage.allocated or self.run_shares[cand.id]):
            return None
        left = self.counters_left[pick.pool_key]
        used = self.run_counters[pick.pool_key]
        for entry in consumption:
            set_name = str(entry.get("counterSet"))
            available = left.get(set_name)
            if available is None:
                continue
            for counter, c in (entry.get("counters") or {}).items():
                if counter not in available:
                    continue
                need = quantity_int(c.get("value"))
                have = available[counter] - used[set_name].get(counter, 0)
                if need > have:
                    return Rejection(
                        "counter-short",
                        cand.id,
                        f"counter {set_name}/{counter}: needs {format_quantity(need)}, "
                        f"{format_quantity(max(have, 0))} left; short by "
                        f"{format_quantity(need - max(have, 0))}",
                        {
                            "counterSet": set_name,
                            "counter": counter,
                            "needed": format_quantity(need),
                            "available": format_quantity(max(have, 0)),
                            "shortBy": format_quantity(need - max(have, 0)),
                        },
                    )
                pick.counters.setdefault(set_name, {})[counter] = need
        return None

    @staticmethod
    def _taints(alt: Alternative, cand: Candidate) -> Rejection | None:
        for taint in cand.device.get("taints") or []:
            effect = taint.get("effect")
            if effect not in ("NoSchedule", "NoExecute"):
                continue
            if any(_tolerates(t, taint) for t in alt.tolerations):
                continue
            key, value = taint.get("key", ""), taint.get("value", "")
            shown = f"{key}={value}" if value else key
            return Rejection(
                "tainted",
                cand.id,
                f"taint {shown}:{effect} is not tolerated",
                {"key": key, "value": value, "effect": effect},
            )
        return None

    def _constraints(self, pick: _Pick) -> Rejection | None:
        for i, constraint in enumerate(self.constraints):
            if not constraint.applies_to(pick.alt):
                continue
            value = _attribute(pick.cand, constraint.attribute)
            details: dict[str, Any] = {
                "constraint": constraint.kind,
                "attribute": constraint.attribute,
            }
            if value is None:
                return Rejection(
                    "constraint",
                    pick.cand.id,
                    f"{constraint.kind} {constraint.attribute}: device lacks the attribute",
                    details,
                )
            details["value"] = _show(value)
            state = self.constraint_state[i]
            if constraint.kind == "matchAttribute" and state and state[0] != value:
                return Rejection(
                    "constraint",
                    pick.cand.id,
                    f"matchAttribute {constraint.attribute}: device has {_show(value)}, the "
                    f"devices already picked have {_show(state[0])}",
                    details,
                )
            if constraint.kind == "distinctAttribute" and value in state:
                return Rejection(
                    "constraint",
                    pick.cand.id,
                    f"distinctAttribute {constraint.attribute}: value {_show(value)} is already "
                    "taken by a picked device",
                    details,
                )
            pick.constraint_values.append((i, value))
        return None

    # --- state changes -----------------------------------------------------------------

    def _apply(self, pick: _Pick) -> None:
        dev = pick.cand.id
        if pick.alt.admin_access or not pick.cand.multi:
            self.run_exclusive.setdefault(dev, pick.alt.full_name)
        if pick.consumed is not None:
            run = self.run_consumed[dev]
            for key, amount in pick.consumed.items():
                run[key] = run.get(key, 0) + amount
            self.run_shares[dev] += 1
        used = self.run_counters[pick.pool_key]
        for set_name, counters in pick.counters.items():
            for counter, amount in counters.items():
                used[set_name][counter] = used[set_name].get(counter, 0) + amount
        for i, value in pick.constraint_values:
            self.constraint_state[i].append(value)
        self.picks.append(pick)

    def _undo(self, pick: _Pick) -> None:
        popped = self.picks.pop()
        assert popped is pick
        dev = pick.cand.id
        if self.run_exclusive.get(dev) == pick.alt.full_name and not any(
            p.cand.id == dev and (p.alt.admin_access or not p.cand.multi) for p in self.picks
        ):
            del self.run_exclusive[dev]
        if pick.consumed is not None:
            run = self.run_consumed[dev]
            for key, amount in pick.consumed.items():
                run[key] -= amount
            self.run_shares[dev] -= 1
        used = self.run_counters[pick.pool_key]
        for set_name, counters in pick.counters.items():
            for counter, amount in counters.items():
                used[set_name][counter] -= amount
        for i, value in pick.constraint_values:
            self.constraint_state[i].remove(value)

    # --- output ------------------------------------------------------------------------

    def build_allocation(self) -> dict[str, Any]:
        results = []
        for pick in self.picks:
            result: dict[str, Any] = {
                "request": pick.alt.full_name,
                "driver": pick.cand.id.driver,
                "pool": pick.cand.id.pool,
                "device": pick.cand.id.device,
            }
            if pick.alt.admin_access:
                result["adminAccess"] = True
            if pick.alt.tolerations:
                result["tolerations"] = [dict(t) for t in pick.alt.tolerations]
            if pick.consumed is not None:
                result["shareID"] = self.owner.share_ids()
                result["consumedCapacity"] = {
                    k: format_quantity(v) for k, v in pick.consumed.items()
                }
            results.append(result)
        devices: dict[str, Any] = {"results": results}
        config = self._configs()
        if config:
            devices["config"] = config
        allocation: dict[str, Any] = {"devices": devices}
        node_selector = self._node_selector()
        if node_selector is not None:
            allocation["nodeSelector"] = node_selector
        return allocation

    def _configs(self) -> list[dict[str, Any]]:
        """Class configs once per class (listing its requests), then claim configs."""
        out: list[dict[str, Any]] = []
        class_entries: dict[str, list[dict[str, Any]]] = {}
        for ri in range(len(self.requests)):
            alt = self.selected[ri]
            device_class = self.owner.classes.get(alt.class_name) or {}
            if alt.class_name in class_entries:
                for entry in class_entries[alt.class_name]:
                    entry["requests"].append(alt.full_name)
                continue
            entries = []
            for cfg in (device_class.get("spec") or {}).get("config") or []:
                entry = {"source": "FromClass", "requests": [alt.full_name]}
                entry.update({k: v for k, v in cfg.items() if k != "requests"})
                entries.append(entry)
            class_entries[alt.class_name] = entries
            out.extend(entries)
        claim_configs = ((self.claim.get("spec") or {}).get("devices") or {}).get("config") or []
        for cfg in claim_configs:
            wanted = cfg.get("requests") or []
            body = {k: v for k, v in cfg.items() if k != "requests"}
            if not wanted:
                out.append({"source": "FromClaim", **body})
                continue
            # One entry per matching request, as kube-scheduler writes it.
            for ri, request in enumerate(self.requests):
                alt = self.selected[ri]
                if request.name in wanted or (
                    alt.subrequest is not None and alt.full_name in wanted
                ):
                    out.append({"source": "FromClaim", "requests": list(wanted), **body})
        return out

    def _node_selector(self) -> dict[str, Any] | None:
        fields: list[Any] = []
        expressions: list[Any] = []
        for pick in self.picks:
            if pick.cand.node_name:
                return {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {
                                    "key": "metadata.name",
                                    "operator": "In",
                                    "values": [pick.cand.node_name],
                                }
                            ]
                        }
                    ]
                }
            terms = (pick.cand.node_selector or {}).get("nodeSelectorTerms") or []
            if len(terms) == 1:
                for req in terms[0].get("matchFields") or []:
                    if req not in fields:
                        fields.append(req)
                for req in terms[0].get("matchExpressions") or []:
                    if req not in expressions:
                        expressions.append(req)
        if not fields and not expressions:
            return None
        term: dict[str, Any] = {}
        if expressions:
            term["matchExpressions"] = expressions
        if fields:
            term["matchFields"] = fields
        return {"nodeSelectorTerms": [term]}

    # --- explanation -------------------------------------------------------------------

    def explain(self) -> list[RequestReport]:
        """Per request (per subrequest for ``firstAvailable``): every candidate's first
        failing check against the node's current allocations, and a summary."""
        fresh = _Search(self.owner, self.claim, self.requests, self.constraints)
        alts = [alt for request in self.requests for alt in request.alternatives]
        eligible: dict[int, list[Candidate]] = {}
        rejections: dict[int, list[Rejection]] = {}
        for alt in alts:
            ok, bad = [], []
            for cand in self.owner.candidates:
                outcome = fresh.check(alt, cand, constraints=False)
                if isinstance(outcome, Rejection):
                    bad.append(outcome)
                else:
                    ok.append(cand)
            eligible[id(alt)], rejections[id(alt)] = ok, bad
        for constraint in self.constraints:
            members = [a for a in alts if constraint.applies_to(a)]
            for alt in members:
                others = [o for o in members if o.request != alt.request]
                still_ok = []
                for cand in eligible[id(alt)]:
                    reason = self._constraint_reason(constraint, cand, others, eligible)
                    if reason is None:
                        still_ok.append(cand)
                    else:
                        rejections[id(alt)].append(reason)
                eligible[id(alt)] = still_ok
        reports = []
        for alt in alts:
            ok, bad = eligible[id(alt)], rejections[id(alt)]
            order = {c.id: c.position for c in self.owner.candidates}
            bad.sort(key=lambda r: order.get(r.device, 0))
            reports.append(
                RequestReport(
                    request=alt.full_name,
                    needed=None if alt.all_mode else alt.count,
                    eligible=[c.id for c in ok],
                    rejections=bad,
                    summary=self._summary(alt, ok, bad),
                )
            )
        return reports

    @staticmethod
    def _constraint_reason(
        constraint: Constraint,
        cand: Candidate,
        others: list[Alternative],
        eligible: dict[int, list[Candidate]],
    ) -> Rejection | None:
        value = _attribute(cand, constraint.attribute)
        details: dict[str, Any] = {"constraint": constraint.kind, "attribute": constraint.attribute}
        if value is None:
            return Rejection(
                "constraint",
                cand.id,
                f"{constraint.kind} {constraint.attribute}: device lacks the attribute",
                details,
            )
        details["value"] = _show(value)
        if constraint.kind != "matchAttribute":
            return None
        by_request: dict[str, bool] = {}
        for other in others:
            has = any(
                (c.id != cand.id or cand.multi) and _attribute(c, constraint.attribute) == value
                for c in eligible[id(other)]
            )
            by_request[other.request] = by_request.get(other.request, False) or has
        missing = sorted(r for r, has in by_request.items() if not has)
        if not missing:
            return None
        return Rejection(
            "constraint",
            cand.id,
            f"matchAttribute {constraint.attribute}: device has {_show(value)}, but no eligible "
            f"device of request {', '.join(missing)} has that value",
            details,
        )

    def _summary(self, alt: Alternative, ok: list[Candidate], bad: list[Rejection]) -> str:
        counts: dict[str, int] = defaultdict(int)
        for r in bad:
            counts[r.kind] += 1
        why = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
        total = len(ok) + len(bad)
        if alt.all_mode:
            if not ok:
                return f"asks for all matching devices, but none of {total} is usable ({why})"
            return f"asks for all matching devices; {len(ok)} usable" + (f", {why}" if why else "")
        if len(ok) < alt.count:
            if total == 0:
                return (
                    f"needs {alt.count} device(s); no device of any pool is visible from "
                    f"node {self.owner.node}"
                )
            return f"needs {alt.count} device(s), {len(ok)} of {total} eligible ({why})"
        return (
            f"needs {alt.count} device(s), {len(ok)} eligible on their own; the claim's requests "
            "cannot be satisfied together (constraints, or capacity and counters they share)"
        )


def allocate(
    claim: Mapping[str, Any],
    slices: Iterable[Mapping[str, Any]],
    classes: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
    allocated_claims: Iterable[Mapping[str, Any]] = (),
    node: str = "",
    *,
    node_labels: Mapping[str, str] | None = None,
    share_ids: ShareIdFactory | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> AllocationOutcome:
    """Allocate one claim on ``node``; see :class:`Allocator`.

    An allocation that ``claim`` itself already holds (same namespace and name among
    ``allocated_claims``) is left out, so an allocated claim can be explained again.
    """
    own = claim_name(claim)
    others = [c for c in allocated_claims if claim_name(c) != own]
    allocator = Allocator(slices, classes, others, node, node_labels, share_ids, max_steps)
    return allocator.allocate(claim)


def allocate_many(
    claims: Iterable[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    classes: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
    allocated_claims: Iterable[Mapping[str, Any]] = (),
    node: str = "",
    *,
    node_labels: Mapping[str, str] | None = None,
    share_ids: ShareIdFactory | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> list[AllocationOutcome]:
    """Allocate ``claims`` in order on ``node``; each sees the allocations before it."""
    allocator = Allocator(
        slices, classes, allocated_claims, node, node_labels, share_ids, max_steps
    )
    outcomes = []
    for claim in claims:
        outcome = allocator.allocate(claim)
        if outcome.allocation is not None:
            allocator.commit(claim, outcome.allocation)
        outcomes.append(outcome)
    return outcomes
