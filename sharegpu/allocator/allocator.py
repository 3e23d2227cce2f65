"""A pure-Python allocator with kube-scheduler's structured-parameters semantics.

:class:`Allocator` holds the node's pools, the device classes and what allocated claims
hold; :meth:`Allocator.allocate_pod` allocates the claims of one pod together in one search
(:mod:`.search`), as kube-scheduler does, so claims that only fit together are allocated.
:meth:`Allocator.allocate` is the one-claim case. A failed claim is explained per request by
:mod:`.explanation`.

Deterministic: the same input (and the same share-ID generator) gives the same output.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sharegpu.cel import CelEvalError, device_activation
from sharegpu.kube.devicetaints import with_rule_taints

from .explanation import explain
from .model import AllocationOutcome, AllocatorInputError, DeviceId
from .output import build_allocation
from .pools import Candidate, Pool, gather_pools
from .requests import claim_name, parse_requests
from .search import ClaimPlan, Search, SearchAbort
from .usage import Usage

ShareIdFactory = Callable[[], str]

#: The search gives up after this many device placements (kube-scheduler bounds it by time).
#: Look-ahead and pruning (:mod:`.search`) and settling states met before (:mod:`.settled`)
#: end realistic claims in a few hundred steps; this bound keeps the worst claim on a
#: 64-device node well under one second.
DEFAULT_MAX_STEPS = 2_500


def random_share_ids() -> ShareIdFactory:
    """Fresh random lowercase UUIDs, as kube-scheduler generates them."""
    return lambda: str(uuid.uuid4())


def seeded_share_ids(seed: int) -> ShareIdFactory:
    """A reproducible sequence of version-4 UUIDs (for tests and demos)."""
    rng = random.Random(seed)
    return lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4))


class Allocator:
    """Allocates claims on one node against a fixed set of slices, classes and claims.

    ``allocated_claims`` are ResourceClaims with ``status.allocation``; :meth:`allocate`
    does not change this state, :meth:`commit` adds an allocation to it (what
    :func:`allocate_many` does between claims). ``taint_rules`` are DeviceTaintRules: their
    taints count as taints of the devices they select
    (:func:`sharegpu.kube.devicetaints.with_rule_taints`).
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
        taint_rules: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        if not node:
            raise AllocatorInputError("node: a node name is required")
        self.node = node
        tainted = with_rule_taints(slices, taint_rules)
        self.pools: list[Pool] = gather_pools(tainted, node, node_labels)
        self.pool_by_key = {(p.driver, p.name): p for p in self.pools}
        self.candidates: list[Candidate] = [c for p in self.pools for c in p.candidates]
        self.candidate_by_id = {c.id: c for c in self.candidates}
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
        """Allocate ``claim`` alone: the allocation, or the error and per-request reports."""
        return self.allocate_pod([claim])[0]

    def allocate_pod(self, claims: Sequence[Mapping[str, Any]]) -> list[AllocationOutcome]:
        """Allocate the claims of one pod together: every claim gets its allocation, or none
        does and each outcome carries the error (the same for all) and its own reports.

        Nothing is committed; call :meth:`commit` for each allocation that is kept.
        """
        plans = []
        for claim in claims:
            requests, constraints, _ = parse_requests(claim, self.classes)
            plans.append(ClaimPlan(claim, requests, constraints))
        error: str | None = None
        search = Search(self, plans)
        try:
            search.prepare()
            if search.run():
                return [
                    AllocationOutcome(
                        plan.name, allocation=build_allocation(search, ci, self.share_ids)
                    )
                    for ci, plan in enumerate(plans)
                ]
        except SearchAbort as exc:
            error = str(exc)
        if error is None and any(not p.usable and p.invalid_reason for p in self.pools):
            error = "invalid resource pools were encountered"
        return [
            AllocationOutcome(plan.name, error=error, reports=explain(self, plan, len(plans)))
            for plan in plans
        ]


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
    taint_rules: Iterable[Mapping[str, Any]] = (),
) -> AllocationOutcome:
    """Allocate one claim on ``node``; see :class:`Allocator`.

    An allocation that ``claim`` itself already holds (same namespace and name among
    ``allocated_claims``) is left out, so an allocated claim can be explained again.
    """
    return allocate_pod(
        [claim],
        slices,
        classes,
        allocated_claims,
        node,
        node_labels=node_labels,
        share_ids=share_ids,
        max_steps=max_steps,
        taint_rules=taint_rules,
    )[0]


def allocate_pod(
    claims: Sequence[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    classes: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
    allocated_claims: Iterable[Mapping[str, Any]] = (),
    node: str = "",
    *,
    node_labels: Mapping[str, str] | None = None,
    share_ids: ShareIdFactory | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    taint_rules: Iterable[Mapping[str, Any]] = (),
) -> list[AllocationOutcome]:
    """Allocate the claims of one pod together on ``node``; see
    :meth:`Allocator.allocate_pod`. Allocations that these claims already hold are left out."""
    own = {claim_name(c) for c in claims}
    others = [c for c in allocated_claims if claim_name(c) not in own]
    allocator = Allocator(
        slices, classes, others, node, node_labels, share_ids, max_steps, taint_rules
    )
    return allocator.allocate_pod(claims)


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
    taint_rules: Iterable[Mapping[str, Any]] = (),
) -> list[AllocationOutcome]:
    """Allocate ``claims`` one after another on ``node`` (each its own pod); each sees the
    allocations before it."""
    allocator = Allocator(
        slices, classes, allocated_claims, node, node_labels, share_ids, max_steps, taint_rules
    )
    outcomes = []
    for claim in claims:
        outcome = allocator.allocate(claim)
        if outcome.allocation is not None:
            allocator.commit(claim, outcome.allocation)
        outcomes.append(outcome)
    return outcomes
