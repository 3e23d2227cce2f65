"""A pure-Python DRA allocator with kube-scheduler's structured-parameters semantics.

Public interface::

    outcome = allocate(claim, slices, classes, allocated_claims, node="n1")
    outcome.allocation   # the status.allocation dict kube-scheduler would write, or None
    outcome.error        # why the allocation stopped early (CEL error, missing class, ...)
    outcome.reports      # per request: each rejected device with kind, message, details

    outcomes = allocate_pod([claim1, claim2], slices, classes, node="n1")   # one pod, jointly
    outcomes = allocate_many([claim1, claim2], slices, classes, node="n1")  # one after another

Pass ``share_ids=seeded_share_ids(seed)`` for reproducible shareIDs.
"""

from __future__ import annotations

from .allocator import (
    DEFAULT_MAX_STEPS,
    Allocator,
    ShareIdFactory,
    allocate,
    allocate_many,
    allocate_pod,
    random_share_ids,
    seeded_share_ids,
)
from .model import (
    REJECTION_KINDS,
    AllocationOutcome,
    AllocatorInputError,
    DeviceId,
    Rejection,
    RejectionKind,
    RequestReport,
)
from .pools import Candidate, Pool, gather_pools, node_matches

__all__ = [
    "DEFAULT_MAX_STEPS",
    "REJECTION_KINDS",
    "AllocationOutcome",
    "Allocator",
    "AllocatorInputError",
    "Candidate",
    "DeviceId",
    "Pool",
    "Rejection",
    "RejectionKind",
    "RequestReport",
    "ShareIdFactory",
    "allocate",
    "allocate_many",
    "allocate_pod",
    "gather_pools",
    "node_matches",
    "random_share_ids",
    "seeded_share_ids",
]
