"""The depth-first search of kube-scheduler's structured allocator, over all claims of a pod.

As in ``k8s.io/dynamic-resource-allocation/structured`` (the ``incubating`` allocator of
Kubernetes 1.37): claims in order, their requests in order, ``firstAvailable`` subrequests in
their order, devices in pool, slice-name and slice order; a pick that leaves no completion
is undone and the next candidate tried, also across claims. Per candidate the checks run in
this order: in use, class and request selectors (a CEL error stops the allocation), capacity
(the request policy and what is left, for every device), counters, taints, constraints. An
``All`` request's devices are fixed before the search (selectors, and capacity were nothing
allocated); each is checked for use, counters, taints, constraints (breaking one stops the
allocation with an error) and last the capacity left, as in kube-scheduler's
``allocateDevice``, so a device that breaks a constraint stops the allocation even when its
capacity left is too small.

The result limit (32 devices per claim) works as upstream: a claim whose requests need more
devices at least is refused before the search; during the search a pick that would take the
claim past the limit abandons the subrequest, so the next ``firstAvailable`` entry is tried.

Invariant: between two picks the state (``picks``, in-use devices, consumed capacity and
counters, constraint values) is exactly the sum of the picks made; :meth:`Search._undo`
restores it pick by pick.
"""

from __future__ import annotations

import bisect
import enum
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sharegpu.cel import CelCompileError, CelEvalError, compile_selector
from sharegpu.kube.devicetaints import RULE_FIELD

from .attributes import attribute, show
from .capacity import (
    Amount,
    NotRepresentable,
    PolicyViolation,
    amount,
    consumed_amount,
    format_amount,
)
from .model import DeviceId, Rejection
from .pools import Candidate
from .requests import Alternative, Constraint, Request, claim_name
from .settled import SettledStates
from .usage import counters_left

if TYPE_CHECKING:
    from .allocator import Allocator

#: At most this many results per claim (``AllocationResultsMaxSize``).
MAX_RESULTS = 32
#: Step budget, over all requests of a search, of the probes checking whether a request can
#: be met alone.
PROBE_STEPS = 1_000


class SearchAbort(Exception):
    """The allocation stops with an error, as kube-scheduler's allocator returns one."""


class _Result(enum.Enum):
    DONE = "done"
    FAIL = "fail"
    #: A claim would get more than :data:`MAX_RESULTS` devices.
    EXCEEDED = "exceeded"


@dataclass
class ClaimPlan:
    """One claim of the pod with its parsed requests and constraints."""

    claim: Mapping[str, Any]
    requests: list[Request]
    constraints: list[Constraint]
    #: ``namespace/name`` of the claim.
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = claim_name(self.claim)


@dataclass
class Pick:
    """One device picked for one request (or subrequest) of claim number ``ci``."""

    ci: int
    alt: Alternative
    cand: Candidate
    pool_key: tuple[str, str]
    #: Capacity this pick consumes on a shared device (``None`` for a dedicated device).
    consumed: dict[str, Amount] | None
    counters: dict[str, dict[str, Amount]] = field(default_factory=dict)
    constraint_values: list[tuple[int, Any]] = field(default_factory=list)


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


class Search:
    """One joint search over ``plans`` (the claims of one pod) against ``owner``'s state."""

    def __init__(self, owner: Allocator, plans: list[ClaimPlan]) -> None:
        self.owner = owner
        self.plans = plans
        self.slots = [(ci, ri) for ci, plan in enumerate(plans) for ri in range(len(plan.requests))]
        self.steps = 0
        self.picks: list[Pick] = []
        self.claim_picks = [0] * len(plans)
        self.selected: dict[tuple[int, int], Alternative] = {}
        #: Device -> claim indices holding it without a share, in this search.
        self.run_exclusive: dict[DeviceId, list[int]] = defaultdict(list)
        self.run_consumed: dict[DeviceId, dict[str, Amount]] = defaultdict(dict)
        self.run_shares: dict[DeviceId, int] = defaultdict(int)
        self.counters_left = {
            k: counters_left(p, owner.usage) for k, p in owner.pool_by_key.items()
        }
        self.run_counters: dict[tuple[str, str], dict[str, dict[str, Amount]]] = defaultdict(
            lambda: defaultdict(dict)
        )
        self.constraint_state: dict[tuple[int, int], list[Any]] = defaultdict(list)
        self.selector_cache: dict[tuple[int, DeviceId], Rejection | None] = {}
        self.worth_trying: dict[int, list[tuple[int, Candidate]]] = {}
        self.demand_cache: dict[
            tuple[int, DeviceId], Rejection | dict[str, tuple[Amount, Amount]]
        ] = {}
        self.all_devices: dict[int, list[Candidate]] = {}
        #: Set by :meth:`prepare`: some request cannot be met whatever the search does.
        self.hopeless = False
        self.matching: dict[int, set[DeviceId]] = {}
        self.free: dict[int, int] = {}
        #: Slots (indices into ``slots``) of requests with a selector that fails to evaluate
        #: on some usable device: the search may stop with that error there.
        self.erring: set[int] = set()
        #: No claim can reach the result limit (whose handling depends on where it is hit):
        #: the look-ahead of :meth:`_later_requests_can_be_met` prunes the search, and
        #: :mod:`.settled` counts interchangeable devices by kind.
        self.lookahead = False
        #: Shared devices this search has picked (their capacity left changed).
        self.shared_now: set[DeviceId] = set()
        #: A probe of :meth:`_alone_impossible` (which probes no further).
        self.probe = False
        self.max_steps = owner.max_steps
        #: Outcomes (never success) of requests started from a state met before.
        self.settled = SettledStates()

    # --- before the search ---------------------------------------------------------------

    def prepare(self) -> None:
        """Validate the claims as kube-scheduler does before it searches, stopping at the
        first problem in its order: claims in order, their requests in order and each
        ``firstAvailable`` entry in order; per entry its device class, then for ``All`` the
        pools in order (one being updated or invalid stops the allocation, the selectors of
        the pools before it are evaluated first); per request the result limit."""
        for plan in self.plans:
            taken = 0
            for request in plan.requests:
                sizes = []
                for alt in request.alternatives:
                    if not alt.class_found:
                        raise SearchAbort(
                            f"claim {plan.name}, request {alt.full_name}: could not retrieve "
                            f"device class {alt.class_name}: not found"
                        )
                    if alt.all_mode:
                        self.all_devices[id(alt)] = self._collect_all(plan, alt)
                        sizes.append(len(self.all_devices[id(alt)]))
                    else:
                        sizes.append(alt.count)
                adding = min(sizes)
                if adding > MAX_RESULTS - taken:
                    raise SearchAbort(
                        f"claim {plan.name}, request {request.name}: adding {adding} devices "
                        f"exceeds the claim limit of {MAX_RESULTS}, with {taken} already "
                        "accounted for"
                    )
                taken += adding
        self.hopeless = self._some_request_cannot_be_met()

    def _some_request_cannot_be_met(self) -> bool:
        """Whether some request has, in every alternative, fewer devices whose selectors
        match and whose capacity could hold it than it needs, so no search can succeed.

        Nothing is decided (and nothing recorded) when an ``All`` alternative is subject to a
        constraint: kube-scheduler's search stops with an error where such a device breaks it.
        Also records, per ExactCount alternative without admin access, the devices whose
        selectors match (``matching``) and how many of them no pick holds (``free``), for the
        look-ahead of :meth:`_later_requests_can_be_met`, and the requests with a selector
        that fails to evaluate on some device (``erring``). The search must stop with that
        error where kube-scheduler's would, so only the requests before the first such one
        (claims and requests in search order) decide: when one of those cannot be met, the
        search never reaches the failing selector and answers "unsatisfiable".
        """
        if any(
            alt.all_mode and any(c.applies_to(alt) for c in plan.constraints)
            for plan in self.plans
            for request in plan.requests
            for alt in request.alternatives
        ):
            return False  # kube-scheduler's search may stop with the All constraint error
        hopeless = False
        for si, (ci, ri) in enumerate(self.slots):
            plan = self.plans[ci]
            met = False
            for alt in plan.requests[ri].alternatives:
                if alt.all_mode:
                    met = met or self._all_can_be_met(ci, alt)
                    continue
                matching: set[DeviceId] = set()
                errs = False
                for cand in self.owner.candidates:
                    if not self.owner.pool_by_key[(cand.id.driver, cand.id.pool)].usable:
                        continue
                    rejection = self.selectors(alt, cand, plan.name)
                    if rejection is not None and rejection.kind == "selector-error":
                        errs = True
                    elif rejection is None and self._could_fit(alt, cand):
                        matching.add(cand.id)
                if errs:
                    self.erring.add(si)  # the search may stop here: never counted as unmet
                elif not alt.admin_access:
                    self.matching[id(alt)] = matching
                    self.free[id(alt)] = len(matching)
                met = met or errs or len(matching) >= alt.count
            if not any(e < si for e in self.erring):
                hopeless = hopeless or not met
        self.lookahead = all(self._most_devices(plan) <= MAX_RESULTS for plan in self.plans)
        if hopeless or self.erring or self.probe or len(self.slots) < 2:
            return hopeless
        budget = PROBE_STEPS
        for plan in self.plans:
            for request in plan.requests:
                impossible, used = self._alone_impossible(plan, request, budget)
                if impossible:
                    return True
                budget -= used
                if budget <= 0:
                    return False
        return False

    def _all_can_be_met(self, ci: int, alt: Alternative) -> bool:
        """Whether ``All`` alternative ``alt`` of claim ``ci`` may be met: its devices, taken
        one by one as the search takes them, from the state before any pick. A pick of the
        search only holds a device or consumes capacity and counters, so a device refused
        now is refused in every state the search reaches; and with no constraint on an
        ``All`` alternative (:meth:`_some_request_cannot_be_met` decides nothing otherwise)
        that refusal is a failure, never an error. True (undecided) when a capacity request
        cannot be represented: the search meets that error where kube-scheduler's does."""
        taken: list[Pick] = []
        try:
            for cand in self.all_devices[id(alt)]:
                outcome = self.check(ci, alt, cand, constraints=False)
                if isinstance(outcome, Rejection):
                    return False
                self._apply(outcome)
                taken.append(outcome)
        except NotRepresentable:
            return True
        finally:
            for pick in reversed(taken):
                self._undo(pick)
        return bool(self.all_devices[id(alt)])

    def _alone_impossible(self, plan: ClaimPlan, request: Request, budget: int) -> tuple[bool, int]:
        """Whether ``request`` cannot be met even alone (its claim's constraints kept, no other
        request's picks): then no joint search can meet it either; and the steps that took.
        Undecided (False) when ``budget`` steps do not settle it or the probe stops with an
        error, which the joint search then meets where kube-scheduler's would."""
        probe = Search(self.owner, [ClaimPlan(plan.claim, [request], plan.constraints)])
        probe.probe = True
        probe.max_steps = budget
        try:
            probe.prepare()
            return not probe.run(), probe.steps
        except (SearchAbort, NotRepresentable):
            return False, probe.steps

    @staticmethod
    def _most_devices(plan: ClaimPlan) -> int:
        """An upper bound of the devices ``plan`` can get (``All``: every candidate)."""
        return sum(
            max(10**6 if alt.all_mode else alt.count for alt in request.alternatives)
            for request in plan.requests
        )

    def _later_requests_can_be_met(self, si: int) -> bool:
        """Whether every request after slot ``si`` still has, in some alternative, enough
        matching devices that no pick holds exclusively.

        Only consulted when no claim can reach the result limit (so no subtree ends in the
        limit, whose handling depends on where it was hit): then a failing look-ahead means
        the subtree has no completion and pruning it changes nothing but the time taken.
        """
        if si in self.erring:
            return True  # this request's next picks may meet its failing selector
        for sj in range(si + 1, len(self.slots)):
            if sj in self.erring:
                return True  # the search may stop with that request's error before failing
            ci, ri = self.slots[sj]
            if not any(
                id(alt) not in self.free or self._available(alt) >= alt.count
                for alt in self.plans[ci].requests[ri].alternatives
            ):
                return False
        return True

    def _available(self, alt: Alternative) -> int:
        """Matching devices of ``alt`` that no pick holds exclusively, less the shared ones
        whose capacity left (after this search's picks) can no longer hold ``alt``."""
        count = self.free[id(alt)]
        if count < alt.count:
            return count
        matching = self.matching[id(alt)]
        for dev in self.shared_now:
            if dev not in matching:
                continue
            try:
                short = self._capacity(alt, self.owner.candidate_by_id[dev])
            except NotRepresentable:
                continue  # counted: the search meets the error where kube-scheduler's does
            if isinstance(short, Rejection):
                count -= 1
        return count

    def _collect_all(self, plan: ClaimPlan, alt: Alternative) -> list[Candidate]:
        """The devices an ``All`` request takes: those matching its selectors whose capacity
        could hold its capacity request were nothing allocated (:meth:`_fits_empty`: a device
        other claims exhausted stays in the set, so the request cannot be met, as with
        kube-scheduler). Pool by pool: an incomplete or invalid pool stops the allocation,
        and so does a selector failing on a device of a pool before it."""
        selected = []
        for pool in self.owner.pools:
            state = "being updated" if pool.incomplete else "invalid" if pool.invalid_reason else ""
            if state:
                raise SearchAbort(
                    f"claim {plan.name}, request {alt.full_name}: asks for all devices, but "
                    f"resource pool {pool.driver}/{pool.name} is currently {state}"
                )
            for cand in pool.candidates:
                rejection = self.selectors(alt, cand, plan.name)
                if rejection is None:
                    if self._fits_empty(alt, cand):
                        selected.append(cand)
                elif rejection.kind == "selector-error":
                    raise SearchAbort(selector_error_text(rejection, plan.name))
        return selected

    # --- search ------------------------------------------------------------------------

    def run(self) -> bool:
        """Whether every claim got its devices; ``picks`` then holds them."""
        if self.hopeless:
            return False
        return self._next(0) is _Result.DONE

    def _tick(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            names = ", ".join(p.name for p in self.plans)
            raise SearchAbort(f"claim {names}: search limit of {self.max_steps} steps reached")

    def _next(self, si: int) -> _Result:
        if si == len(self.slots):
            return _Result.DONE
        key = self.settled.key(self, si, None, 0, 0)
        settled = self.settled.outcomes.get(key)
        if settled is not None:
            return settled
        result = self._request(si)
        if si > 0 and self.slots[si - 1][0] != self.slots[si][0] and result is _Result.EXCEEDED:
            result = _Result.FAIL  # a later claim's limit does not abandon this one's subrequest
        if result is not _Result.DONE:
            self.settled.outcomes[key] = result
        return result

    def _request(self, si: int) -> _Result:
        ci, ri = self.slots[si]
        request = self.plans[ci].requests[ri]
        if request.alternatives[0].subrequest is None:
            result = self._device(si, request.alternatives[0], 0, 0)
            if result is _Result.DONE:
                self.selected[(ci, ri)] = request.alternatives[0]
            return result
        all_exceeded = True
        for alt in request.alternatives:
            result = self._device(si, alt, 0, 0)
            if result is _Result.EXCEEDED:
                continue
            all_exceeded = False
            if result is _Result.DONE:
                self.selected[(ci, ri)] = alt
                return result
        return _Result.EXCEEDED if all_exceeded else _Result.FAIL

    def _device(self, si: int, alt: Alternative, k: int, start: int) -> _Result:
        self._tick()
        ci = self.slots[si][0]
        if alt.all_mode:
            devices = self.all_devices[id(alt)]
            if not devices:
                return _Result.FAIL
            needed = len(devices)
        else:
            needed = alt.count
        if k == needed:
            return self._next(si + 1)
        if self.claim_picks[ci] + needed - k > MAX_RESULTS:
            return _Result.EXCEEDED
        if alt.all_mode:
            outcome = self.check(ci, alt, devices[k], constraints=True)
            if isinstance(outcome, Rejection):
                if outcome.kind == "constraint":
                    raise SearchAbort(
                        f"claim {self.plans[ci].name}, request {alt.full_name}: cannot add "
                        f"device {devices[k].id} because a claim constraint would not be "
                        "satisfied"
                    )
                return _Result.FAIL
            self._apply(outcome)
            result = self._device(si, alt, k + 1, 0)
            if result is not _Result.DONE:
                self._undo(outcome)
            return result
        key = self.settled.key(self, si, alt, k, start)
        settled = self.settled.outcomes.get(key)
        if settled is not None:
            return settled
        result = self._pick(si, alt, k, start)
        if result is not _Result.DONE:
            self.settled.outcomes[key] = result
        return result

    def _pick(self, si: int, alt: Alternative, k: int, start: int) -> _Result:
        """Pick device ``k`` of ExactCount ``alt`` among its candidates from ``start`` on."""
        ci = self.slots[si][0]
        candidates = self._worth_trying(alt, self.plans[ci].name)
        for index, cand in candidates[bisect.bisect_left(candidates, start, key=_first) :]:
            outcome = self.check(ci, alt, cand, constraints=True)
            if isinstance(outcome, Rejection):
                if outcome.kind == "selector-error":
                    raise SearchAbort(selector_error_text(outcome, self.plans[ci].name))
                continue
            self._apply(outcome)
            if self.lookahead and not self._later_requests_can_be_met(si):
                self._undo(outcome)
                continue
            result = self._device(si, alt, k + 1, index + 1)
            if result is _Result.DONE:
                return result
            self._undo(outcome)
            if result is _Result.EXCEEDED:
                return result
        return _Result.FAIL

    def _worth_trying(self, alt: Alternative, claim: str) -> list[tuple[int, Candidate]]:
        """``(position, candidate)`` of the devices that may serve ``alt``: in a usable pool,
        not ruled out by its selectors or by its capacity request whatever is picked. A
        device whose selector fails to evaluate stays, so the search meets that error where
        kube-scheduler's does. Skipping the others changes nothing but the time taken."""
        cached = self.worth_trying.get(id(alt))
        if cached is None:
            cached = []
            for index, cand in enumerate(self.owner.candidates):
                if not self.owner.pool_by_key[(cand.id.driver, cand.id.pool)].usable:
                    continue
                rejection = self.selectors(alt, cand, claim)
                if rejection is not None and rejection.kind != "selector-error":
                    continue
                if rejection is None and self._never_fits(alt, cand):
                    continue
                cached.append((index, cand))
            self.worth_trying[id(alt)] = cached
        return cached

    def _never_fits(self, alt: Alternative, cand: Candidate) -> bool:
        """Whether no pick of ``cand`` can hold ``alt``'s capacity request, whatever is
        picked (False when the request cannot be represented: the search meets that error)."""
        try:
            return isinstance(self._demand(alt, cand), Rejection)
        except NotRepresentable:
            return False

    # --- checks ------------------------------------------------------------------------

    def selectors(self, alt: Alternative, cand: Candidate, claim: str) -> Rejection | None:
        """The first class or request selector that is false on ``cand`` (or fails), then,
        as kube-scheduler's ``isSelectable``, whether ``cand`` is available on the node."""
        key = (id(alt), cand.id)
        if key in self.selector_cache:
            return self.selector_cache[key]
        result: Rejection | None = None
        activation = self.owner.activation(cand)
        for sel in alt.selectors:
            details: dict[str, Any] = {
                "source": sel.source,
                "index": sel.index,
                "expression": sel.expression,
            }
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
        if result is None and not cand.on_node:
            node = self.owner.node
            result = Rejection(
                "other-node", cand.id, f"not available on node {node}", {"node": node}
            )
        self.selector_cache[key] = result
        return result

    def check(
        self, ci: int, alt: Alternative, cand: Candidate, constraints: bool
    ) -> Rejection | Pick:
        """First failing check of ``cand`` for ``alt`` of claim ``ci`` now, or the pick."""
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
        in_use = self._in_use(ci, alt, cand)
        if in_use is not None:
            return in_use
        rejection = self.selectors(alt, cand, self.plans[ci].name)
        if rejection is not None:
            return rejection
        # kube-scheduler checks the capacity left before it takes an ExactCount device, and
        # an All device (whose capacity with nothing allocated was checked when it was
        # collected) last.
        pick = Pick(ci, alt, cand, pool_key, None)
        if not alt.all_mode:
            rejection = self._capacity_of(pick)
            if rejection is not None:
                return rejection
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
        if alt.all_mode:
            return self._capacity_of(pick) or pick
        return pick

    def _capacity_of(self, pick: Pick) -> Rejection | None:
        """Sets what ``pick`` consumes, or says why its device cannot hold it now."""
        consumed_or_rejection = self._capacity(pick.alt, pick.cand)
        if isinstance(consumed_or_rejection, Rejection):
            return consumed_or_rejection
        pick.consumed = consumed_or_rejection
        return None

    def _picked_by(self, ci: int, holder: int) -> str:
        """Who in this search holds a device: a request of this claim or another claim."""
        if holder == ci:
            by = next(p.alt.full_name for p in self.picks if p.ci == ci)
            return f"request {by}"
        return self.plans[holder].name

    def _in_use(self, ci: int, alt: Alternative, cand: Candidate) -> Rejection | None:
        usage = self.owner.usage
        holders = self.run_exclusive.get(cand.id) or []
        if alt.admin_access:
            if cand.multi or ci not in holders:
                return None
            return Rejection(
                "already-allocated",
                cand.id,
                "already picked for this claim",
                {"by": self._picked_by(ci, ci)},
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
        if holders:
            by = self._picked_by(ci, holders[0])
            text = f"already picked for {by}" if by.startswith("request") else f"picked for {by}"
            return Rejection("already-allocated", cand.id, text, {"by": by})
        return None

    def _capacity(self, alt: Alternative, cand: Candidate) -> Rejection | dict[str, Amount] | None:
        """What a pick of ``cand`` consumes (``None`` on a dedicated device), or why the
        device cannot hold ``alt``'s capacity request (``CmpRequestOverCapacity``)."""
        static = self._demand(alt, cand)
        if isinstance(static, Rejection):
            return static
        base = self.owner.usage.consumed.get(cand.id, {})
        run = self.run_consumed.get(cand.id, {})
        for key, (share, value) in static.items():
            left = value - base.get(key, Amount(0)) - run.get(key, Amount(0))
            if share > left:
                holders = self.owner.usage.sharers.get(cand.id, [])
                if left == value:
                    why = f"capacity {key} is {format_amount(value)} in total"
                else:
                    why = f"{format_amount(max(left, Amount(0)))} of {format_amount(value)} left"
                if holders:
                    why += f" (shared with {', '.join(sorted(set(holders)))})"
                return _short(cand, key, share, max(left, Amount(0)), why)
        return {key: share for key, (share, _) in static.items()} if cand.multi else None

    def _could_fit(self, alt: Alternative, cand: Candidate) -> bool:
        """Whether ``cand`` could ever hold one pick for ``alt`` (:meth:`_fits_empty`); a
        request the range arithmetic cannot represent counts as fitting, so the search meets
        that error where kube-scheduler's does."""
        try:
            return self._fits_empty(alt, cand)
        except NotRepresentable:
            return True

    def _fits_empty(self, alt: Alternative, cand: Candidate) -> bool:
        """Whether one pick of ``cand`` for ``alt`` fits the device's capacity with nothing
        else consumed (kube-scheduler's static capacity check of an ``All`` request)."""
        demand = self._demand(alt, cand)
        if isinstance(demand, Rejection):
            return False
        return all(share <= value for share, value in demand.values())

    def _demand(
        self, alt: Alternative, cand: Candidate
    ) -> Rejection | dict[str, tuple[Amount, Amount]]:
        """Per capacity of ``cand``: what one pick for ``alt`` consumes and the capacity's
        value; or why no pick can (a capacity it lacks, a request above the value or against
        the request policy). Depends on nothing picked, so computed once per pair. Raises
        :class:`NotRepresentable` for a request the range arithmetic cannot represent; the
        callers that only prune leave such a device in, so the search meets the error where
        kube-scheduler's does."""
        key = (id(alt), cand.id)
        cached = self.demand_cache.get(key)
        if cached is not None:
            return cached
        capacities: Mapping[str, Any] = cand.device.get("capacity") or {}
        missing = next((n for n in alt.capacity_requests if n not in capacities), None)
        if missing is not None:
            result: Rejection | dict[str, tuple[Amount, Amount]] = Rejection(
                "capacity-short",
                cand.id,
                f"device has no capacity {missing!r}",
                {
                    "capacity": missing,
                    "requested": format_amount(alt.capacity_requests[missing]),
                    "available": None,
                    "shortBy": None,
                },
            )
            self.demand_cache[key] = result
            return result
        # Every capacity is rounded first: a request that cannot be represented stops the
        # allocation (NotRepresentable) whatever else would reject the device.
        shares = {
            name: consumed_amount(
                name, cap, alt.capacity_requests.get(name), f"device {cand.id}: capacity[{name}]"
            )
            for name, cap in capacities.items()
        }
        values = {
            name: amount(cap.get("value"), f"device {cand.id}: capacity[{name}].value")
            for name, cap in capacities.items()
        }
        result = {}
        for name, requested in alt.capacity_requests.items():
            if requested > values[name]:
                # Rejected whatever the policy (rounding only goes up); said as the cause.
                why = f"capacity {name} is {format_amount(values[name])} in total"
                result = _short(cand, name, requested, values[name], why)
                break
        else:
            demand: dict[str, tuple[Amount, Amount]] = {}
            for name, share in shares.items():
                if isinstance(share, PolicyViolation):
                    result = _policy_rejection(cand, share)
                    break
                demand[name] = (share, values[name])
            else:
                result = demand
        self.demand_cache[key] = result
        return result

    def _counters(self, pick: Pick) -> Rejection | None:
        cand = pick.cand
        consumption = cand.device.get("consumesCounters") or []
        if not consumption:
            return None
        if cand.multi and (cand.id in self.owner.usage.consumed or self.run_shares[cand.id]):
            return None
        left = self.counters_left[pick.pool_key]
        used = self.run_counters[pick.pool_key]
        for entry in consumption:
            set_name = str(entry.get("counterSet"))
            available = left.get(set_name, {})
            for counter, c in (entry.get("counters") or {}).items():
                need = amount(c.get("value"), f"device {cand.id}: counter {set_name}/{counter}")
                have = available.get(counter, Amount(0)) - used[set_name].get(counter, Amount(0))
                if need > have:
                    short = need - max(have, Amount(0))
                    return Rejection(
                        "counter-short",
                        cand.id,
                        f"counter {set_name}/{counter}: needs {format_amount(need)}, "
                        f"{format_amount(max(have, Amount(0)))} left; short by "
                        f"{format_amount(short)}",
                        {
                            "counterSet": set_name,
                            "counter": counter,
                            "needed": format_amount(need),
                            "available": format_amount(max(have, Amount(0))),
                            "shortBy": format_amount(short),
                        },
                    )
                pick.counters.setdefault(set_name, {})[counter] = need
        # kube-scheduler then checks every counter of the pool, not only those the device
        # consumes: one that allocated devices over-consumed (below zero) refuses the device.
        for set_name, counters in left.items():
            for counter, have in counters.items():
                if have < Amount(0):
                    return Rejection(
                        "counter-short",
                        cand.id,
                        f"counter {set_name}/{counter} of the pool is over-consumed by "
                        f"allocated devices ({format_amount(have)} left)",
                        {
                            "counterSet": set_name,
                            "counter": counter,
                            "needed": "0",
                            "available": "0",
                            "shortBy": format_amount(-have),
                        },
                    )
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
            details = {"key": key, "value": value, "effect": effect}
            message = f"taint {shown}:{effect} is not tolerated"
            rule = taint.get(RULE_FIELD)
            if rule is not None:
                details["deviceTaintRule"] = rule
                message += f" (from DeviceTaintRule {rule})"
            return Rejection("tainted", cand.id, message, details)
        return None

    def _constraints(self, pick: Pick) -> Rejection | None:
        for i, constraint in enumerate(self.plans[pick.ci].constraints):
            if not constraint.applies_to(pick.alt):
                continue
            value = attribute(pick.cand, constraint.attribute)
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
            state = self.constraint_state[(pick.ci, i)]
            if (constraint.kind == "matchAttribute" and state and state[0] != value) or (
                constraint.kind == "distinctAttribute" and value in state
            ):
                details["value"] = show(value)
            if constraint.kind == "matchAttribute" and state and state[0] != value:
                return Rejection(
                    "constraint",
                    pick.cand.id,
                    f"matchAttribute {constraint.attribute}: device has {show(value)}, the "
                    f"devices already picked have {show(state[0])}",
                    details,
                )
            if constraint.kind == "distinctAttribute" and value in state:
                return Rejection(
                    "constraint",
                    pick.cand.id,
                    f"distinctAttribute {constraint.attribute}: value {show(value)} is already "
                    "taken by a picked device",
                    details,
                )
            pick.constraint_values.append((i, value))
        return None

    # --- state changes -----------------------------------------------------------------

    def _apply(self, pick: Pick) -> None:
        dev = pick.cand.id
        if not pick.cand.multi:
            if not self.run_exclusive[dev]:
                self._count_free(dev, -1)
            self.run_exclusive[dev].append(pick.ci)
        if pick.consumed is not None:
            run = self.run_consumed[dev]
            for key, used in pick.consumed.items():
                run[key] = run.get(key, Amount(0)) + used
            self.run_shares[dev] += 1
            self.shared_now.add(dev)
        counters = self.run_counters[pick.pool_key]
        for set_name, needs in pick.counters.items():
            for counter, need in needs.items():
                counters[set_name][counter] = counters[set_name].get(counter, Amount(0)) + need
        for i, value in pick.constraint_values:
            self.constraint_state[(pick.ci, i)].append(value)
        self.picks.append(pick)
        self.claim_picks[pick.ci] += 1

    def _count_free(self, dev: DeviceId, change: int) -> None:
        for key, matching in self.matching.items():
            if dev in matching:
                self.free[key] += change

    def _undo(self, pick: Pick) -> None:
        popped = self.picks.pop()
        assert popped is pick
        self.claim_picks[pick.ci] -= 1
        dev = pick.cand.id
        if not pick.cand.multi:
            self.run_exclusive[dev].remove(pick.ci)
            if not self.run_exclusive[dev]:
                self._count_free(dev, +1)
        if pick.consumed is not None:
            run = self.run_consumed[dev]
            for key, used in pick.consumed.items():
                run[key] -= used
            self.run_shares[dev] -= 1
            if not self.run_shares[dev]:
                self.shared_now.discard(dev)
        counters = self.run_counters[pick.pool_key]
        for set_name, needs in pick.counters.items():
            for counter, need in needs.items():
                counters[set_name][counter] -= need
        for i, value in pick.constraint_values:
            self.constraint_state[(pick.ci, i)].remove(value)


def _first(entry: tuple[int, Candidate]) -> int:
    return entry[0]


def selector_error_text(rejection: Rejection, claim: str) -> str:
    """kube-scheduler's error for a selector that fails to compile or evaluate."""
    d = rejection.details
    where = d["source"] if d["source"] != "request" else f"claim {claim}"
    if "CEL runtime error" in d["error"]:
        return f"{where}: selector #{d['index']} on device {rejection.device}: {d['error']}"
    return f"{where}: selector #{d['index']}: {d['error']}"


def _policy_rejection(cand: Candidate, share: PolicyViolation) -> Rejection:
    return Rejection(
        "capacity-policy",
        cand.id,
        share.message(),
        {
            "capacity": share.capacity,
            "requested": format_amount(share.requested),
            "rounded": None if share.rounded is None else format_amount(share.rounded),
            "policy": share.policy,
        },
    )


def _short(cand: Candidate, key: str, need: Amount, available: Amount, why: str) -> Rejection:
    return Rejection(
        "capacity-short",
        cand.id,
        f"needs {format_amount(need)} of {key}, {why}; short by {format_amount(need - available)}",
        {
            "capacity": key,
            "requested": format_amount(need),
            "available": format_amount(available),
            "shortBy": format_amount(need - available),
        },
    )
