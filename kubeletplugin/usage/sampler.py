"""The usage sampler: every ``interval_s`` it samples the GPUs that hold prepared shares, maps
their processes to shares (:mod:`kubeletplugin.usage.attribution`), and publishes the result:
metrics (:mod:`kubeletplugin.usage.metrics`), the claims' ``status.devices``
(:mod:`kubeletplugin.usage.claims`), and, with ``taint``, the overcommit taint
(:mod:`kubeletplugin.usage.taints`) through the slice publisher.

Invariants: a GPU whose sample fails this round contributes no usage (its shares' series
disappear until it answers again; never zeros); one sampler thread does all NVML and API work,
so a slow API server delays only the next sample; nothing here raises out of a round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from kubeletplugin.model import GpuInfo
from kubeletplugin.usage.attribution import REASON_NO_SHARE, Attribution, attribute
from kubeletplugin.usage.claims import ClaimApi, ClaimPods, UsageWriter
from kubeletplugin.usage.flags import UsageOptions
from kubeletplugin.usage.metrics import UsageMetrics, UsageSnapshot
from kubeletplugin.usage.model import GpuSample, PreparedShare
from kubeletplugin.usage.procfs import pod_of_process
from kubeletplugin.usage.source import UsageSource, UsageSourceError
from kubeletplugin.usage.taints import OvercommitTaints, rfc3339
from sharegpu.kube.telemetry import Telemetry

log = logging.getLogger(__name__)


class TaintSink(Protocol):
    """Takes this stage's complete taint map (device name -> taints)."""

    def set_taints(self, taints: Mapping[str, Sequence[Mapping[str, Any]]]) -> None: ...


class UsageSampler:
    """Samples, attributes and publishes; a start/stop component of the daemon."""

    def __init__(
        self,
        options: UsageOptions,
        source: UsageSource,
        shares: Callable[[], Sequence[PreparedShare]],
        claims: ClaimApi,
        driver_name: str,
        gpus: Sequence[GpuInfo],
        *,
        telemetry: Telemetry | None = None,
        taints: TaintSink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.options = options
        self._source = source
        self._shares = shares
        self._clock = clock
        self._pods = ClaimPods(claims, clock, refresh_s=max(options.interval_s * 3, 30.0))
        self._writer = (
            UsageWriter(
                claims, driver_name, clock, options.write_interval_s, options.memory_threshold
            )
            if options.write_interval_s > 0
            else None
        )
        self._taints = OvercommitTaints(driver_name, gpus) if taints and options.taint else None
        self._taint_sink = taints if options.taint else None
        self._errors: dict[str, int] = {}
        self._snapshot = UsageSnapshot()
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.metrics = UsageMetrics(telemetry, self.snapshot)

    def snapshot(self) -> UsageSnapshot:
        """The last round's result."""
        with self._mu:
            return self._snapshot

    def _samples(self, gpu_uuids: Sequence[str]) -> list[GpuSample]:
        out = []
        for uuid in gpu_uuids:
            try:
                out.append(self._source.sample(uuid))
            except UsageSourceError as exc:
                self._errors[uuid] = self._errors.get(uuid, 0) + 1
                log.warning("usage: %s", exc)
        return out

    def sample_once(self) -> Attribution:
        """One round (see the module docstring)."""
        shares = list(self._shares())
        gpus = sorted({s.gpu_uuid for s in shares})
        samples = self._samples(gpus)
        self._pods.update(shares)

        def pod_of(pid: int) -> Any:
            return pod_of_process(self.options.proc_root, pid)

        result = attribute(
            samples, shares, pod_of, self._pods.snapshot(), self.options.compute_margin
        )
        # A pod not known yet on a GPU with shares: a shared claim may have gained it.
        stale_gpus = {p.gpu_uuid for p in result.unattributed if p.reason == REASON_NO_SHARE}
        stale = [s.claim_uid for s in shares if s.gpu_uuid in stale_gpus]
        if stale and self._pods.update(shares, stale):
            result = attribute(
                samples, shares, pod_of, self._pods.snapshot(), self.options.compute_margin
            )
        now = self._clock()
        usage = tuple(result.usage.values())
        if self._writer is not None:
            self._writer.publish(result.usage, rfc3339(now))
        if self._taints is not None and self._taint_sink is not None:
            self._taint_sink.set_taints(self._taints.taints(usage, now))
        ok, failed = self._writer.writes if self._writer is not None else (0, 0)
        with self._mu:
            self._snapshot = UsageSnapshot(
                usage=usage,
                unattributed=result.unattributed,
                sampled_gpus=tuple(s.gpu_uuid for s in samples),
                writes=(ok, failed),
                errors=dict(self._errors),
            )
        return result

    def _round(self) -> None:
        try:
            self.sample_once()
        except Exception:
            log.exception("usage: sampling round failed")

    def _run(self) -> None:
        while not self._stop.wait(self.options.interval_s):
            self._round()

    def start(self) -> None:
        """Open the source and start the sampling thread (a source that cannot open is logged,
        and the plugin runs without usage)."""
        try:
            self._source.open()
        except UsageSourceError as exc:
            log.warning("usage: not sampling: %s", exc)
            return
        self._thread = threading.Thread(target=self._run, name="usage-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and close the source (idempotent)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
            self._source.close()
