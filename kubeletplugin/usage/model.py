"""Plain data of the usage stage: what a source reports, what was prepared, what was measured.

Memory amounts are bytes; utilisation is percent of the GPU's SMs (0-100). Instances are
immutable.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.shareusage import MeasuredUsage


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One compute process on a GPU, as the source reports it.

    ``used_memory`` is None where the driver does not report it (counted as 0). ``claim`` and
    ``pod_uid`` are set only by sources that already know the owner (the mock source): a claim
    UID or ``<namespace>/<name>``, and the pod UID its cgroup would name; real processes are
    mapped through ``/proc``. ``mps_client``: NVML lists the process among the GPU's MPS clients
    (meaningful only where the sample's ``mps_listed`` is True).
    """

    pid: int
    used_memory: int | None
    claim: str | None = None
    pod_uid: str | None = None
    mps_client: bool = False


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one sample: its compute processes, and per-process SM utilisation by pid
    (None where the GPU does not support per-process utilisation: absent, never zero).

    ``mps_listed``: the source read the GPU's MPS client list, so a process without
    ``mps_client`` is known not to be an MPS client (False: unknown, no escape is judged).
    """

    gpu_uuid: str
    processes: tuple[ProcessSample, ...]
    sm_utilization: dict[int, int] | None
    mps_listed: bool = False


@dataclass(frozen=True, slots=True)
class PreparedShare:
    """A device (share) of a prepared claim: what it reserved on which GPU.

    ``key`` (claim UID, pool, device, share ID) identifies it; it is also the list-map key of
    the claim's ``status.devices`` (with the driver).
    """

    claim_uid: str
    namespace: str
    name: str
    pool: str
    device: str
    share_id: str | None
    gpu_uuid: str
    cores: int
    memory: int
    #: adminAccess allocations reserve nothing and are never overcommitted.
    admin_access: bool = False
    #: The share is enforced by MPS (its processes must be clients of an MPS server).
    mps: bool = False

    @property
    def key(self) -> tuple[str, str, str, str | None]:
        return (self.claim_uid, self.pool, self.device, self.share_id)

    @property
    def claim_label(self) -> str:
        """``<namespace>/<name>``."""
        return f"{self.namespace}/{self.name}"

    @property
    def share_label(self) -> str:
        """The share ID, or the device name for an allocation without one."""
        return self.share_id or self.device


@dataclass(frozen=True, slots=True)
class ShareMeasurement:
    """A prepared share, what its processes used at one sample, and what of its reservation
    they exceed (``overcommitted``: names of :data:`api.names.OVERCOMMIT_RESOURCES`, in that
    order).

    MPS shares only (else ``None`` and ``()``): ``outside_mps`` counts the share's own compute
    processes on its GPU that run outside MPS, never another tenant's (None: not judged this
    sample); ``escaped_pods`` are the UIDs (sorted) of the share's pods that run them.
    """

    share: PreparedShare
    used_memory: int
    sm_utilization: int | None
    processes: int
    overcommitted: tuple[str, ...]
    outside_mps: int | None = None
    escaped_pods: tuple[str, ...] = ()

    def reported(self, sampled_at: str) -> MeasuredUsage:
        """The measurement as the wire value the claim's ``status.devices[].data`` carries
        (:mod:`api.shareusage`)."""
        return MeasuredUsage(
            used_memory=self.used_memory,
            sm_utilization=self.sm_utilization,
            processes=self.processes,
            sampled_at=sampled_at,
            overcommitted=self.overcommitted,
            outside_mps=self.outside_mps,
            escaped_pods=self.escaped_pods,
        )

    @property
    def alerts(self) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
        """What is written at once when it changes: the overcommit verdict, the escaped pods and
        whether any of the share's processes runs outside MPS."""
        return (self.overcommitted, self.escaped_pods, bool(self.outside_mps))


@dataclass(frozen=True, slots=True)
class Escape:
    """A compute process on a GPU with MPS shares that is neither an MPS client nor an MPS
    server of one of this driver's daemon pods: it runs outside MPS and gets the whole GPU.
    ``pod_uid`` when its cgroup names a pod; ``share`` when that pod (or the claim the source
    named) owns one share on the GPU."""

    gpu_uuid: str
    pid: int
    used_memory: int
    pod_uid: str | None
    share: PreparedShare | None


@dataclass(frozen=True, slots=True)
class Unattributed:
    """A compute process no prepared share could be found for, and why."""

    gpu_uuid: str
    pid: int
    used_memory: int
    reason: str
