"""Which share each process belongs to, what each share uses, and what it exceeds.

Invariants: a process belongs to the one share on its GPU of the claim its source names (the
mock source), else of the claims reserved for its pod (pod from its cgroup,
:mod:`kubeletplugin.usage.procfs`); none, several or no pod is :class:`Unattributed` with why.
With the MPS daemon pods known, a non-client process of a daemon pod is an MPS server (neither),
and on a GPU with MPS shares every other non-client process is an :class:`Escape` (still counted
in its share). A share's ``outside_mps`` counts its own escapes only: another tenant's process,
or one of no share, never shows in it (the node reports those: log, metric, optional taint).
Every prepared share on a sampled GPU gets a :class:`ShareMeasurement`, also without processes; an
MPS share has no SM utilisation (NVML reports it per server). Overcommit, the one
rule: used memory above the reserved bytes, or SM utilisation above the reserved cores plus
``compute_margin`` points; adminAccess shares reserve nothing and are never overcommitted."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from api.names import OVER_COMPUTE, OVER_MEMORY
from kubeletplugin.usage.model import (
    Escape,
    GpuSample,
    PreparedShare,
    ProcessSample,
    ShareMeasurement,
    Unattributed,
)
from kubeletplugin.usage.procfs import PodLookup

REASON_NO_SHARE = "no prepared share of its pod on this GPU"
REASON_AMBIGUOUS = "its pod has several shares on this GPU"
REASON_UNKNOWN_CLAIM = "its claim has no prepared share on this GPU"


@dataclass(frozen=True, slots=True)
class Attribution:
    """One sample's outcome: usage by share key, the processes left over, and the escapes from
    MPS found on the GPUs where they were judged (``judged``: their UUIDs)."""

    usage: dict[tuple[str, str, str, str | None], ShareMeasurement]
    unattributed: tuple[Unattributed, ...]
    escapes: tuple[Escape, ...] = ()
    judged: tuple[str, ...] = ()


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


def _pod(process: ProcessSample, pod_of: Callable[[int], PodLookup]) -> PodLookup:
    """The pod of ``process``: the one its source named, else none when its source named its
    claim, else the one its cgroup names."""
    if process.pod_uid is not None:
        return PodLookup(process.pod_uid)
    if process.claim is not None:
        return PodLookup(None, "its source named only its claim")
    return pod_of(process.pid)


def _owner(
    process: ProcessSample,
    lookup: PodLookup,
    shares: list[PreparedShare],
    claim_pods: Mapping[str, frozenset[str]],
) -> PreparedShare | str:
    """The share that owns ``process`` (whose pod is ``lookup``) among the GPU's ``shares``, or
    why none does."""
    if process.claim is not None:
        found = [s for s in shares if process.claim in (s.claim_uid, s.claim_label)]
        if not found:
            return REASON_UNKNOWN_CLAIM
    else:
        if lookup.pod_uid is None:
            return lookup.reason
        uid = lookup.pod_uid
        found = [s for s in shares if uid in claim_pods.get(s.claim_uid, ())]
        if not found:
            return REASON_NO_SHARE
    return found[0] if len(found) == 1 else REASON_AMBIGUOUS


def attribute(
    samples: Iterable[GpuSample],
    shares: Iterable[PreparedShare],
    pod_of: Callable[[int], PodLookup],
    claim_pods: Mapping[str, frozenset[str]],
    compute_margin: int,
    daemon_pods: frozenset[str] | None = None,
) -> Attribution:
    """Map every sampled process to its share, add up each share's usage, and find the
    processes that escaped MPS (see the module docstring)."""
    by_gpu: dict[str, list[PreparedShare]] = defaultdict(list)
    for share in shares:
        by_gpu[share.gpu_uuid].append(share)
    usage: dict[tuple[str, str, str, str | None], ShareMeasurement] = {}
    left: list[Unattributed] = []
    escapes: list[Escape] = []
    judged_gpus: list[str] = []
    for sample in samples:
        gpu_shares = by_gpu.get(sample.gpu_uuid, [])
        judged = daemon_pods is not None and sample.mps_listed and any(s.mps for s in gpu_shares)
        owned: dict[tuple[str, str, str, str | None], list[ProcessSample]] = {
            s.key: [] for s in gpu_shares
        }
        gpu_escapes: list[Escape] = []
        if judged:
            judged_gpus.append(sample.gpu_uuid)
        for process in sample.processes:
            lookup = _pod(process, pod_of)
            pod_uid = lookup.pod_uid
            if (
                daemon_pods is not None
                and not process.mps_client
                and pod_uid is not None
                and pod_uid in daemon_pods
            ):
                continue  # an MPS server: its clients are counted, it is not a tenant
            owner = _owner(process, lookup, gpu_shares, claim_pods)
            memory = process.used_memory or 0
            if judged and not process.mps_client:
                culprit = None if isinstance(owner, str) else owner
                gpu_escapes.append(Escape(sample.gpu_uuid, process.pid, memory, pod_uid, culprit))
            if isinstance(owner, str):
                left.append(Unattributed(sample.gpu_uuid, process.pid, memory, owner))
            else:
                owned[owner.key].append(process)
        escapes.extend(gpu_escapes)
        for share in gpu_shares:
            processes = owned[share.key]
            memory = sum(p.used_memory or 0 for p in processes)
            sm = None
            if sample.sm_utilization is not None and not share.mps:
                sm = min(sum(sample.sm_utilization.get(p.pid, 0) for p in processes), 100)
            outside: int | None = None
            escaped: tuple[str, ...] = ()
            if share.mps and judged:
                own = [e for e in gpu_escapes if e.share is not None and e.share.key == share.key]
                outside = len(own)
                escaped = _escaped_pods(own, share)
            usage[share.key] = ShareMeasurement(
                share=share,
                used_memory=memory,
                sm_utilization=sm,
                processes=len(processes),
                overcommitted=overcommitted(share, memory, sm, compute_margin),
                outside_mps=outside,
                escaped_pods=escaped,
            )
    return Attribution(usage, tuple(left), tuple(escapes), tuple(judged_gpus))


def _escaped_pods(escapes: Iterable[Escape], share: PreparedShare) -> tuple[str, ...]:
    """The UIDs (sorted) of ``share``'s pods among ``escapes``."""
    return tuple(
        sorted(
            {
                e.pod_uid
                for e in escapes
                if e.share is not None and e.share.key == share.key and e.pod_uid is not None
            }
        )
    )
