"""Which share each process belongs to, what each share uses, and what it exceeds.

The mapping, in order:

1. A process whose source names its claim (the mock source) belongs to that claim's share on
   the process's GPU.
2. Otherwise its pod comes from its cgroup (:mod:`kubeletplugin.usage.procfs`); the claims
   reserved for that pod (``status.reservedFor``, read from the API server) that have a share on
   the process's GPU own it.
3. Exactly one candidate share: attributed. None, or several (one pod with two shares on the
   same GPU: the process cannot be told apart), or no pod: :class:`Unattributed`, with why.

Every prepared share on a sampled GPU gets a :class:`ShareUsage`, also with no process (so
"within its reservation" is known). Overcommit, the one rule: memory when the used bytes exceed
the reserved bytes; compute when the measured SM utilisation exceeds the reserved cores plus
``compute_margin`` points (utilisation is sampled and bursty; cores are a cap). adminAccess
shares reserve nothing and are never overcommitted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from api.names import OVER_COMPUTE, OVER_MEMORY
from kubeletplugin.usage.model import (
    GpuSample,
    PreparedShare,
    ProcessSample,
    ShareUsage,
    Unattributed,
)
from kubeletplugin.usage.procfs import PodLookup

REASON_NO_SHARE = "no prepared share of its pod on this GPU"
REASON_AMBIGUOUS = "its pod has several shares on this GPU"
REASON_UNKNOWN_CLAIM = "its claim has no prepared share on this GPU"


@dataclass(frozen=True, slots=True)
class Attribution:
    """One sample's outcome: usage by share key, and the processes left over."""

    usage: dict[tuple[str, str, str, str | None], ShareUsage]
    unattributed: tuple[Unattributed, ...]


def overcommitted(
    share: PreparedShare, used_memory: int, sm: int | None, compute_margin: int
) -> tuple[str, ...]:
    """What ``share`` exceeds (see the module docstring), in :data:`OVERCOMMIT_RESOURCES`
    order."""
    if share.admin_access:
        return ()
    out: list[str] = []
    if used_memory > share.memory:
        out.append(OVER_MEMORY)
    if sm is not None and sm > share.cores + compute_margin:
        out.append(OVER_COMPUTE)
    return tuple(out)


def _owner(
    process: ProcessSample,
    shares: list[PreparedShare],
    pod_of: Callable[[int], PodLookup],
    claim_pods: Mapping[str, frozenset[str]],
) -> PreparedShare | str:
    """The share that owns ``process`` among the GPU's ``shares``, or why none does."""
    if process.claim is not None:
        found = [s for s in shares if process.claim in (s.claim_uid, s.claim_label)]
        if not found:
            return REASON_UNKNOWN_CLAIM
    else:
        lookup = pod_of(process.pid)
        if lookup.pod_uid is None:
            return lookup.reason
        found = [s for s in shares if lookup.pod_uid in claim_pods.get(s.claim_uid, ())]
        if not found:
            return REASON_NO_SHARE
    return found[0] if len(found) == 1 else REASON_AMBIGUOUS


def attribute(
    samples: Iterable[GpuSample],
    shares: Iterable[PreparedShare],
    pod_of: Callable[[int], PodLookup],
    claim_pods: Mapping[str, frozenset[str]],
    compute_margin: int,
) -> Attribution:
    """Map every sampled process to its share and add up each share's usage."""
    by_gpu: dict[str, list[PreparedShare]] = defaultdict(list)
    for share in shares:
        by_gpu[share.gpu_uuid].append(share)
    usage: dict[tuple[str, str, str, str | None], ShareUsage] = {}
    left: list[Unattributed] = []
    for sample in samples:
        gpu_shares = by_gpu.get(sample.gpu_uuid, [])
        owned: dict[tuple[str, str, str, str | None], list[ProcessSample]] = {
            s.key: [] for s in gpu_shares
        }
        for process in sample.processes:
            owner = _owner(process, gpu_shares, pod_of, claim_pods)
            if isinstance(owner, str):
                left.append(
                    Unattributed(sample.gpu_uuid, process.pid, process.used_memory or 0, owner)
                )
            else:
                owned[owner.key].append(process)
        for share in gpu_shares:
            processes = owned[share.key]
            memory = sum(p.used_memory or 0 for p in processes)
            sm = None
            if sample.sm_utilization is not None:
                sm = min(sum(sample.sm_utilization.get(p.pid, 0) for p in processes), 100)
            usage[share.key] = ShareUsage(
                share=share,
                used_memory=memory,
                sm_utilization=sm,
                processes=len(processes),
                overcommitted=overcommitted(share, memory, sm, compute_margin),
            )
    return Attribution(usage, tuple(left))
