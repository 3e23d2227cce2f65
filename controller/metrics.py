"""The controller's metrics (OpenTelemetry instruments, exported for Prometheus).

Per-GPU gauges are observed from the tracker's cache at scrape time, so they always match the
GPU objects the tracker computes; nothing is stored twice. Prometheus names (after export):

- ``sharegpu_gpu_cores_capacity`` / ``sharegpu_gpu_cores_allocated``
- ``sharegpu_gpu_memory_capacity_bytes`` / ``sharegpu_gpu_memory_allocated_bytes``
- ``sharegpu_gpu_claims``: distinct claims on the GPU
- ``sharegpu_gpu_healthy``: 1 or 0
  (all with labels ``gpu``, ``node``, ``uuid``, ``model``)
- ``sharegpu_webhook_reviews_total{kind, result}``: ``kind`` is ``ResourceClaim``,
  ``ResourceClaimTemplate``, ``DeviceClass``, ``other`` (any other kind) or ``unknown`` (a review
  whose kind could not be read); ``result`` is ``allowed``, ``warned``, ``denied`` or ``error``.
  Both come from these fixed sets whatever a client sends, so the series stay at most 20
- ``sharegpu_reconcile_duration_seconds``: histogram of one tracker flush
- ``sharegpu_api_errors_total{verb, resource, code}``: failed Kubernetes API calls
- ``sharegpu_quota_used`` / ``sharegpu_quota_hard`` (labels ``namespace``, ``quota``,
  ``resource``: ``cores``, ``memory`` in bytes, ``devices``): what each GpuQuota charges and
  allows (no ``hard`` sample for an absent limit), observed from the quota controller's cache
- ``sharegpu_quota_crd_installed``: 1 while the webhook finds GpuQuotas served, 0 while the
  GpuQuota CRD is not installed (claims are then admitted with a warning, quotas not enforced);
  no sample before the webhook first listed GpuQuotas
- ``sharegpu_quota_admission_enforced``: 1 while the webhook verifies the API server's client
  certificate (``--webhook-client-ca-file``) and the last claim it judged against GpuQuotas came
  with it, so reviews charge quotas as they admit; 0 without a client CA, or while the last
  such review came without the certificate (the API server is not configured to present it, or
  a forged review): reviews are then judged against the quotas but never charged, so claims
  created at the same time can together exceed a quota (docs/security.md); no sample without
  the webhook or quota admission
- ``sharegpu_share_idle_seconds{namespace, claim, pod, gpu}``: how long a share has used under
  the idle threshold of what it reserved, for the shares idle for at least the idle period
  (:mod:`controller.idle`), one sample per pod that reserves the claim (``pod`` "" for none);
  no sample for a share that is busy, unmeasured or not yet idle long enough
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Literal

from opentelemetry.metrics import CallbackOptions, Observation

from api.gpu import HEALTHY, GpuObject
from api.quantity import quantity_int
from controller.idle import IdleShareGauge
from sharegpu.kube.telemetry import SECONDS_BUCKETS, Telemetry


@dataclass(frozen=True, slots=True)
class GpuGauge:
    """What the per-GPU gauges report for one GPU (memory in bytes)."""

    name: str
    node: str
    uuid: str
    model: str
    cores_capacity: int
    cores_allocated: int
    memory_capacity: int
    memory_allocated: int
    claims: int
    healthy: bool
    #: The smallest cores a share of the GPU is charged (what the GpuQuota charge needs).
    min_share_cores: int = 1


def gpu_gauge(g: GpuObject) -> GpuGauge:
    """The gauges of a GPU object."""
    return GpuGauge(
        name=g.name,
        node=g.spec.node,
        uuid=g.spec.uuid,
        model=g.spec.model,
        cores_capacity=g.status.capacity.cores,
        cores_allocated=g.status.allocated.cores,
        memory_capacity=quantity_int(g.status.capacity.memory),
        memory_allocated=quantity_int(g.status.allocated.memory),
        claims=g.status.claim_count,
        healthy=g.status.health == HEALTHY,
    )


#: Where the per-GPU gauges come from: GPU objects, or their gauges already computed (what
#: :meth:`controller.tracker.Tracker.gauges` gives, without building a model per GPU).
GpuSource = Callable[[], Iterable[GpuObject | GpuGauge]]

#: The kinds the admission webhook checks: the values of the reviews' ``kind`` label besides
#: :data:`OTHER_KIND` and :data:`UNKNOWN_KIND`.
REVIEWED_KINDS: Final = frozenset({"ResourceClaim", "ResourceClaimTemplate", "DeviceClass"})
#: The ``kind`` label of a review of any other kind.
OTHER_KIND: Final = "other"
#: The ``kind`` label of a review whose kind could not be read.
UNKNOWN_KIND: Final = "unknown"
#: The outcome of one admission review.
ReviewResult = Literal["allowed", "warned", "denied", "error"]
REVIEW_RESULTS: Final[frozenset[str]] = frozenset({"allowed", "warned", "denied", "error"})


def review_kind_label(kind: object) -> str:
    """The ``kind`` label for a review of ``kind``: one of :data:`REVIEWED_KINDS`,
    :data:`OTHER_KIND` for any other non-empty string, :data:`UNKNOWN_KIND` otherwise."""
    if isinstance(kind, str) and kind:
        return kind if kind in REVIEWED_KINDS else OTHER_KIND
    return UNKNOWN_KIND


@dataclass(frozen=True, slots=True)
class QuotaGauge:
    """One ``sharegpu_quota_used`` / ``sharegpu_quota_hard`` sample of a GpuQuota (memory in
    bytes); ``hard`` is None for an absent limit (no ``hard`` sample then)."""

    namespace: str
    quota: str
    resource: str
    used: int
    hard: int | None


#: Where the per-quota gauges come from (:meth:`controller.quotacontroller.QuotaController.
#: gauges`).
QuotaSource = Callable[[], Iterable[QuotaGauge]]


class ControllerMetrics:
    """Instruments of the controller; ``gpus`` is read at each scrape."""

    def __init__(self, telemetry: Telemetry, gpus: GpuSource | None = None) -> None:
        self._gpus: GpuSource = gpus or (lambda: ())
        meter = telemetry.meter
        for name, description, value in (
            ("sharegpu_gpu_cores_capacity", "Cores of the GPU (percent of SMs)", _cores_cap),
            ("sharegpu_gpu_cores_allocated", "Cores allocated to claims", _cores_used),
            ("sharegpu_gpu_memory_capacity_bytes", "Usable memory of the GPU", _mem_cap),
            ("sharegpu_gpu_memory_allocated_bytes", "Memory allocated to claims", _mem_used),
            ("sharegpu_gpu_claims", "Distinct claims allocated on the GPU", _claims),
            ("sharegpu_gpu_healthy", "1 if the GPU is healthy, else 0", _healthy),
        ):
            meter.create_observable_gauge(
                name, callbacks=[self._observer(value)], description=description
            )
        self.webhook_reviews = meter.create_counter(
            "sharegpu_webhook_reviews", description="Admission reviews answered, by result"
        )
        self.reconcile_duration = meter.create_histogram(
            "sharegpu_reconcile_duration_seconds",
            description="Time to compute and write the changed GPU objects",
            unit="s",
            explicit_bucket_boundaries_advisory=list(SECONDS_BUCKETS),
        )
        self.api_errors = meter.create_counter(
            "sharegpu_api_errors", description="Failed Kubernetes API requests"
        )
        self._quotas: QuotaSource = lambda: ()
        meter.create_observable_gauge(
            "sharegpu_quota_used",
            callbacks=[self._quota_observer(False)],
            description="GPU capacity charged to a GpuQuota (cores, memory bytes, devices)",
        )
        meter.create_observable_gauge(
            "sharegpu_quota_hard",
            callbacks=[self._quota_observer(True)],
            description="The limit of a GpuQuota (cores, memory bytes, devices)",
        )
        self._quota_crd: Callable[[], bool | None] = lambda: None
        meter.create_observable_gauge(
            "sharegpu_quota_crd_installed",
            callbacks=[self._observe_quota_crd],
            description="1 if GpuQuotas are served (quotas enforced), 0 if their CRD is absent",
        )
        self._idle: Callable[[], Iterable[IdleShareGauge]] = lambda: ()
        meter.create_observable_gauge(
            "sharegpu_share_idle_seconds",
            callbacks=[self._observe_idle],
            description="Seconds a share has used under the idle threshold of its reserved "
            "cores and memory (shares idle for at least the idle period only)",
            unit="s",
        )
        self._quota_enforced: Callable[[], bool | None] = lambda: None
        meter.create_observable_gauge(
            "sharegpu_quota_admission_enforced",
            callbacks=[self._observe_quota_enforced],
            description="1 if admission charges GpuQuotas (the API server's client certificate "
            "is verified), 0 if it only judges claims against them",
        )

    def set_idle_source(self, shares: Callable[[], Iterable[IdleShareGauge]]) -> None:
        """Read the idle shares from ``shares`` from now on."""
        self._idle = shares

    def _observe_idle(self, _: CallbackOptions) -> Iterator[Observation]:
        for s in self._idle():
            labels = {"namespace": s.namespace, "claim": s.claim, "pod": s.pod, "gpu": s.gpu}
            yield Observation(s.seconds, labels)

    def set_gpu_source(self, gpus: GpuSource) -> None:
        """Read per-GPU gauges from ``gpus`` from now on."""
        self._gpus = gpus

    def _observer(
        self, value: Callable[[GpuGauge], int]
    ) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(_: CallbackOptions) -> Iterator[Observation]:
            for item in self._gpus():
                gpu = gpu_gauge(item) if isinstance(item, GpuObject) else item
                yield Observation(
                    value(gpu),
                    {"gpu": gpu.name, "node": gpu.node, "uuid": gpu.uuid, "model": gpu.model},
                )

        return observe

    def set_quota_source(self, quotas: QuotaSource) -> None:
        """Read per-quota gauges from ``quotas`` from now on."""
        self._quotas = quotas

    def set_quota_crd_source(self, served: Callable[[], bool | None]) -> None:
        """Read whether the GpuQuota CRD is installed from ``served`` from now on."""
        self._quota_crd = served

    def set_quota_admission_source(self, enforced: Callable[[], bool | None]) -> None:
        """Read whether admission charges GpuQuotas (module text) from ``enforced``."""
        self._quota_enforced = enforced

    def _observe_quota_enforced(self, _: CallbackOptions) -> Iterator[Observation]:
        enforced = self._quota_enforced()
        if enforced is not None:
            yield Observation(1 if enforced else 0)

    def _observe_quota_crd(self, _: CallbackOptions) -> Iterator[Observation]:
        served = self._quota_crd()
        if served is not None:
            yield Observation(1 if served else 0)

    def _quota_observer(self, hard: bool) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(_: CallbackOptions) -> Iterator[Observation]:
            for q in self._quotas():
                value = q.hard if hard else q.used
                if value is not None:
                    labels = {"namespace": q.namespace, "quota": q.quota, "resource": q.resource}
                    yield Observation(value, labels)

        return observe

    def review(self, kind: object, result: ReviewResult) -> None:
        """Count one admission review of ``kind`` (any value: the label is
        :func:`review_kind_label` of it) with ``result``."""
        if result not in REVIEW_RESULTS:
            raise ValueError(f"unknown review result {result!r}")
        self.webhook_reviews.add(1, {"kind": review_kind_label(kind), "result": result})

    def api_error(self, verb: str, resource: str, code: int | str) -> None:
        """Count one failed API request (code 0 or text for connection errors)."""
        self.api_errors.add(1, {"verb": verb, "resource": resource, "code": str(code)})


def _cores_cap(g: GpuGauge) -> int:
    return g.cores_capacity


def _cores_used(g: GpuGauge) -> int:
    return g.cores_allocated


def _mem_cap(g: GpuGauge) -> int:
    return g.memory_capacity


def _mem_used(g: GpuGauge) -> int:
    return g.memory_allocated


def _claims(g: GpuGauge) -> int:
    return g.claims


def _healthy(g: GpuGauge) -> int:
    return 1 if g.healthy else 0
