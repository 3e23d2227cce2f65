"""Scale of the GPU tracker: 1,000 nodes x 8 GPUs and 20,000 allocated claims (with pods).

Usage: python bench/tracker.py [--nodes 1000] [--claims 20000] [--events 2000]
                               [--apiserver] [--api-events 200]

Phases (each prints its figures):

1. ``reconcile``: the pure function over all inputs at once (what a full resync computes).
2. tracker, in memory: the tracker's event handlers fed every slice, pod and claim directly, as
   its informers would after their first list (no HTTP), then all desired GPU objects built.
   Reports the time and the growth of resident memory.
3. per-event update latency, in memory: one claim re-allocated to another GPU share (or one
   pod added) -> handler + recomputation of the dirty GPU objects, p50/p99.
4. with ``--apiserver``: through the in-process API server over HTTP. The inputs are put in its
   store directly, then a real ``Tracker`` starts: time until its informers have listed
   everything, time until all GPU objects are created and their status written, resident
   memory of this process (server included), and per-event latency from a claim status update
   (HTTP PUT) until the GPU object in the server shows it.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import uuid
from typing import Any

from api.names import (
    ATTR_INDEX,
    ATTR_PRODUCT_NAME,
    ATTR_UUID,
    CAP_CORES,
    CAP_MEMORY,
    DEFAULT_DRIVER_NAME,
    device_name,
    gpu_object_name,
)
from controller.reconcile import pod_info, reconcile
from controller.tracker import Tracker, reduce_claim
from sharegpu.kube.informer import object_key
from sharegpu.kube.rest import KubeRest

DRIVER = DEFAULT_DRIVER_NAME
GI = 1024**3
MI = 1024**2
GPUS_PER_NODE = 8


def rss_mib() -> float:
    """Resident memory of this process (VmRSS), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


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


def make_claim(i: int, node: str, gpu: int, rng: random.Random) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"claim-{i}", "namespace": f"ns-{i % 50}", "uid": str(uuid.uuid4())},
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
                            "shareID": str(uuid.uuid4()),
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
        "metadata": {"name": f"pod-{i}", "namespace": f"ns-{i % 50}", "uid": f"pod-uid-{i}"},
        "spec": {
            "containers": [
                {"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": f"claim-{i}"}],
        },
    }


def inputs(
    nodes: int, claims: int, seed: int = 1
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    rng = random.Random(seed)
    node_names = [f"node-{n:04d}" for n in range(nodes)]
    slices = [make_slice(n) for n in node_names]
    cs = [
        make_claim(i, rng.choice(node_names), rng.randrange(GPUS_PER_NODE), rng)
        for i in range(claims)
    ]
    pods = [make_pod(i) for i in range(claims)]
    return slices, cs, pods


def pct(values: list[float]) -> str:
    q = statistics.quantiles(values, n=100, method="inclusive")
    return f"p50 {q[49] * 1e3:.3f} ms, p99 {q[98] * 1e3:.3f} ms, max {max(values) * 1e3:.3f} ms"


def in_memory(args: argparse.Namespace) -> None:
    rss0 = rss_mib()
    slices, claims, pods = inputs(args.nodes, args.claims)
    gc.collect()
    rss_inputs = rss_mib()
    print(
        f"inputs: {len(slices)} slices, {len(slices) * GPUS_PER_NODE} GPUs, {len(claims)} claims, "
        f"{len(pods)} pods (raw JSON dicts: {rss_inputs - rss0:.0f} MiB)"
    )

    start = time.perf_counter()
    objs = reconcile(slices, claims, pods, DRIVER)
    print(f"1. pure reconcile of everything: {time.perf_counter() - start:.2f} s, {len(objs)} GPUs")
    del objs
    gc.collect()

    rss_before = rss_mib()
    tracker = Tracker(KubeRest(None), DRIVER)  # not started: its handlers are fed directly
    start = time.perf_counter()
    for s in slices:
        tracker._on_slice(object_key(s), None, s)
    for p in pods:
        tracker._on_pod(object_key(p), None, pod_info(p))
    for c in claims:
        tracker._on_claim(object_key(c), None, reduce_claim(c, DRIVER))
    gpus = tracker.gpus()
    sync = time.perf_counter() - start
    gc.collect()
    print(
        f"2. tracker initial sync in memory: {sync:.2f} s for {len(gpus)} GPU objects; "
        f"resident memory +{rss_mib() - rss_before:.0f} MiB over the inputs "
        f"(process {rss_mib():.0f} MiB)"
    )

    if args.freeze:
        gc.freeze()  # what a long-running process may do after its initial sync
    rng = random.Random(2)
    latencies: list[float] = []
    node_names = [s["spec"]["nodeName"] for s in slices]
    for n in range(args.events):
        i = rng.randrange(len(claims))
        new = make_claim(i, rng.choice(node_names), rng.randrange(GPUS_PER_NODE), rng)
        new["metadata"] = claims[i]["metadata"]
        key = object_key(new)
        start = time.perf_counter()
        if n % 4 == 3:  # every fourth event is a pod update instead
            tracker._on_pod(key, None, pod_info(pods[i]))
        else:
            tracker._on_claim(key, None, reduce_claim(new, DRIVER))
        with tracker._lock:
            tracker._refresh_desired()
        latencies.append(time.perf_counter() - start)
    print(f"3. per-event update in memory ({args.events} events): {pct(latencies)}")


def through_apiserver(args: argparse.Namespace) -> None:
    from sharegpu.local.apiserver import KubeAPIServer

    slices, claims, pods = inputs(args.nodes, args.claims)
    with KubeAPIServer(history_size=10_000) as server:
        for s in slices:
            server.store.create("resourceslices", s)
        for p in pods:
            server.store.create("pods", p)
        for c in claims:
            status = c.pop("status")
            created = server.store.create("resourceclaims", c)
            created["status"] = status
            server.store.update_status("resourceclaims", created)
        del slices, claims, pods
        gc.collect()
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
                f"4. through the API server: informers listed everything in {listed:.1f} s; "
                f"all {server.store.count('gpus')} GPU objects created and written in "
                f"{done:.1f} s ({tracker.writes} writes); process RSS {rss_mib():.0f} MiB "
                "(API server included)"
            )
            rng = random.Random(3)
            latencies = []
            for _ in range(args.api_events):
                i = rng.randrange(args.claims)
                node = f"node-{rng.randrange(args.nodes):04d}"
                gpu = rng.randrange(GPUS_PER_NODE)
                cores = rng.randint(11, 20)  # distinct from the initial 1-10: visible change
                claim = server.store.get("resourceclaims", f"claim-{i}", f"ns-{i % 50}")
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
                    f"/apis/resource.k8s.io/v1/namespaces/ns-{i % 50}/resourceclaims/"
                    f"claim-{i}/status",
                    body=claim,
                )
                server.wait_for(visible, 60, 0.0005)
                latencies.append(time.perf_counter() - start)
                time.sleep(1.0 / 20)
            print(
                f"   per-event latency, claim PUT -> GPU status written ({args.api_events} "
                f"events; includes the 1 s per-GPU write batching when a GPU repeats): "
                f"{pct(latencies)}"
            )
        finally:
            tracker.stop()
            client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--claims", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--apiserver", action="store_true", help="also run phase 4")
    parser.add_argument("--freeze", action="store_true", help="gc.freeze() before phase 3")
    parser.add_argument("--api-events", type=int, default=200)
    args = parser.parse_args()
    in_memory(args)
    if args.apiserver:
        gc.collect()
        through_apiserver(args)


if __name__ == "__main__":
    main()
