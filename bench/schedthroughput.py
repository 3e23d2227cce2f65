"""Scheduling throughput of the real kube-scheduler with sharegpu's ResourceSlices.

Starts a control plane without a node (tests/e2e: etcd, kube-apiserver, the controller manager
in a sealed network namespace), creates ``--nodes`` Node objects (Ready, no kubelet) and
publishes on each the slices the kubelet plugin would publish for 8 mock H100s, rendered by the
plugin's own slice code (:func:`kubeletplugin.devices.slices.preview_slices` over
:class:`kubeletplugin.devices.mock.MockBackend`), in each sharing mode in turn, plus the slice
upstream's DRA test driver publishes with ``--num-devices=8`` (:mod:`bench.testdriver`).

For each node count, and each batch of :data:`BATCHES` (pods without claims, upstream's simplest
claim shape on the test driver's devices, and a typical claim of each sharegpu mode), it creates
the pods from a ResourceClaimTemplate while no scheduler runs, waits until the controller
manager has created every pod's claim, then starts kube-scheduler v1.37 (client QPS and burst
5000, as upstream's ``scheduler_perf`` runs it) and measures bound pods per second from the
first to the last binding seen by a watch. Pods per batch: ``--pods``, at most one per device
of a whole-device shape (8 per node), so every batch schedules the same number at a node count.

Upstream's CI thresholds (``test/integration/scheduler_perf/dra/performance-config.yaml``,
v1.37.2) for 500 nodes with a claim template: 56 pods/s (``5000pods_500nodes``, all pods
created at once) and 64 pods/s (``empty_500nodes``, steady state); they run the scheduler in
the test process on a dedicated machine.

Run as root: ``python -m bench.schedthroughput [--nodes 100 500] [--pods 2000]
[--json bench/results/schedthroughput.json]`` (``make bench PART=schedthroughput``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import yaml

from api import names
from bench import testdriver
from bench.podwatch import PodWatch
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.slices import preview_slices
from tests.deploy.helpers import helm_binary
from tests.e2e import driver
from tests.e2e.binaries import bin_dir, kubernetes_version, missing_binaries
from tests.e2e.controlplane import FEATURE_GATES, ControlPlane, write_kubeconfig
from tests.e2e.processes import Process, StepFailed, interrupt_on_signals, wait_until

SHAREGPU: Final = names.DEFAULT_DRIVER_NAME
GPUS_PER_NODE: Final = 8
#: Pods created (and later deleted) at once through the namespace's client threads.
CLIENT_THREADS: Final = 4
#: Upstream's CI thresholds at 500 nodes (pods/s), by workload.
UPSTREAM_THRESHOLDS: Final = {
    "SchedulingWithResourceClaimTemplate/5000pods_500nodes": 56.0,
    "SteadyStateClusterResourceClaimTemplate/empty_500nodes": 64.0,
}
#: The threshold the targets use.
TARGET_PODS_PER_S: Final = 40.0
TARGET_MODE_RATIO: Final = 1.5


def _request(cls: str, **extra: Any) -> dict[str, Any]:
    return {
        "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls, **extra}}]}
    }


@dataclasses.dataclass(frozen=True)
class Batch:
    """Pods of one shape: the claim template's spec (None: no claim) and the sharegpu mode whose
    slices are published meanwhile."""

    key: str
    title: str
    mode: str
    claim: dict[str, Any] | None


CONSUMABLE, PARTITIONS, EXCLUSIVE = (
    names.SHARING_MODE_CONSUMABLE,
    names.SHARING_MODE_PARTITIONS,
    names.SHARING_MODE_EXCLUSIVE,
)
QUARTER: Final = f"device.attributes['{SHAREGPU}'].partition == 'quarter'"
BATCHES: Final = (
    Batch("no-claim", "pods without claims", CONSUMABLE, None),
    Batch("test-driver", "upstream test driver, one device", CONSUMABLE, testdriver.claim_spec()),
    Batch(
        CONSUMABLE,
        "consumable capacity: 30 cores + 4Gi of a GPU",
        CONSUMABLE,
        _request(SHAREGPU, capacity={"requests": {"cores": "30", "memory": "4Gi"}}),
    ),
    Batch(
        PARTITIONS,
        "partitions: a quarter GPU",
        PARTITIONS,
        _request(SHAREGPU, selectors=[{"cel": {"expression": QUARTER}}]),
    ),
    Batch(EXCLUSIVE, "whole GPUs: one GPU", EXCLUSIVE, _request(SHAREGPU)),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.schedthroughput", description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--pods", type=int, default=2000, help="pods per batch (at most 8/node)")
    parser.add_argument("--batches", nargs="+", default=[b.key for b in BATCHES])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    return parser


# --- the cluster -----------------------------------------------------------------------------


@contextmanager
def control_plane(work: Path) -> Iterator[ControlPlane]:
    """etcd, kube-apiserver and the controller manager (client QPS 1000, so that claims from
    templates are created faster than a batch is scheduled); the plane's own scheduler stopped."""
    absent = missing_binaries()
    if absent:
        raise SystemExit(f"schedthroughput bench cannot run: binaries not built: {absent}")
    plane = ControlPlane(
        bin_dir(),
        work,
        {"kube-controller-manager": ["--kube-api-qps=1000", "--kube-api-burst=2000"]},
    )
    try:
        plane.start()
        for process in list(plane.processes.started):
            if process.name == "kube-scheduler":
                plane.processes.stop(process)
        yield plane
    finally:
        plane.stop()


def parallel(plane: ControlPlane, calls: list[tuple[str, str, Any]], what: str) -> None:
    """Send ``(method, path, body)`` requests on :data:`CLIENT_THREADS` threads; fail on an
    error answer."""

    def send(call: tuple[str, str, Any]) -> None:
        method, path, body = call
        content = "application/merge-patch+json" if method == "PATCH" else "application/json"
        code, answer = plane.request(method, path, body, content_type=content)
        if code >= 300:
            raise StepFailed(f"{what}: {method} {path}: {code} {str(answer)[:300]}")

    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        list(pool.map(send, calls))


def node_name(i: int) -> str:
    return f"bench-node-{i:04d}"


def create_nodes(plane: ControlPlane, first: int, last: int) -> None:
    """Ready Node objects ``first``..``last - 1`` with room for pods and no kubelet."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    nodes = [node_name(i) for i in range(first, last)]
    parallel(
        plane,
        [
            (
                "POST",
                "/api/v1/nodes",
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}},
                },
            )
            for n in nodes
        ],
        "create nodes",
    )
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Bench"}],
        }
    }
    parallel(plane, [("PATCH", f"/api/v1/nodes/{n}/status", status) for n in nodes], "node status")
    # The API server taints a new node not-ready; no node lifecycle controller runs to lift it.
    untaint = {"spec": {"taints": None}}
    parallel(plane, [("PATCH", f"/api/v1/nodes/{n}", untaint) for n in nodes], "node taints")


def publish(
    plane: ControlPlane, nodes: int, driver_name: str, slices: Callable[[str], list[Any]]
) -> None:
    """Replace every slice of ``driver_name`` with ``slices(node)`` of each node."""
    base = "/apis/resource.k8s.io/v1/resourceslices"
    code, answer = plane.request("DELETE", f"{base}?fieldSelector=spec.driver={driver_name}")
    if code >= 300:
        raise StepFailed(f"delete the slices of {driver_name}: {code} {answer}")
    calls = [("POST", base, s) for i in range(nodes) for s in slices(node_name(i))]
    parallel(plane, calls, f"publish the slices of {driver_name}")


def sharegpu_slices(mode: str) -> Callable[[str], list[Any]]:
    def render(node: str) -> list[Any]:
        gpus = MockBackend(node).discover()
        return preview_slices(
            gpus, mode, names.CORES_PER_GPU, names.MIG_STRATEGY_STATIC, SHAREGPU, node
        )

    return render


# --- one batch -------------------------------------------------------------------------------


def start_scheduler(plane: ControlPlane, work: Path) -> Process:
    """kube-scheduler with the client QPS and burst of upstream's scheduler_perf (5000)."""
    kubeconfig = work / "bench-scheduler.kubeconfig"
    if not kubeconfig.exists():
        cert = plane.pki.issue("bench-scheduler", user="system:kube-scheduler")
        write_kubeconfig(kubeconfig, plane.server, plane.pki.ca_file, cert=cert)
    config = work / "bench-scheduler.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 5000, "burst": 5000},
                "leaderElection": {"leaderElect": False},
            }
        )
    )
    return plane.processes.start(
        "kube-scheduler-bench",
        [
            str(plane.bin / "kube-scheduler"),
            f"--config={config}",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            f"--feature-gates={FEATURE_GATES}",
        ],
    )


def pod(name: str, claim: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "localhost/bench/none:1", "command": ["true"]}],
        "terminationGracePeriodSeconds": 0,
    }
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "bench"}]
        spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def count(plane: ControlPlane, path: str) -> int:
    code, answer = plane.request("GET", path + "?limit=1")
    if code != 200:
        raise StepFailed(f"GET {path}: {code}")
    meta = answer["metadata"]
    return len(answer["items"]) + int(meta.get("remainingItemCount") or 0)


def run_batch(
    plane: ControlPlane, work: Path, batch: Batch, nodes: int, pods: int
) -> dict[str, Any]:
    ns = f"bench-{nodes}-{batch.key}"
    plane.create_namespace(ns)
    if batch.claim is not None:
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "bench", "namespace": ns},
            "spec": {"spec": batch.claim},
        }
        path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates"
        parallel(plane, [("POST", path, template)], "the claim template")
    pods_path = f"/api/v1/namespaces/{ns}/pods"
    claims_path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    created = time.monotonic()
    with_claim = batch.claim is not None
    parallel(plane, [("POST", pods_path, pod(f"p{i}", with_claim)) for i in range(pods)], "pods")
    if batch.claim is not None:
        wait_until(
            lambda: count(plane, claims_path) >= pods,
            "the controller manager creates the claims",
            f"{pods} claims in {ns}",
            deadline_s=900,
            interval_s=2.0,
        )
    prepared = time.monotonic()
    watch = PodWatch(plane, ns)
    watch.start()
    scheduler = start_scheduler(plane, work)
    started = time.monotonic()
    try:
        watch.wait([f"p{i}" for i in range(pods)], running=False, timeout_s=1800)
    finally:
        plane.processes.stop(scheduler)
        watch.stop()
    bound = sorted(watch.bound.values())
    first, last = bound[0], bound[-1]
    result = {
        "batch": batch.key,
        "title": batch.title,
        "mode": batch.mode,
        "nodes": nodes,
        "pods": pods,
        "pods_per_s": (len(bound) - 1) / (last - first) if last > first else float("nan"),
        "first_bind_after_start_s": first - started,
        "schedule_s": last - first,
        "create_s": prepared - created,
    }
    print(
        f"  {nodes:>4} nodes {batch.key:<12} {pods} pods: {result['pods_per_s']:.1f} pods/s "
        f"({last - first:.1f} s from first to last binding)",
        flush=True,
    )
    # One DELETE per pod: a collection DELETE of 2,000 pods outlasts the API server's request
    # timeout on a loaded machine. Grace 0: no kubelet runs here to confirm a graceful deletion.
    parallel(
        plane,
        [("DELETE", f"{pods_path}/p{i}?gracePeriodSeconds=0", None) for i in range(pods)],
        "delete the pods",
    )
    wait_until(
        lambda: count(plane, pods_path) == 0 and count(plane, claims_path) == 0,
        "delete the batch",
        f"no pod and no claim left in {ns}",
        deadline_s=900,
        interval_s=2.0,
    )
    plane.request("DELETE", f"/api/v1/namespaces/{ns}")
    return result


# --- figures ---------------------------------------------------------------------------------


def ratios(results: list[dict[str, Any]]) -> dict[str, float]:
    """Each sharegpu mode's throughput over whole-GPU mode's, at each node count."""
    by = {(r["nodes"], r["batch"]): r["pods_per_s"] for r in results}
    out = {}
    for (nodes, key), value in by.items():
        whole = by.get((nodes, EXCLUSIVE))
        if key in (CONSUMABLE, PARTITIONS) and whole:
            out[f"{key}/{nodes}"] = value / whole
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM or SIGINT ends the run like Ctrl-C: the cluster is stopped by PID and its
    # namespace removed.
    interrupt_on_signals()
    helm = helm_binary()
    if helm is None:
        raise SystemExit("schedthroughput bench cannot run: helm not found (tests/install-helm.sh)")
    by_key = {b.key: b for b in BATCHES}
    unknown = [k for k in args.batches if k not in by_key]
    if unknown:
        raise SystemExit(f"unknown batches {unknown} (allowed: {', '.join(by_key)})")
    batches = [by_key[k] for k in args.batches]
    work = args.work or Path(tempfile.mkdtemp(prefix="sharegpu-sched-"))
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    started = time.time()
    results: list[dict[str, Any]] = []

    def figures() -> dict[str, Any]:
        return {
            "bench": "schedthroughput",
            "kubernetes": kubernetes_version(),
            "machine": {
                "cpus": os.cpu_count(),
                "load_before": load_before,
                "load_now": os.getloadavg(),
            },
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "seconds": time.time() - started,
            "results": results,
            "ratios_over_whole_gpu": ratios(results),
            "upstream_thresholds": UPSTREAM_THRESHOLDS,
        }

    def save() -> None:
        """The figures so far (after every batch, so a failed batch keeps the earlier ones)."""
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(figures(), indent=1) + "\n")

    with control_plane(work) as plane:
        classes = [d for d in driver.render_chart(helm) if d["kind"] == "DeviceClass"]
        driver.apply(plane, [*classes, testdriver.device_class()], "the DeviceClasses")
        made = 0
        for nodes in sorted(args.nodes):
            create_nodes(plane, made, nodes)
            made = nodes
            pods = min(args.pods, nodes * GPUS_PER_NODE)
            publish(plane, nodes, testdriver.DRIVER, lambda n: [testdriver.slice_for(n, 8)])
            mode = ""
            for batch in batches:
                if batch.mode != mode:
                    publish(plane, nodes, SHAREGPU, sharegpu_slices(batch.mode))
                    mode = batch.mode
                results.append(run_batch(plane, work, batch, nodes, pods))
                save()
    print("\nbound pods/s (first to last binding)")
    for r in results:
        print(
            f"{r['nodes']:>5} nodes  {r['batch']:<12} {r['pods']:>5} pods  {r['pods_per_s']:7.1f}"
        )
    for name, value in ratios(results).items():
        floor = 1 / TARGET_MODE_RATIO
        print(f"{name}: {value:.2f}x whole-GPU mode's throughput (target >= {floor:.2f}x)")
    print(f"target at 500 nodes: >= {TARGET_PODS_PER_S:.0f} pods/s")
    print(f"upstream CI thresholds: {UPSTREAM_THRESHOLDS}")
    if args.json:
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
