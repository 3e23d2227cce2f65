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

Where the search cannot end in an error or at the result limit (``Search.lookahead``), devices
that are interchangeable for every remaining request (same selector and capacity outcome,
taints, constraint attribute values, holders from before, no counters; and on the same side of
``start``) are counted by kind instead of named: a state and its image under swapping such
devices either both fail or both succeed, because the search tries every combination in either.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .attributes import attribute
from .model import DeviceId, Rejection

if TYPE_CHECKING:
    from .pools import Candidate
    from .requests import Alternative
    from .search import Search, _Result

Key = tuple[Any, ...]


@dataclass(frozen=True)
class _Context:
    """The devices the rest of a search may pick, from a request or from a device of one."""

    #: Device -> kind (the device itself where kinds are not used).
    kinds: dict[DeviceId, Hashable]
    #: Devices the requests after the current one may pick (with the current one: ``_next``).
    later: frozenset[DeviceId]
    #: Device -> position, of the current alternative's candidates (``_device``).
    positions: dict[DeviceId, int]
    pools: frozenset[tuple[str, str]]


class SettledStates:
    """Outcomes of parts of a search started from a state, by :meth:`key`."""

    def __init__(self) -> None:
        self.outcomes: dict[Key, _Result] = {}
        self._contexts: dict[tuple[int, int], _Context] = {}

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
            return (ctx.kinds[dev], ahead)

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
        alts: list[Alternative] = [] if alt is None else [alt]
        cands: dict[DeviceId, Candidate] = {}
        for ci, ri in search.slots[first:]:
            for other in search.plans[ci].requests[ri].alternatives:
                alts.append(other)
                cands.update((c.id, c) for _, c in _candidates(search, ci, other))
        later = frozenset(cands)
        positions: dict[DeviceId, int] = {}
        if alt is not None:
            for position, cand in _candidates(search, search.slots[si][0], alt):
                positions[cand.id] = position
                cands[cand.id] = cand
        kinds: dict[DeviceId, Hashable] = {
            dev: _kind(search, si, alts, cand) if search.lookahead else dev
            for dev, cand in cands.items()
        }
        pools = frozenset((d.driver, d.pool) for d in cands)
        cached = self._contexts[(si, id(alt))] = _Context(kinds, later, positions, pools)
        return cached


def _candidates(search: Search, ci: int, alt: Alternative) -> list[tuple[int, Candidate]]:
    """``(position, candidate)`` of the devices ``alt`` may pick."""
    if alt.all_mode:
        return [(c.position, c) for c in search.all_devices[id(alt)]]
    return search._worth_trying(alt, search.plans[ci].name)


def _kind(search: Search, si: int, alts: list[Alternative], cand: Candidate) -> Hashable:
    """What the remaining requests can tell of ``cand``: equal for interchangeable devices."""
    if cand.device.get("consumesCounters"):
        return cand.id
    usage = search.owner.usage
    outcomes: list[Hashable] = []
    for alt in alts:
        key = (id(alt), cand.id)
        if alt.all_mode or key not in search.selector_cache:
            return cand.id  # keep the device apart
        selected = search.selector_cache[key]
        if selected is not None:
            outcomes.append(selected.kind)  # the request cannot pick it
            continue
        demand = search.demand_cache.get(key)
        if demand is None:
            return cand.id
        shown: Hashable
        if isinstance(demand, Rejection):
            shown = demand.kind
        elif cand.multi:
            shown = _items(demand)
        else:  # no pick consumes a dedicated device's capacity: it fits or never does
            shown = isinstance(search._capacity(alt, cand), Rejection)
        outcomes.append((shown, search._taints(alt, cand) is not None))
    claims = sorted({ci for ci, _ in search.slots[si:]})
    attributes = tuple(
        attribute(cand, c.attribute) for ci in claims for c in search.plans[ci].constraints
    )
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
