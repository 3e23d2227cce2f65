"""The tracker: keeps one ``GPU`` object per physical GPU in step with slices, claims and pods.

Five informers (this driver's ResourceSlices, DeviceTaintRules (none where the API server does
not serve them), ResourceClaims reduced to this driver's results, Pods that reference claims,
and this driver's GPU objects) keep compact records (:mod:`controller.records`,
:mod:`controller.stored`); their handlers mark GPUs dirty in a
:class:`~controller.gpuindex.GpuIndex`, and a flusher recomputes only those. Invariants:

- only while this replica leads and every informer has synced does it write, and only what
  differs from the stored objects, so a restarted or newly elected controller writes nothing
  when they are right; a conflict refreshes the stored copy and retries next round;
- ``status`` is written at most once per GPU per ``write_interval_s``; an object whose GPU has
  been gone for ``delete_grace_s`` is deleted; a round's writes use up to ``write_workers``
  threads;
- Events (:mod:`controller.events`: ``ShareOvercommitted``, ``MPSEscape``,
  ``MPSClientsQueued``) follow transitions after the informers synced (the state at sync is the
  baseline); every replica follows them, only the leader sends;
- with ``freeze_gc`` the long-lived records are moved out of the collector's reach
  (:class:`~controller.gcfreeze.Freezer`) every few thousand updates and after each list.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from opentelemetry.trace import NoOpTracer, Tracer

from api.gpu import GpuObject
from api.gpustatus import gpu_spec_json
from api.jsontypes import Obj
from api.names import (
    API_GROUP,
    API_VERSION,
    GPU_DRIVER_LABEL,
    GPU_PLURAL,
    RESOURCE_GROUP,
    RESOURCE_VERSION,
)
from controller.events import MpsQueued, OvercommitEvents, ShareEvent, ShareKey, transitions
from controller.gcfreeze import Freezer
from controller.gpuindex import GpuIndex
from controller.idle import IdlePolicy, IdleShareGauge, IdleShares, IdleVerdict, idle_gauges
from controller.metrics import ControllerMetrics, GpuGauge
from controller.reconcile import (
    Alloc,
    GpuHardware,
    gpu_labels,
    gpu_manifest,
    gpu_object,
    gpu_status_json,
    usage,
)
from controller.records import (
    AllocatedClaim,
    PodInfo,
    SliceRecord,
    TaintRuleRecord,
    claim_record,
    pod_record,
    taint_rule_record,
)
from controller.records import slice_record as _slice_record
from controller.stored import StoredGpu, json_digest, older, stored_gpu
from sharegpu.kube.clock import SYSTEM_CLOCK, Clock
from sharegpu.kube.informer import Informer
from sharegpu.kube.rest import KubeApiError, KubeRest, resource_path

log = logging.getLogger(__name__)

#: The desired object of one GPU as digests: ``(spec digest, status digest, own labels)``
#: (labels as pairs: a tuple of texts only is not tracked by the collector).
Desired = tuple[bytes, bytes, tuple[tuple[str, str], ...]]


class Tracker:
    """Maintains the GPU objects of one driver. Thread-safe; start with :meth:`start`.

    ``freeze_gc`` False leaves the garbage collector alone (see the module text).
    """

    def __init__(
        self,
        kube: KubeRest,
        driver: str,
        *,
        metrics: ControllerMetrics | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        write_interval_s: float = 1.0,
        tick_s: float = 0.05,
        watch_timeout_s: int = 300,
        tracer: Tracer | None = None,
        delete_grace_s: float = 10.0,
        write_workers: int = 4,
        clock: Clock = SYSTEM_CLOCK,
        freeze_gc: bool = True,
        idle: IdlePolicy | None = None,
    ) -> None:
        self.kube = kube
        self.tracer: Tracer = tracer or NoOpTracer()
        self.driver = driver
        self.metrics = metrics
        self.is_leader = is_leader
        self.write_interval_s = write_interval_s
        self.tick_s = tick_s
        self.delete_grace_s = delete_grace_s
        self.write_workers = write_workers
        self.freezer = Freezer(enabled=freeze_gc)
        #: Measures the write interval and the deletion grace period.
        self._clock = clock
        self._missing_since: dict[str, float] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.index = GpuIndex(driver)
        # outputs
        self._desired: dict[str, Desired] = {}
        self._stored: dict[str, StoredGpu] = {}
        self._unverified: set[str] = set()
        self._last_write: dict[str, float] = {}
        self.writes = 0
        self._was_leader = False
        #: Overcommitted shares per GPU (only GPUs that have some); None until synced.
        self._overcommitted: dict[str, frozenset[ShareKey]] | None = None
        #: Transitions found by :meth:`refresh`, taken by the next :meth:`flush`.
        self._overcommits: list[ShareEvent] = []
        self.events = OvercommitEvents(kube, clock=clock)
        #: Idle shares (None: idle reporting off), and the verdict each GPU's desired object
        #: was computed with.
        self.idle_shares = IdleShares(idle, clock) if idle is not None else None
        self._idle_verdicts: dict[str, IdleVerdict] = {}

        label = f"{GPU_DRIVER_LABEL}={driver}"
        common: dict[str, Any] = {
            "watch_timeout_s": watch_timeout_s,
            "on_relist": self._after_relist,
        }
        self.informers = [
            Informer(
                kube,
                resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices"),
                self._on_slice,
                name="resourceslices",
                query=[("fieldSelector", f"spec.driver={driver}")],
                transform=self.slice_record,
                **common,
            ),
            Informer(
                kube,
                resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "devicetaintrules"),
                self._on_rule,
                name="devicetaintrules",
                transform=taint_rule_record,
                unserved_is_empty=True,
                **common,
            ),
            Informer(
                kube,
                resource_path("", "v1", "pods"),
                self._on_pod,
                name="pods",
                transform=pod_record,
                **common,
            ),
            Informer(
                kube,
                resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims"),
                self._on_claim,
                name="resourceclaims",
                transform=self.claim_record,
                **common,
            ),
            Informer(
                kube,
                resource_path(API_GROUP, API_VERSION, GPU_PLURAL),
                self._on_stored,
                name="gpus",
                query=[("labelSelector", label)],
                transform=stored_gpu,
                **common,
            ),
        ]

    def slice_record(self, obj: Obj) -> SliceRecord:
        """What the slice informer keeps of one ResourceSlice."""
        return _slice_record(obj, self.driver)

    def claim_record(self, obj: Obj) -> AllocatedClaim | None:
        """What the claim informer keeps of one ResourceClaim (None: nothing of this driver)."""
        return claim_record(obj, self.driver)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the informers and the flusher (daemon threads)."""
        for informer in self.informers:
            informer.start()
        self._thread = threading.Thread(target=self._run, name="tracker-flush", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop all threads; pending writes are dropped (the next leader redoes them)."""
        self._stop.set()
        self._wake.set()
        for informer in self.informers:
            informer.stop()
        if self._thread is not None:
            self._thread.join(10.0)

    def synced(self) -> bool:
        """Whether every informer has completed its first list."""
        return all(i.synced.is_set() for i in self.informers)

    def wait_synced(self, timeout: float) -> bool:
        """Block until :meth:`synced` (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        for informer in self.informers:
            if not informer.synced.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def idle(self) -> bool:
        """Whether every desired object is computed and (when leading) matches the store."""
        with self._lock:
            return not self.index.dirty and (not self.is_leader() or not self._unverified)

    def _after_relist(self) -> None:
        """An informer has (re)listed: what it built is long-lived (see the module text)."""
        with self._lock:
            self.freezer.freeze()

    # --- read access (JSON API, metrics, status table) ---------------------------------------

    def gpus(self, node: str | None = None) -> list[GpuObject]:
        """The current GPU objects, validated, sorted by node and index (of one node when
        ``node`` is given). Builds a model per GPU: for the JSON API and tests; metrics read
        :meth:`gauges`."""
        return [
            gpu_object(hw, allocs, self._verdict(hw, allocs)) for hw, allocs in self._snapshot(node)
        ]

    def manifests(self, node: str | None = None) -> list[Obj]:
        """The current GPU objects as JSON (what :meth:`gpus` gives, without the models)."""
        return [
            gpu_manifest(hw, allocs, self._verdict(hw, allocs))
            for hw, allocs in self._snapshot(node)
        ]

    def _verdict(self, hw: GpuHardware, allocs: list[Alloc]) -> IdleVerdict | None:
        """The idle verdict of a GPU now (for readers; None when idle reporting is off)."""
        return None if self.idle_shares is None else self.idle_shares.verdict(hw.name, allocs)

    def gauges(self) -> list[GpuGauge]:
        """What the per-GPU metrics report, for every GPU, sorted by node and index."""
        out = []
        for hw, allocs in self._snapshot(None):
            cores, memory, claims = usage(allocs)
            out.append(
                GpuGauge(
                    name=hw.name,
                    node=hw.node,
                    uuid=hw.uuid,
                    model=hw.model,
                    cores_capacity=hw.cores,
                    cores_allocated=cores,
                    memory_capacity=hw.memory,
                    memory_allocated=memory,
                    claims=claims,
                    healthy=hw.unhealthy_reason is None,
                    min_share_cores=hw.min_share_cores,
                )
            )
        return out

    def _snapshot(self, node: str | None) -> list[tuple[GpuHardware, list[Alloc]]]:
        """Every GPU (of ``node``) with its allocations, sorted by node and index: taken under
        the lock, read after it (records are immutable), so readers hold up no event."""
        with self._lock:
            gpus = [
                (hw, self.index.allocations(hw.name))
                for n in self.index.names(node)
                if (hw := self.index.hardware(n)) is not None
            ]
        return sorted(gpus, key=lambda g: (g[0].node, g[0].index))

    # --- handlers (informer threads) ---------------------------------------------------------

    def _on_slice(self, key: str, old: SliceRecord | None, new: SliceRecord | None) -> None:
        with self._lock:
            self.index.set_slice(old, new)
            self.freezer.note(1 + (len(new.devices) if new is not None else 0))
        self._wake.set()

    def _on_rule(self, key: str, old: TaintRuleRecord | None, new: TaintRuleRecord | None) -> None:
        with self._lock:
            self.index.set_rule(key, new)
            self.freezer.note()
        self._wake.set()

    def _on_claim(self, key: str, old: AllocatedClaim | None, new: AllocatedClaim | None) -> None:
        with self._lock:
            self.index.set_claim(key, new)
            self.freezer.note()
        self._wake.set()

    def _on_pod(self, key: str, old: PodInfo | None, new: PodInfo | None) -> None:
        with self._lock:
            self.index.set_pod(key, new)
            self.freezer.note()
        self._wake.set()

    def _on_stored(self, key: str, old: StoredGpu | None, new: StoredGpu | None) -> None:
        name = key.rsplit("/", 1)[-1]
        with self._lock:
            if new is not None and older(new, self._stored.get(name)):
                return  # the event of a write whose answer was already recorded
            if new is None:
                self._stored.pop(name, None)
            else:
                self._stored[name] = new
            self._unverified.add(name)
            self.freezer.note()
        self._wake.set()

    # --- flushing ----------------------------------------------------------------------------

    def refresh(self) -> int:
        """Compute the desired objects of the dirty GPUs; returns how many were dirty."""
        with self._lock:
            if self._overcommitted is None and self.synced():
                self._overcommitted = {}
                for name in self.index.names():
                    self._note_overcommits(name, self.index.allocations(name))
                # The baseline: no Events, but for clients queued behind another UID (they
                # hang without an error, so a restarted controller says it once more).
                self._overcommits = [o for o in self._overcommits if isinstance(o, MpsQueued)]
            if self.idle_shares is not None:
                self.index.dirty.update(self.idle_shares.due())
            dirty = self.index.take_dirty()
            for name in dirty:
                hw = self.index.hardware(name)
                allocs = [] if hw is None else self.index.allocations(name)
                self._note_overcommits(name, allocs)
                verdict = self._judge_idle(name, allocs, gone=hw is None)
                if hw is None:
                    self._desired.pop(name, None)
                else:
                    status = gpu_status_json(hw, allocs, verdict)
                    self._desired[name] = (
                        json_digest(gpu_spec_json(hw)),
                        json_digest(status),
                        tuple(gpu_labels(hw).items()),
                    )
                self._unverified.add(name)
                self.freezer.note()
            return len(dirty)

    def _judge_idle(self, name: str, allocs: list[Alloc], gone: bool) -> IdleVerdict | None:
        """Follow the idle shares of GPU ``name`` (caller holds the lock); the verdict its
        desired object says, None when idle reporting is off or the GPU is gone."""
        if self.idle_shares is None:
            return None
        if gone:
            self.idle_shares.forget(name)
            self._idle_verdicts.pop(name, None)
            return None
        self.idle_shares.observe(name, allocs)
        verdict = self.idle_shares.verdict(name, allocs, record=True)
        self._idle_verdicts[name] = verdict
        return verdict

    def idle_gauges(self) -> list[IdleShareGauge]:
        """The ``sharegpu_share_idle_seconds`` samples: every idle share, per reserving pod."""
        if self.idle_shares is None:
            return []
        out: list[IdleShareGauge] = []
        for hw, allocs in self._snapshot(None):
            out.extend(idle_gauges(hw.name, allocs, self.idle_shares.verdict(hw.name, allocs)))
        return out

    def _note_overcommits(self, name: str, allocs: list[Alloc]) -> None:
        """Follow the overcommitted shares and escaped pods of GPU ``name``; queue those that
        became so."""
        if self._overcommitted is None:
            return
        now, found = transitions(self._overcommitted.pop(name, frozenset()), allocs)
        if now:
            self._overcommitted[name] = now
        self._overcommits.extend(found)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.tick_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.flush()
            except Exception:
                log.exception("tracker: flushing GPU objects failed")
                self._stop.wait(0.5)

    def flush(self) -> int:
        """One round: refresh desired objects and, when leading and synced, write differences.

        Returns the number of writes made.
        """
        start = time.perf_counter()
        leading = self.is_leader() and self.synced()
        with self._lock:
            self.refresh()
            overcommits, self._overcommits = self._overcommits, []
            todo = self._due(leading)
        if leading and overcommits and self.is_leader():
            self.events.emit(overcommits)
        if todo is None:
            return 0
        writes = 0
        with self.tracer.start_as_current_span("reconcile") as span:
            span.set_attribute("sharegpu.gpus_to_write", len(todo))
            if len(todo) > 1 and self.write_workers > 1:
                with ThreadPoolExecutor(
                    min(self.write_workers, len(todo)), thread_name_prefix="tracker-write"
                ) as pool:
                    writes = sum(pool.map(self._write_if_leading, todo))
            else:
                writes = sum(self._write_if_leading(name) for name in todo)
            span.set_attribute("sharegpu.writes", writes)
        if self.metrics is not None and todo:
            self.metrics.reconcile_duration.record(time.perf_counter() - start)
        return writes

    def _due(self, leading: bool) -> list[str] | None:
        """The GPU objects to write this round (caller holds the lock); None: nothing to look
        at (not leading, or everything verified)."""
        if leading and not self._was_leader:
            self._unverified.update(self._desired)
            self._unverified.update(self._stored)
        self._was_leader = leading
        if not leading or not self._unverified:
            return None
        now = self._clock.monotonic()
        todo: list[str] = []
        for name in sorted(self._unverified):
            desired, stored = self._desired.get(name), self._stored.get(name)
            if not _needs_write(desired, stored):
                self._unverified.discard(name)
                self._missing_since.pop(name, None)
                continue
            if desired is None:
                since = self._missing_since.setdefault(name, now)
                if now - since < self.delete_grace_s:
                    continue  # stays unverified: looked at again on the next round
            else:
                self._missing_since.pop(name, None)
            if now - self._last_write.get(name, -1e9) >= self.write_interval_s:
                todo.append(name)
        return todo

    def _write_if_leading(self, name: str) -> int:
        if self._stop.is_set() or not self.is_leader():
            return 0
        with self._lock:  # the current content: built here, one GPU at a time
            hw = self.index.hardware(name)
            desired = (
                None
                if hw is None
                else gpu_manifest(hw, self.index.allocations(name), self._idle_verdicts.get(name))
            )
            stored = self._stored.get(name)
        return self._write(name, desired, stored)

    def _write(self, name: str, desired: Obj | None, stored: StoredGpu | None) -> int:
        """Bring one object in line with ``desired`` (a manifest); returns how many requests
        changed something."""
        path = resource_path(API_GROUP, API_VERSION, GPU_PLURAL, name=name)
        writes = 0
        try:
            if desired is None:
                if stored is not None:
                    self.kube.request("DELETE", path)
                    writes += 1
                    self._forget(name)
                return writes
            labels = {**desired["metadata"].get("labels", {}), GPU_DRIVER_LABEL: self.driver}
            spec, status = desired["spec"], desired["status"]
            if stored is None:
                body = {**desired, "metadata": {**desired["metadata"], "labels": labels}}
                del body["status"]
                stored = self._record(
                    name,
                    self.kube.request(
                        "POST", resource_path(API_GROUP, API_VERSION, GPU_PLURAL), body=body
                    ),
                )
                writes += 1
            if stored.spec_digest != json_digest(spec) or not stored.has_labels(labels):
                meta = dict(stored.metadata)
                meta["labels"] = {**(meta.get("labels") or {}), **labels}
                body = {**stored.body(spec=spec), "metadata": meta}
                stored = self._record(name, self.kube.request("PUT", path, body=body))
                writes += 1
            if stored.status_digest != json_digest(status):
                body = stored.body(status=status)
                stored = self._record(name, self.kube.request("PUT", path + "/status", body=body))
                writes += 1
        except KubeApiError as exc:
            log.warning("tracker: writing GPU %s: %s", name, exc)
            if exc.status in (404, 409):
                self._refetch(name, path)
        finally:
            with self._lock:
                self._last_write[name] = self._clock.monotonic()
                self.writes += writes
        return writes

    def _record(self, name: str, obj: Obj) -> StoredGpu:
        """Keep the server's answer ``obj`` as the stored copy of ``name``."""
        stored = stored_gpu(obj)
        with self._lock:
            self._stored[name] = stored
            self.freezer.note()
        return stored

    def _forget(self, name: str) -> None:
        """``name`` is gone from the server."""
        with self._lock:
            self._stored.pop(name, None)

    def _refetch(self, name: str, path: str) -> None:
        try:
            fresh = self.kube.get(path, expected=(404,))
        except KubeApiError as exc:
            if exc.status == 404:
                self._forget(name)
            return
        self._record(name, fresh)


def _needs_write(desired: Desired | None, stored: StoredGpu | None) -> bool:
    if desired is None:
        return stored is not None
    if stored is None:
        return True
    spec_digest, status_digest, labels = desired
    return (
        stored.spec_digest != spec_digest
        or stored.status_digest != status_digest
        or not stored.has_labels(dict(labels))
    )
