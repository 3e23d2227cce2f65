"""The tracker: keeps one ``GPU`` object per physical GPU in step with slices, claims and pods.

Data flow: four informers (this driver's ResourceSlices, all ResourceClaims reduced to this
driver's results, Pods that reference claims, and this driver's GPU objects) feed handlers that
update an index incrementally with the pure pieces of :mod:`controller.reconcile`; each change
marks the affected GPU names *dirty*. A flusher thread recomputes the desired objects of dirty
GPUs, and — only while this replica leads and all informers have synced — writes the
differences:

- create a missing object, then set its status (the status subresource ignores status on
  create); update ``spec`` when the hardware changed; delete objects whose GPU has been gone
  for ``delete_grace_s`` (a plugin that republishes its slices does not reset them);
- write ``status`` only when it differs from what is stored, and at most once per GPU per
  ``write_interval_s`` (later changes wait and are merged into the next write);
- on a conflict the stored copy is refreshed and the write retried on the next round;
- the objects of one round are written by up to ``write_workers`` threads (they are
  independent), which matters for the first round of a large cluster.

Because the comparison is always against the stored objects (kept current by the GPU informer),
a restarted or newly elected controller writes nothing when the objects are already right.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from opentelemetry.trace import NoOpTracer, Tracer

from api.gpu import Allocation, GpuObject
from api.names import (
    API_GROUP,
    API_VERSION,
    GPU_DRIVER_LABEL,
    GPU_PLURAL,
    RESOURCE_GROUP,
    RESOURCE_VERSION,
)
from controller.metrics import ControllerMetrics
from controller.reconcile import (
    DeviceInfo,
    GpuHardware,
    PodInfo,
    claim_allocations,
    gpu_object,
    newest_generation,
    pod_info,
    pool_hardware,
    reserved_pods,
)
from sharegpu.kube.clock import SYSTEM_CLOCK, Clock
from sharegpu.kube.informer import Informer
from sharegpu.kube.rest import KubeApiError, KubeRest, resource_path

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def reduce_claim(claim: Obj, driver: str) -> Obj | None:
    """The parts of a claim the tracker needs, or None when nothing of it is this driver's."""
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    mine = [r for r in results if r.get("driver") == driver]
    if not mine:
        return None
    meta = claim.get("metadata") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta},
        "status": {
            "allocation": {"devices": {"results": mine}},
            "reservedFor": status.get("reservedFor") or [],
        },
    }


def _pod_transform(pod: Obj) -> PodInfo | None:
    return pod_info(pod) if (pod.get("spec") or {}).get("resourceClaims") else None


class Tracker:
    """Maintains the GPU objects of one driver. Thread-safe; start with :meth:`start`."""

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
        #: Measures the write interval and the deletion grace period.
        self._clock = clock
        self._missing_since: dict[str, float] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # inputs, indexed
        self._slices: dict[str, dict[str, Obj]] = defaultdict(dict)  # pool -> slice name -> obj
        self._hardware: dict[str, GpuHardware] = {}
        self._pool_gpus: dict[str, set[str]] = defaultdict(set)
        self._devices: dict[tuple[str, str], DeviceInfo] = {}
        self._pool_devices: dict[str, set[str]] = {}
        self._claims: dict[str, Obj] = {}
        self._claim_allocs: dict[str, list[tuple[str, Allocation]]] = {}
        self._gpu_claims: dict[str, set[str]] = defaultdict(set)
        self._pool_claims: dict[str, set[str]] = defaultdict(set)
        self._pods: dict[tuple[str, str], PodInfo] = {}
        self._pod_claims: dict[tuple[str, str], set[str]] = defaultdict(set)
        # outputs
        self._desired: dict[str, GpuObject] = {}
        self._dirty: set[str] = set()
        self._stored: dict[str, Obj] = {}
        self._unverified: set[str] = set()
        self._last_write: dict[str, float] = {}
        self.writes = 0
        self._was_leader = False

        label = f"{GPU_DRIVER_LABEL}={driver}"
        self.informers = [
            Informer(
                kube,
                resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices"),
                self._on_slice,
                name="resourceslices",
                query=[("fieldSelector", f"spec.driver={driver}")],
                watch_timeout_s=watch_timeout_s,
            ),
            Informer(
                kube,
                resource_path("", "v1", "pods"),
                self._on_pod,
                name="pods",
                transform=_pod_transform,
                watch_timeout_s=watch_timeout_s,
            ),
            Informer(
                kube,
                resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims"),
                self._on_claim,
                name="resourceclaims",
                transform=lambda c: reduce_claim(c, driver),
                watch_timeout_s=watch_timeout_s,
            ),
            Informer(
                kube,
                resource_path(API_GROUP, API_VERSION, GPU_PLURAL),
                self._on_stored,
                name="gpus",
                query=[("labelSelector", label)],
                watch_timeout_s=watch_timeout_s,
            ),
        ]

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
            return not self._dirty and (not self.is_leader() or not self._unverified)

    # --- read access (JSON API, metrics, status table) ---------------------------------------

    def gpus(self, node: str | None = None) -> list[GpuObject]:
        """The current GPU objects by name (of one node when ``node`` is given)."""
        with self._lock:
            self._refresh_desired()
            objs = sorted(self._desired.values(), key=lambda g: (g.spec.node, g.spec.index))
        return [g for g in objs if node is None or g.spec.node == node]

    # --- handlers (informer threads) ---------------------------------------------------------

    def _on_slice(self, key: str, old: Obj | None, new: Obj | None) -> None:
        obj = new if new is not None else old
        if obj is None:
            return
        spec = obj.get("spec") or {}
        pool = str((spec.get("pool") or {}).get("name", ""))
        name = str((obj.get("metadata") or {}).get("name", ""))
        with self._lock:
            if new is None:
                self._slices[pool].pop(name, None)
            else:
                self._slices[pool][name] = new
            self._rebuild_pool(pool)
        self._wake.set()

    def _rebuild_pool(self, pool: str) -> None:
        slices = newest_generation(self._slices[pool].values(), self.driver).get(pool, [])
        if not self._slices[pool]:
            del self._slices[pool]
        gpus, devices = pool_hardware(pool, slices, self.driver) if slices else ({}, {})
        for name in self._pool_gpus.pop(pool, set()):
            self._hardware.pop(name, None)
            self._dirty.add(name)
        for dev_name in self._pool_devices.pop(pool, ()):
            self._devices.pop((pool, dev_name), None)
        self._hardware.update(gpus)
        if gpus:
            self._pool_gpus[pool] = set(gpus)
        self._devices.update({(pool, n): d for n, d in devices.items()})
        if devices:
            self._pool_devices[pool] = set(devices)
        self._dirty.update(gpus)
        for claim_key in list(self._pool_claims.get(pool, ())):
            self._recompute_claim(claim_key)

    def _on_claim(self, key: str, old: Obj | None, new: Obj | None) -> None:
        with self._lock:
            self._forget_claim(key)
            if new is not None:
                self._claims[key] = new
                ns = str((new.get("metadata") or {}).get("namespace", ""))
                for r in new["status"]["allocation"]["devices"]["results"]:
                    self._pool_claims[str(r.get("pool"))].add(key)
                for pod_name, _ in reserved_pods(new):
                    self._pod_claims[(ns, pod_name)].add(key)
                self._recompute_claim(key)
        self._wake.set()

    def _forget_claim(self, key: str) -> None:
        old = self._claims.pop(key, None)
        for gpu_name, _ in self._claim_allocs.pop(key, []):
            self._gpu_claims[gpu_name].discard(key)
            self._dirty.add(gpu_name)
        if old is None:
            return
        ns = str((old.get("metadata") or {}).get("namespace", ""))
        for r in old["status"]["allocation"]["devices"]["results"]:
            _discard(self._pool_claims, str(r.get("pool")), key)
        for pod_name, _ in reserved_pods(old):
            _discard(self._pod_claims, (ns, pod_name), key)

    def _recompute_claim(self, key: str) -> None:
        for gpu_name, _ in self._claim_allocs.get(key, []):
            self._gpu_claims[gpu_name].discard(key)
            self._dirty.add(gpu_name)
        allocs = claim_allocations(
            self._claims[key], self._devices, self._hardware, self._pods, self.driver
        )
        self._claim_allocs[key] = allocs
        for gpu_name, _ in allocs:
            self._gpu_claims[gpu_name].add(key)
            self._dirty.add(gpu_name)

    def _on_pod(self, key: str, old: PodInfo | None, new: PodInfo | None) -> None:
        info = new if new is not None else old
        if info is None:
            return
        pod_key = (info.namespace, info.name)
        with self._lock:
            if new is None:
                self._pods.pop(pod_key, None)
            else:
                self._pods[pod_key] = new
            for claim_key in list(self._pod_claims.get(pod_key, ())):
                if claim_key in self._claims:
                    self._recompute_claim(claim_key)
        self._wake.set()

    def _on_stored(self, key: str, old: Obj | None, new: Obj | None) -> None:
        name = key.rsplit("/", 1)[-1]
        with self._lock:
            if new is not None and _older(new, self._stored.get(name)):
                return  # the event of a write whose answer was already recorded
            if new is None:
                self._stored.pop(name, None)
            else:
                self._stored[name] = new
            self._unverified.add(name)
        self._wake.set()

    # --- flushing ----------------------------------------------------------------------------

    def _refresh_desired(self) -> None:
        """Recompute the desired objects of dirty GPUs (lock held)."""
        for name in self._dirty:
            hw = self._hardware.get(name)
            if hw is None:
                self._desired.pop(name, None)
            else:
                allocs = [
                    alloc
                    for claim_key in self._gpu_claims.get(name, ())
                    for gpu_name, alloc in self._claim_allocs.get(claim_key, ())
                    if gpu_name == name
                ]
                self._desired[name] = gpu_object(hw, allocs)
            self._unverified.add(name)
        self._dirty.clear()

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
            self._refresh_desired()
            if leading and not self._was_leader:
                self._unverified.update(self._desired)
                self._unverified.update(self._stored)
            self._was_leader = leading
            if not leading or not self._unverified:
                return 0
            now = self._clock.monotonic()
            todo: list[tuple[str, GpuObject | None, Obj | None]] = []
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
                    todo.append((name, desired, stored))
        writes = 0
        with self.tracer.start_as_current_span("reconcile") as span:
            span.set_attribute("sharegpu.gpus_to_write", len(todo))
            if len(todo) > 1 and self.write_workers > 1:
                with ThreadPoolExecutor(
                    min(self.write_workers, len(todo)), thread_name_prefix="tracker-write"
                ) as pool:
                    writes = sum(pool.map(lambda item: self._write_if_leading(*item), todo))
            else:
                writes = sum(self._write_if_leading(*item) for item in todo)
            span.set_attribute("sharegpu.writes", writes)
        if self.metrics is not None and todo:
            self.metrics.reconcile_duration.record(time.perf_counter() - start)
        return writes

    def _write_if_leading(self, name: str, desired: GpuObject | None, stored: Obj | None) -> int:
        if self._stop.is_set() or not self.is_leader():
            return 0
        return self._write(name, desired, stored)

    def _write(self, name: str, desired: GpuObject | None, stored: Obj | None) -> int:
        """Bring one object in line; returns how many requests changed something."""
        path = resource_path(API_GROUP, API_VERSION, GPU_PLURAL, name=name)
        writes = 0
        try:
            if desired is None:
                if stored is not None:
                    self.kube.request("DELETE", path)
                    writes += 1
                    self._record(name, None)
                return writes
            if stored is None:
                body = desired.manifest()
                del body["status"]
                body["metadata"]["labels"] = self._labels(desired)
                stored = self.kube.request(
                    "POST", resource_path(API_GROUP, API_VERSION, GPU_PLURAL), body=body
                )
                writes += 1
                self._record(name, stored)
            spec = desired.spec.to_json_dict()
            if stored.get("spec") != spec or not _has_labels(stored, self._labels(desired)):
                meta = dict(stored.get("metadata") or {})
                meta["labels"] = {**(meta.get("labels") or {}), **self._labels(desired)}
                body = {**stored, "metadata": meta, "spec": spec}
                stored = self.kube.request("PUT", path, body=body)
                writes += 1
                self._record(name, stored)
            status = desired.status.to_json_dict()
            if stored.get("status") != status:
                stored = self.kube.request(
                    "PUT", path + "/status", body={**stored, "status": status}
                )
                writes += 1
                self._record(name, stored)
        except KubeApiError as exc:
            log.warning("tracker: writing GPU %s: %s", name, exc)
            if exc.status in (404, 409):
                self._refetch(name, path)
        finally:
            with self._lock:
                self._last_write[name] = self._clock.monotonic()
                self.writes += writes
        return writes

    def _labels(self, desired: GpuObject) -> dict[str, str]:
        """Labels the tracker keeps on an object: the object's own (node) and the driver's."""
        return {**desired.labels, GPU_DRIVER_LABEL: self.driver}

    def _record(self, name: str, stored: Obj | None) -> None:
        with self._lock:
            if stored is None:
                self._stored.pop(name, None)
            else:
                self._stored[name] = stored

    def _refetch(self, name: str, path: str) -> None:
        try:
            fresh: Obj | None = self.kube.get(path, expected=(404,))
        except KubeApiError as exc:
            if exc.status != 404:
                return
            fresh = None
        self._record(name, fresh)


def _needs_write(desired: GpuObject | None, stored: Obj | None) -> bool:
    if desired is None:
        return stored is not None
    if stored is None:
        return True
    return (
        stored.get("spec") != desired.spec.to_json_dict()
        or stored.get("status") != desired.status.to_json_dict()
        or not _has_labels(stored, desired.labels)
    )


def _has_labels(stored: Obj, labels: Mapping[str, str]) -> bool:
    """Whether ``stored`` carries every one of ``labels`` (other labels are left alone)."""
    have = (stored.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


def _discard(index: Any, k: Any, member: str) -> None:
    """Remove ``member`` from the set ``index[k]``, dropping the set when it becomes empty."""
    members = index.get(k)
    if members is not None:
        members.discard(member)
        if not members:
            del index[k]


def _older(new: Obj, current: Obj | None) -> bool:
    """Whether ``new`` is an older version than ``current`` (integer resourceVersions only)."""
    if current is None:
        return False
    a = str((new.get("metadata") or {}).get("resourceVersion", ""))
    b = str((current.get("metadata") or {}).get("resourceVersion", ""))
    return a.isdigit() and b.isdigit() and int(a) < int(b)
