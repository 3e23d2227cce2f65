"""Scale of the GPU tracker: N nodes x 8 GPUs (one ResourceSlice each) and allocated claims with
their pods (default 1,000 nodes and 20 claims per node).

Usage: python bench/tracker.py [--nodes 1000] [--claims 20000] [--events 2000] [--pure]
                               [--apiserver] [--api-events 200]

Phases (each prints its figures; the last lines are a summary against the targets):

1. with ``--pure``: the pure ``reconcile`` over all inputs at once (holds every input as JSON).
2. initial sync, in memory: a tracker (not started) gets every slice, pod and claim through its
   own informers' apply step (transform, store, handler: what a list does, without HTTP), one
   object at a time as a paged list delivers them, then computes all desired GPU objects.
   Reports the time, the resident memory of the process and the objects the collector tracks.
3. restart, in memory: the tracker's GPU informer gets every GPU object as the server would
   serve it, then one leading round runs; it must write nothing (a request would fail here).
4. per-event update, in memory: a claim re-allocated to another GPU share (three events in
   four) or a pod update -> handler + recomputation of the dirty GPU status, p50/p99.
5. with ``--apiserver``: through the in-process API server over HTTP. The inputs are put in its
   store directly, then a real ``Tracker`` starts: time until its informers have listed
   everything, time until all GPU objects are created and their status written, resident
   memory of this process (server included), and per-event latency from a claim status update
   (HTTP PUT) until the GPU object in the server shows it.

Collector pauses are measured throughout with ``gc.callbacks`` (each collection, start to stop).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import uuid
from collections.abc import Iterator
from typing import Any

from api.names import (
    ATTR_INDEX,
    ATTR_PRODUCT_NAME,
    ATTR_UUID,
    CAP_CORES,
    CAP_MEMORY,
    DEFAULT_DRIVER_NAME,
    GPU_DRIVER_LABEL,
    device_name,
    gpu_object_name,
)
from controller.reconcile import reconcile
from controller.tracker import Tracker
from sharegpu.kube.informer import Informer, object_key
from sharegpu.kube.rest import KubeRest

DRIVER = DEFAULT_DRIVER_NAME
GPUS_PER_NODE = 8
CLAIMS_PER_NODE = 20
NAMESPACES = 50

#: What bench/tracker.py is measured against (docs/performance.md, "GPU tracker at scale").
TARGET_SYNC_S = 60.0
TARGET_RSS_MIB = 1536.0
TARGET_EVENT_P99_MS = 50.0
TARGET_GC_PAUSE_MS = 200.0


def proc_mib(field: str = "VmRSS") -> float:
    """``field`` of /proc/self/status (VmRSS: resident now, VmHWM: peak), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


class GcPauses:
    """Every collection's duration (``gc.callbacks``), kept per phase; :meth:`phase` starts a
    new phase and returns the previous one's ``(count, total s, max s, max generation)``."""

    def __init__(self) -> None:
        self._start = 0.0
        self.pauses: list[tuple[float, int]] = []
        #: The longest pause of the phases reported so far, s.
        self.longest = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append((time.perf_counter() - self._start, info["generation"]))

    def phase(self, counted: bool = True) -> str:
        """Close the current phase; ``counted``: its pauses count in :attr:`longest`."""
        pauses, self.pauses = self.pauses, []
        if not pauses:
            return "no collections"
        longest = max(pauses)
        if counted:
            self.longest = max(self.longest, longest[0])
        return (
            f"{len(pauses)} collections, {sum(p for p, _ in pauses):.2f} s in all, longest "
            f"{longest[0] * 1e3:.1f} ms (generation {longest[1]})"
        )

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


def make_slice(node: str) -> dict[str, Any]:
    devices = []
    for i in range(GPUS_PER_NODE):
        devices.append(
            {
                "name": device_name(i),
                "attributes": {
                    ATTR_UUID: {"string": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{i}')}"},
                    ATTR_PRODUCT_NAME: {"string": "NVIDIA H100 80GB HBM3"},
                    ATTR_INDEX: {"int": i},
                },
                "capacity": {
                    CAP_CORES: {
                        "value": "100",
                        "requestPolicy": {
                            "default": "100",
                            "validRange": {"min": "1", "max": "100", "step": "1"},
                        },
                    },
                    CAP_MEMORY: {
                        "value": "80Gi",
                        "requestPolicy": {
                            "default": "80Gi",
                            "validRange": {"min": "256Mi", "max": "80Gi", "step": "256Mi"},
                        },
                    },
                },
                "allowMultipleAllocations": True,
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def node_name(n: int) -> str:
    return f"node-{n:05d}"


def make_claim(i: int, node: str, gpu: int, rng: random.Random) -> dict[str, Any]:
    """Claim ``i``: one share of ``gpu`` on ``node`` (1-10 cores, 256Mi-2Gi), reserved for pod
    ``i``. Its identity depends on ``i`` only, so a later call makes an update of it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"claim-{i}",
            "namespace": f"ns-{i % NAMESPACES}",
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"claim-{i}")),
        },
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": node,
                            "device": device_name(gpu),
                            "shareID": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                            "consumedCapacity": {
                                CAP_CORES: str(rng.randint(1, 10)),
                                CAP_MEMORY: f"{256 * rng.randint(1, 8)}Mi",
                            },
                        }
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": f"pod-{i}", "uid": f"pod-uid-{i}"}],
        },
    }


def make_pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"pod-{i}",
            "namespace": f"ns-{i % NAMESPACES}",
            "uid": f"pod-uid-{i}",
        },
        "spec": {
            "containers": [
                {"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": f"claim-{i}"}],
        },
    }


def slices_of(nodes: int) -> Iterator[dict[str, Any]]:
    return (make_slice(node_name(n)) for n in range(nodes))


def claims_of(nodes: int, claims: int, seed: int = 1) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    for i in range(claims):
        yield make_claim(i, node_name(rng.randrange(nodes)), rng.randrange(GPUS_PER_NODE), rng)


def pods_of(claims: int) -> Iterator[dict[str, Any]]:
    return (make_pod(i) for i in range(claims))


def pct(values: list[float]) -> tuple[float, float, float]:
    """p50, p99 and max of ``values``, in ms."""
    q = statistics.quantiles(values, n=100, method="inclusive")
    return q[49] * 1e3, q[98] * 1e3, max(values) * 1e3


def feed(informer: Informer, objects: Iterator[dict[str, Any]]) -> int:
    """What one list does to ``informer``: apply every object, then the relist hook."""
    n = 0
    for obj in objects:
        informer._apply(object_key(obj), obj)
        n += 1
    informer.synced.set()
    if informer.on_relist is not None:
        informer.on_relist()
    return n


def tracked_objects() -> str:
    frozen = gc.get_freeze_count() if hasattr(gc, "get_freeze_count") else 0
    return f"{len(gc.get_objects()):,} objects tracked by the collector, {frozen:,} frozen"


def in_memory(args: argparse.Namespace, pauses: GcPauses) -> dict[str, float]:
    figures: dict[str, float] = {}
    print(
        f"inputs: {args.nodes:,} slices, {args.nodes * GPUS_PER_NODE:,} GPUs, "
        f"{args.claims:,} claims, {args.claims:,} pods"
    )
    if args.pure:
        slices, claims, pods = (
            list(slices_of(args.nodes)),
            list(claims_of(args.nodes, args.claims)),
            list(pods_of(args.claims)),
        )
        start = time.perf_counter()
        objs = reconcile(slices, claims, pods, DRIVER)
        print(f"1. pure reconcile of everything: {time.perf_counter() - start:.2f} s")
        del objs, slices, claims, pods
        gc.collect()
    pauses.phase(counted=False)

    rss0 = proc_mib()
    leading = False
    # not started, and its client never sends: any request would raise
    tracker = Tracker(KubeRest(None), DRIVER, is_leader=lambda: leading)
    by_name = {i.name: i for i in tracker.informers}
    start = time.perf_counter()
    cpu = time.process_time()
    feed(by_name["resourceslices"], slices_of(args.nodes))
    feed(by_name["pods"], pods_of(args.claims))
    feed(by_name["resourceclaims"], claims_of(args.nodes, args.claims))
    tracker.flush()  # not leading: computes every desired object
    figures["sync_s"] = sync = time.perf_counter() - start
    cpu = time.process_time() - cpu
    figures["rss_mib"] = proc_mib()
    print(
        f"2. initial sync in memory: {sync:.2f} s ({cpu:.2f} s CPU) for "
        f"{args.nodes * GPUS_PER_NODE:,} GPUs; process RSS {proc_mib():.0f} MiB "
        f"(+{proc_mib() - rss0:.0f} MiB for the tracker), peak {proc_mib('VmHWM'):.0f} MiB"
    )
    print(f"   collector: {pauses.phase()}; {tracked_objects()}")
    counts = getattr(getattr(tracker, "index", None), "counts", None)
    if counts is not None:
        print(f"   index: {counts()}")

    # 3. restart: the GPU objects as stored (with a resourceVersion), then one leading round;
    # served a node at a time, as pages of a list arrive (all at once from a tracker without
    # manifests(), whose gpus() builds them all anyway)
    def stored_objects() -> Iterator[dict[str, Any]]:
        listed = getattr(tracker, "manifests", None)
        pages = (
            (listed(node_name(n)) for n in range(args.nodes))
            if listed
            else [[g.manifest() for g in tracker.gpus()]]
        )
        version = 0
        for page in pages:
            for m in page:
                version += 1
                m["metadata"]["resourceVersion"] = str(version)
                m["metadata"]["labels"] = {
                    **m["metadata"].get("labels", {}),
                    GPU_DRIVER_LABEL: DRIVER,
                }
                yield m

    start = time.perf_counter()
    feed(by_name["gpus"], stored_objects())
    leading = True
    try:
        writes: int | str = tracker.flush()
    except Exception as exc:  # KubeRest(None) cannot send: any write attempt ends here
        writes = f"a write was attempted ({type(exc).__name__})"
    leading = False
    figures["rss_mib"] = max(figures["rss_mib"], proc_mib())
    print(
        f"3. restart with all GPU objects stored: listed and verified in "
        f"{time.perf_counter() - start:.2f} s, writes: {writes}; process RSS {proc_mib():.0f} MiB"
    )
    print(f"   collector: {pauses.phase()}; {tracked_objects()}")

    rng = random.Random(2)
    latencies: list[float] = []
    claims_informer, pods_informer = by_name["resourceclaims"], by_name["pods"]
    for n in range(args.events):
        i = rng.randrange(args.claims)
        if n % 4 == 3:  # every fourth event is a pod update instead
            obj, informer = make_pod(i), pods_informer
        else:
            node = node_name(rng.randrange(args.nodes))
            obj, informer = make_claim(i, node, rng.randrange(GPUS_PER_NODE), rng), claims_informer
        key = object_key(obj)
        start = time.perf_counter()
        informer._apply(key, obj)
        tracker.flush()  # not leading: recomputes the dirty GPU objects
        latencies.append(time.perf_counter() - start)
    p50, p99, worst = pct(latencies)
    figures["p50_ms"], figures["p99_ms"] = p50, p99
    print(
        f"4. event -> GPU status in memory ({args.events} events): p50 {p50:.3f} ms, "
        f"p99 {p99:.3f} ms, max {worst:.3f} ms"
    )
    print(f"   collector: {pauses.phase()}")
    figures["rss_mib"] = max(figures["rss_mib"], proc_mib())
    return figures


def through_apiserver(args: argparse.Namespace, pauses: GcPauses) -> None:
    from sharegpuctl.local.apiserver import KubeAPIServer

    with KubeAPIServer(history_size=10_000) as server:
        for s in slices_of(args.nodes):
            server.store.create("resourceslices", s)
        for p in pods_of(args.claims):
            server.store.create("pods", p)
        for c in claims_of(args.nodes, args.claims):
            status = c.pop("status")
            created = server.store.create("resourceclaims", c)
            created["status"] = status
            server.store.update_status("resourceclaims", created)
        gc.collect()
        pauses.phase(counted=False)
        client = server.client()
        tracker = Tracker(KubeRest(client), DRIVER)
        start = time.perf_counter()
        tracker.start()
        try:
            tracker.wait_synced(600)
            listed = time.perf_counter() - start
            server.wait_for(tracker.idle, 1800, 0.1)
            done = time.perf_counter() - start
            print(
                f"5. through the API server: informers listed everything in {listed:.1f} s; "
                f"all {server.store.count('gpus')} GPU objects created and written in "
                f"{done:.1f} s ({tracker.writes} writes); process RSS {proc_mib():.0f} MiB "
                "(API server included)"
            )
            print(f"   collector: {pauses.phase()}")
            rng = random.Random(3)
            latencies = []
            for _ in range(args.api_events):
                i = rng.randrange(args.claims)
                node = node_name(rng.randrange(args.nodes))
                gpu = rng.randrange(GPUS_PER_NODE)
                cores = rng.randint(11, 20)  # distinct from the initial 1-10: visible change
                claim = server.store.get("resourceclaims", f"claim-{i}", f"ns-{i % NAMESPACES}")
                assert claim is not None
                result = claim["status"]["allocation"]["devices"]["results"][0]
                result.update(pool=node, device=device_name(gpu), shareID=str(uuid.uuid4()))
                result["consumedCapacity"][CAP_CORES] = str(cores)
                share = result["shareID"]
                name = gpu_object_name(node, gpu)

                def visible(name: str = name, share: str = share) -> bool:
                    obj = server.store.get_ref("gpus", name)
                    allocs = (obj or {}).get("status", {}).get("allocations", [])
                    return any(a.get("shareID") == share for a in allocs)

                start = time.perf_counter()
                KubeRest(client).request(
                    "PUT",
                    f"/apis/resource.k8s.io/v1/namespaces/ns-{i % NAMESPACES}/resourceclaims/"
                    f"claim-{i}/status",
                    body=claim,
                )
                server.wait_for(visible, 60, 0.0005)
                latencies.append(time.perf_counter() - start)
                time.sleep(1.0 / 20)
            p50, p99, worst = pct(latencies)
            print(
                f"   claim PUT -> GPU status written ({args.api_events} events; includes the "
                f"1 s per-GPU write batching when a GPU repeats): p50 {p50:.1f} ms, "
                f"p99 {p99:.1f} ms, max {worst:.1f} ms"
            )
            print(f"   collector: {pauses.phase()}")
        finally:
            tracker.stop()
            client.close()


def _verdict(value: float, target: float) -> str:
    return "ok" if value <= target else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000, help="nodes of 8 GPUs (1000)")
    parser.add_argument(
        "--claims", type=int, default=None, help=f"allocated claims ({CLAIMS_PER_NODE} per node)"
    )
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--pure", action="store_true", help="also run the pure reconcile")
    parser.add_argument("--apiserver", action="store_true", help="also run phase 5")
    parser.add_argument("--api-events", type=int, default=200)
    args = parser.parse_args()
    if args.nodes < 1 or args.events < 2 or args.api_events < 2:
        parser.error("--nodes must be at least 1, --events and --api-events at least 2")
    if args.claims is None:
        args.claims = args.nodes * CLAIMS_PER_NODE
    if args.claims < 1:
        parser.error("--claims must be at least 1")
    pauses = GcPauses()
    try:
        figures = in_memory(args, pauses)
        figures["gc_ms"] = pauses.longest * 1e3
        if args.apiserver:
            through_apiserver(args, pauses)
    finally:
        pauses.close()
    print(f"summary, in memory ({args.nodes:,} nodes, {args.claims:,} claims):")
    for label, value, target, unit in (
        ("initial sync", figures["sync_s"], TARGET_SYNC_S, "s"),
        ("process RSS", figures["rss_mib"], TARGET_RSS_MIB, "MiB"),
        ("event -> GPU status p99", figures["p99_ms"], TARGET_EVENT_P99_MS, "ms"),
        ("longest collector pause", figures["gc_ms"], TARGET_GC_PAUSE_MS, "ms"),
    ):
        print(f"  {label}: {value:,.1f} {unit} (target <= {target:,.0f}) {_verdict(value, target)}")
    print(f"  event -> GPU status p50: {figures['p50_ms']:.3f} ms; {tracked_objects()}")


if __name__ == "__main__":
    main()
