"""Metrics of measured usage (OpenTelemetry, exported for Prometheus), read at scrape time from
the sampler's last result.

Prometheus names (labels ``claim_namespace``, ``claim_name``, ``share`` (share ID, or the device
of an allocation without one) and ``gpu`` (UUID); one series per *prepared* share, so the label
set is bounded by what the node prepared, never by what runs on it):

- ``sharegpu_share_used_memory_bytes``, ``sharegpu_share_reserved_memory_bytes``;
- ``sharegpu_share_sm_utilization_percent`` (absent where the GPU does not report it),
  ``sharegpu_share_reserved_cores``;
- ``sharegpu_share_processes``;
- ``sharegpu_share_overcommitted{resource}``: 1 while the share exceeds its reservation of
  ``memory`` or ``compute``, else 0;
- ``sharegpu_usage_unattributed_processes{gpu}``: compute processes of no prepared share (MPS
  servers of this driver's daemon pods are not counted);
- ``sharegpu_mps_escaped_processes{gpu}``: compute processes outside MPS on a GPU with MPS
  shares (they get the whole GPU); a series only for the GPUs where this was judged;
- ``sharegpu_usage_sample_errors_total{gpu}``: failed samples of a GPU;
- ``sharegpu_usage_claim_writes_total{result}``: usage writes to claims, ``ok`` or ``error``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from opentelemetry.metrics import CallbackOptions, Observation

from api.names import OVERCOMMIT_RESOURCES
from kubeletplugin.usage.model import Escape, ShareMeasurement, Unattributed
from sharegpu.kube.telemetry import Telemetry


@dataclass(frozen=True)
class UsageSnapshot:
    """The sampler's last result as the metrics read it."""

    usage: tuple[ShareMeasurement, ...] = ()
    unattributed: tuple[Unattributed, ...] = ()
    escapes: tuple[Escape, ...] = ()
    #: The GPUs where escapes from MPS were judged.
    judged_gpus: tuple[str, ...] = ()
    sampled_gpus: tuple[str, ...] = ()
    writes: tuple[int, int] = (0, 0)
    errors: dict[str, int] = field(default_factory=dict)


def _labels(u: ShareMeasurement) -> dict[str, str]:
    s = u.share
    return {
        "claim_namespace": s.namespace,
        "claim_name": s.name,
        "share": s.share_label,
        "gpu": s.gpu_uuid,
    }


class UsageMetrics:
    """Observable instruments over ``snapshot()`` (nothing is created without telemetry)."""

    def __init__(self, telemetry: Telemetry | None, snapshot: Callable[[], UsageSnapshot]) -> None:
        self._snapshot = snapshot
        if telemetry is None:
            return
        meter = telemetry.meter
        gauges: tuple[tuple[str, str, Callable[[CallbackOptions], Iterator[Observation]]], ...] = (
            ("sharegpu_share_used_memory_bytes", "GPU memory a share's processes use", self._used),
            ("sharegpu_share_reserved_memory_bytes", "GPU memory a share reserved", self._rmem),
            ("sharegpu_share_sm_utilization_percent", "SM utilisation of a share", self._sm),
            ("sharegpu_share_reserved_cores", "Cores (percent of SMs) a share reserved", self._rc),
            ("sharegpu_share_processes", "Compute processes of a share", self._procs),
            ("sharegpu_share_overcommitted", "1 while a share exceeds its reservation", self._over),
            (
                "sharegpu_usage_unattributed_processes",
                "Compute processes of no prepared share",
                self._unattributed,
            ),
            (
                "sharegpu_mps_escaped_processes",
                "Compute processes outside MPS on a GPU with MPS shares",
                self._escaped,
            ),
        )
        for name, description, callback in gauges:
            meter.create_observable_gauge(name, callbacks=[callback], description=description)
        meter.create_observable_counter(
            "sharegpu_usage_sample_errors",
            callbacks=[self._errors],
            description="Failed usage samples of a GPU",
        )
        meter.create_observable_counter(
            "sharegpu_usage_claim_writes",
            callbacks=[self._writes],
            description="Usage writes to ResourceClaims",
        )

    def _used(self, _: CallbackOptions) -> Iterator[Observation]:
        for u in self._snapshot().usage:
            yield Observation(u.used_memory, _labels(u))

    def _rmem(self, _: CallbackOptions) -> Iterator[Observation]:
        for u in self._snapshot().usage:
            yield Observation(u.share.memory, _labels(u))

    def _sm(self, _: CallbackOptions) -> Iterator[Observation]:
        for u in self._snapshot().usage:
            if u.sm_utilization is not None:
                yield Observation(u.sm_utilization, _labels(u))

    def _rc(self, _: CallbackOptions) -> Iterator[Observation]:
        for u in self._snapshot().usage:
            yield Observation(u.share.cores, _labels(u))

    def _procs(self, _: CallbackOptions) -> Iterator[Observation]:
        for u in self._snapshot().usage:
            yield Observation(u.processes, _labels(u))

    def _over(self, _: CallbackOptions) -> Iterator[Observation]:
        for u in self._snapshot().usage:
            for resource in OVERCOMMIT_RESOURCES:
                value = 1 if resource in u.overcommitted else 0
                yield Observation(value, {**_labels(u), "resource": resource})

    def _unattributed(self, _: CallbackOptions) -> Iterator[Observation]:
        snap = self._snapshot()
        counts = Counter(p.gpu_uuid for p in snap.unattributed)
        for gpu in snap.sampled_gpus:
            yield Observation(counts.get(gpu, 0), {"gpu": gpu})

    def _escaped(self, _: CallbackOptions) -> Iterator[Observation]:
        snap = self._snapshot()
        counts = Counter(e.gpu_uuid for e in snap.escapes)
        for gpu in snap.judged_gpus:
            yield Observation(counts.get(gpu, 0), {"gpu": gpu})

    def _errors(self, _: CallbackOptions) -> Iterator[Observation]:
        for gpu, count in self._snapshot().errors.items():
            yield Observation(count, {"gpu": gpu})

    def _writes(self, _: CallbackOptions) -> Iterator[Observation]:
        ok, failed = self._snapshot().writes
        yield Observation(ok, {"result": "ok"})
        yield Observation(failed, {"result": "error"})
