"""What the rest of a search depends on, so that a part of it started from a state met
before is settled without searching again.

From the start of a request (slot ``si``), or from the next device of an ExactCount request
(its ``picked`` devices so far, candidates from position ``start`` on), the outcome depends only
on: where the search is, the claim's result count and constraint values, the picks' hold on the
devices the rest of the search may pick (whether the slot's claim holds one, for admin access;
what the shares on a shared device take) and the counters of those devices' pools.
:meth:`SettledStates.key` is that state; the search records the outcome of a key when it is
not a success (an error stops the search, so it is never recorded). Only the time taken
changes: the devices picked are those kube-scheduler's search order gives.

Where the search cannot end at the result limit (``Search.lookahead``), devices that are
interchangeable for every remaining request (same selector outcome, a selector that fails to
evaluate included, same capacity outcome, taints, constraint attribute values, holders from
before, no counters; and on the same side of ``start``) are counted by kind instead of named:
a state and its image under swapping such devices either both fail, both succeed or both stop
with an error, because the search tries every combination in either and each check of a
device in one is a check of its like in the other.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .attributes import attribute
from .model import DeviceId, Rejection

if TYPE_CHECKING:
    from .pools import Candidate
    from .requests import Alternative
    from .search import Search, _Result

Key = tuple[Any, ...]


@dataclass
class _Context:
    """The devices the rest of a search may pick, from a request or from a device of one."""

    #: Alternatives still to be allocated (the current one first, for a device of one).
    alts: tuple[Alternative, ...]
    #: Names of the attributes the constraints of the claims still to be allocated compare.
    attributes: tuple[str, ...]
    #: Devices the requests after the current one may pick (with the current one: ``_next``).
    later: frozenset[DeviceId]
    #: Device -> position, of the current alternative's candidates (``_device``).
    positions: dict[DeviceId, int]
    pools: frozenset[tuple[str, str]]
    #: Device -> kind, worked out when first needed.
    kinds: dict[DeviceId, Hashable] = field(default_factory=dict)


class SettledStates:
    """Outcomes of parts of a search started from a state, by :meth:`key`.

    Preparing a key costs, once per slot or alternative, time linear in the devices, and per
    device held, time linear in the alternatives still to be allocated (the first time only).
    """

    def __init__(self) -> None:
        self.outcomes: dict[Key, _Result] = {}
        self._contexts: dict[tuple[int, int], _Context] = {}
        #: Per slot: the devices the requests from that slot on may pick.
        self._reach: dict[int, frozenset[DeviceId]] = {}
        self._usable_devices: frozenset[DeviceId] | None = None

    def key(self, search: Search, si: int, alt: Alternative | None, picked: int, start: int) -> Key:
        """The state the search from slot ``si`` on depends on; with ``alt``, from picking
        ``alt``'s devices after the first ``picked`` among its candidates from position
        ``start`` on."""
        ctx = self._context(search, si, alt)
        ci = search.slots[si][0]

        def place(dev: DeviceId) -> Hashable | None:
            position = ctx.positions.get(dev)
            ahead = position is not None and position >= start
            if not ahead and dev not in ctx.later:
                return None  # nothing after this point can pick it
            kind = ctx.kinds.get(dev)
            if kind is None:
                kind = ctx.kinds[dev] = _kind(search, ctx, search.owner.candidate_by_id[dev])
            return (kind, ahead)

        held: Counter[Hashable] = Counter()
        for dev, holders in search.run_exclusive.items():
            if holders and (where := place(dev)) is not None:
                held[(where, ci in holders)] += 1
        shared: Counter[Hashable] = Counter()
        for dev in search.shared_now:
            if (where := place(dev)) is not None:
                shared[(where, tuple(sorted(search.run_consumed[dev].items())))] += 1
        counters = frozenset(
            (pool, name, counter, used)
            for pool in ctx.pools
            for name, used_in_set in search.run_counters.get(pool, {}).items()
            for counter, used in used_in_set.items()
            if used
        )
        constraints = tuple(
            tuple(sorted(repr(v) for v in search.constraint_state.get((ci, i), ())))
            for i in range(len(search.plans[ci].constraints))
        )
        return (
            si,
            None if alt is None else id(alt),
            picked,
            start,
            search.claim_picks[ci],
            frozenset(held.items()),
            frozenset(shared.items()),
            counters,
            constraints,
        )

    def _context(self, search: Search, si: int, alt: Alternative | None) -> _Context:
        cached = self._contexts.get((si, id(alt)))
        if cached is not None:
            return cached
        first = si if alt is None else si + 1
        later = self._reachable(search, first)
        alts = [] if alt is None else [alt]
        for ci, ri in search.slots[first:]:
            alts.extend(search.plans[ci].requests[ri].alternatives)
        claims = sorted({ci for ci, _ in search.slots[si:]})
        attributes = tuple(c.attribute for ci in claims for c in search.plans[ci].constraints)
        positions: dict[DeviceId, int] = {}
        if alt is not None:
            positions = {c.id: i for i, c in _candidates(search, search.slots[si][0], alt)}
        pools = frozenset((d.driver, d.pool) for d in later | positions.keys())
        cached = _Context(tuple(alts), attributes, later, positions, pools)
        self._contexts[(si, id(alt))] = cached
        return cached

    def _reachable(self, search: Search, si: int) -> frozenset[DeviceId]:
        """The devices the requests from slot ``si`` on may pick, or more: for an ExactCount
        alternative those its selectors match (all of the usable pools' where that is not
        recorded), so that nothing is evaluated before the search reaches it."""
        if si == len(search.slots):
            return frozenset()
        cached = self._reach.get(si)
        if cached is None:
            ci, ri = search.slots[si]
            here: set[DeviceId] = set()
            for alt in search.plans[ci].requests[ri].alternatives:
                if alt.all_mode:
                    here.update(c.id for c in search.all_devices[id(alt)])
                elif id(alt) in search.matching:
                    here.update(search.matching[id(alt)])
                else:
                    here.update(self._usable(search))
            cached = self._reach[si] = self._reachable(search, si + 1) | here
        return cached

    def _usable(self, search: Search) -> frozenset[DeviceId]:
        if self._usable_devices is None:
            self._usable_devices = frozenset(
                c.id
                for c in search.owner.candidates
                if c.on_node and search.owner.pool_by_key[(c.id.driver, c.id.pool)].usable
            )
        return self._usable_devices


def _candidates(search: Search, ci: int, alt: Alternative) -> list[tuple[int, Candidate]]:
    """``(position, candidate)`` of the devices ``alt`` may pick."""
    if alt.all_mode:
        return [(c.position, c) for c in search.all_devices[id(alt)]]
    return search._worth_trying(alt, search.plans[ci].name)


def _kind(search: Search, ctx: _Context, cand: Candidate) -> Hashable:
    """What the remaining requests can tell of ``cand``, equal only for interchangeable
    devices (the device itself where kinds are not used or it stands apart). A request's
    capacity outcome is the one worked out (or, without a capacity request, worked out now),
    or else the device's capacities themselves: a request's amounts are only rounded, and a
    rounding may fail, when the search reaches it."""
    if not search.lookahead or cand.device.get("consumesCounters"):
        return cand.id
    usage = search.owner.usage
    outcomes: list[Hashable] = []
    for alt in ctx.alts:
        key = (id(alt), cand.id)
        if alt.all_mode or key not in search.selector_cache:
            return cand.id
        selected = search.selector_cache[key]
        if selected is not None:
            outcomes.append(selected.kind)  # the request cannot pick it
            continue
        demand = search.demand_cache.get(key)
        if demand is None and not alt.capacity_requests:
            demand = search._demand(alt, cand)  # the defaults: nothing to round, no error
        shown: Hashable
        if demand is None:  # not worked out before the search reaches it: the capacities
            shown = json.dumps(cand.device.get("capacity"), sort_keys=True, default=str)
        elif isinstance(demand, Rejection):
            shown = demand.kind
        elif cand.multi:
            shown = _items(demand)
        else:  # no pick consumes a dedicated device's capacity: it fits or never does
            shown = isinstance(search._capacity(alt, cand), Rejection)
        outcomes.append((shown, search._taints(alt, cand) is not None))
    attributes = tuple(attribute(cand, name) for name in ctx.attributes)
    return (
        cand.multi,
        tuple(outcomes),
        attributes,
        usage.exclusive.get(cand.id) is not None,
        bool(usage.sharers.get(cand.id)),
        _items(usage.consumed.get(cand.id)),
    )


def _items(mapping: dict[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
    return None if mapping is None else tuple(sorted(mapping.items()))
