"""The usage sampler: every ``interval_s`` it samples the GPUs that hold prepared shares, maps
their processes to shares and finds the escapes from MPS
(:mod:`kubeletplugin.usage.attribution`), and publishes the result: metrics
(:mod:`kubeletplugin.usage.metrics`), the claims' ``status.devices``
(:mod:`kubeletplugin.usage.claims`), a warning in the log for each new escape, and, with
``taint`` / ``escape_taint``, the overcommit and escape taints
(:mod:`kubeletplugin.usage.taints`) through the slice publisher.

Escapes are judged with the MPS daemon pods known (``daemon_pods``,
:mod:`kubeletplugin.usage.mpsdaemons`); a process of a pod that is not a known daemon pod is
judged again after one fresh list of the daemon pods (a daemon started since the last list is
not taken for a tenant), so an escape is flagged in the round that first sees it.

Invariants: a GPU whose sample fails this round contributes no usage (its shares' series
disappear until it answers again; never zeros); one sampler thread does all NVML and API work,
so a slow API server delays only the next sample; nothing here raises out of a round.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kubeletplugin.model import GpuInfo, TaintSink
from kubeletplugin.usage.attribution import REASON_NO_SHARE, Attribution, attribute
from kubeletplugin.usage.claims import ClaimApi, ClaimPods, UsageWriter
from kubeletplugin.usage.flags import UsageOptions
from kubeletplugin.usage.metrics import UsageMetrics, UsageSnapshot
from kubeletplugin.usage.model import GpuSample, PreparedShare
from kubeletplugin.usage.mpsdaemons import DaemonPods
from kubeletplugin.usage.procfs import CgroupLayout, PodLookup, kubelet_layout, pod_of_process
from kubeletplugin.usage.source import UsageSource, UsageSourceError
from kubeletplugin.usage.taints import EscapeTaints, OvercommitTaints
from sharegpu.kube.clock import SYSTEM_CLOCK, Clock, rfc3339
from sharegpu.kube.telemetry import Telemetry

log = logging.getLogger(__name__)


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
        daemon_pods: DaemonPods | None = None,
        clock: Clock = SYSTEM_CLOCK,
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
        self._daemon_pods = daemon_pods
        #: Where the kubelet's pods are, as this process reads cgroups (PID 1's cgroup: read
        #: once, on the first sample).
        self._layout: CgroupLayout | None = None
        self._taints = OvercommitTaints(driver_name, gpus) if options.taint else None
        self._escape_taints = EscapeTaints(driver_name, gpus) if options.escape_taint else None
        self._taint_sink = taints if options.taint or options.escape_taint else None
        #: The escapes of the last round, as (GPU, pid): each new one is logged once.
        self._escaped: frozenset[tuple[str, int]] = frozenset()
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

    def _samples(self, gpu_uuids: Sequence[str], mps_gpus: set[str]) -> list[GpuSample]:
        out = []
        for uuid in gpu_uuids:
            try:
                out.append(self._source.sample(uuid, mps=uuid in mps_gpus))
            except UsageSourceError as exc:
                self._errors[uuid] = self._errors.get(uuid, 0) + 1
                log.warning("usage: %s", exc)
        return out

    def sample_once(self) -> Attribution:
        """One round (see the module docstring)."""
        shares = list(self._shares())
        gpus = sorted({s.gpu_uuid for s in shares})
        mps_gpus = {s.gpu_uuid for s in shares if s.mps}
        samples = self._samples(gpus, mps_gpus)
        self._pods.update(shares)
        daemons = self._daemon_pods.uids() if mps_gpus and self._daemon_pods else None

        if self._layout is None:
            self._layout = kubelet_layout(self.options.proc_root, self.options.kubelet_cgroup_root)
        layout = self._layout

        def pod_of(pid: int) -> PodLookup:
            return pod_of_process(self.options.proc_root, pid, layout)

        def run() -> Attribution:
            return attribute(
                samples,
                shares,
                pod_of,
                self._pods.snapshot(),
                self.options.compute_margin,
                daemons,
            )

        result = run()
        # A pod not known yet on a GPU with shares: a shared claim may have gained it.
        stale_gpus = {p.gpu_uuid for p in result.unattributed if p.reason == REASON_NO_SHARE}
        stale = [s.claim_uid for s in shares if s.gpu_uuid in stale_gpus]
        refetched = bool(stale) and self._pods.update(shares, stale)
        # An escape from a pod outside the known daemon pods: a daemon may have started since.
        if self._daemon_pods is not None and any(e.pod_uid is not None for e in result.escapes):
            fresh = self._daemon_pods.uids(fresh=True)
            refetched = refetched or fresh != daemons
            daemons = fresh
        if refetched:
            result = run()
        now = self._clock.time()
        usage = tuple(result.usage.values())
        self._log_escapes(result)
        if self._writer is not None:
            self._writer.publish(result.usage, rfc3339(now))
        if self._taint_sink is not None:
            taints: dict[str, list[dict[str, Any]]] = {}
            if self._taints is not None:
                taints.update(self._taints.taints(usage, now))
            if self._escape_taints is not None:
                for device, ts in self._escape_taints.taints(result.escapes, now).items():
                    taints.setdefault(device, []).extend(ts)
            self._taint_sink.set_taints(taints)
        ok, failed = self._writer.writes if self._writer is not None else (0, 0)
        with self._mu:
            self._snapshot = UsageSnapshot(
                usage=usage,
                unattributed=result.unattributed,
                escapes=result.escapes,
                judged_gpus=result.judged,
                sampled_gpus=tuple(s.gpu_uuid for s in samples),
                writes=(ok, failed),
                errors=dict(self._errors),
            )
        return result

    def _log_escapes(self, result: Attribution) -> None:
        """A warning for each escape not seen in the previous round."""
        now = frozenset((e.gpu_uuid, e.pid) for e in result.escapes)
        for e in result.escapes:
            if (e.gpu_uuid, e.pid) in self._escaped:
                continue
            owner = (
                f"claim {e.share.claim_label}"
                if e.share is not None
                else "no prepared share of this GPU"
            )
            log.warning(
                "usage: process %d on GPU %s runs outside MPS next to MPS shares and gets the "
                "whole GPU (pod %s, %s, %d bytes of GPU memory)",
                e.pid,
                e.gpu_uuid,
                e.pod_uid or "none",
                owner,
                e.used_memory,
            )
        self._escaped = now

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
