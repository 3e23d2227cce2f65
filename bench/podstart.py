"""Pod start with a claim on a real kubelet: sharegpu's shapes against upstream's Go test driver.

Brings up what ``make e2e`` tests (tests/e2e: a sealed network namespace, etcd, the control
plane, containerd, a kubelet, kube-proxy, the chart installed with ``helm install`` on
:data:`MOCK_GPUS` mock GPUs) and runs upstream's DRA test driver
(``k8s.io/kubernetes/test/e2e/dra/test-driver``, :mod:`bench.testdriver`) as a second kubelet
plugin on the same node with :data:`MOCK_GPUS` devices. Then, for each shape of :data:`SHAPES`:

- ``--sequential`` rounds: one pod of each shape, one after another (the order rotates every
  round), each created once the previous one runs; the round's pods are deleted after it;
- ``--rounds`` rounds of bursts: ``--burst`` pods of one shape created at once, each shape in
  turn; the node is emptied (pods and claims gone) between bursts.

Claims come from ResourceClaimTemplates, as workloads use them (the resourceclaim controller
creates each pod's claim). A pod's start is the time from just before its POST to the first
watch event showing it Running. Shapes share the noise: they interleave in one run.

NodePrepareResources is read from the kubelet's own metrics (``/metrics`` through the API
server's node proxy): ``dra_grpc_operations_duration_seconds`` (the kubelet's gRPC call,
``method_name`` .../NodePrepareResources, by ``driver_name``) and
``dra_operations_duration_seconds{operation_name="PrepareResources"}`` (all claims of a pod).
Their lowest bucket is 0.1 s, so a quantile from the buckets only says "under 0.1 s"; the
sequential phase scrapes the metrics around every pod, and the difference of ``_sum`` over one
observation is that call's exact duration.

The MPS share with a per-claim daemon pod (shape ``c``) is measured only where the plugin starts
daemons as pods (a probe claim shows one); the mock backend without daemon pods simulates the
daemon in the plugin's process, and the shape is then reported as not measured with that reason.

Run as root: ``python -m bench.podstart [--sequential 50] [--burst 20] [--rounds 3]
[--json bench/results/podstart.json]`` (``make bench PART=podstart``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from bench import testdriver
from bench.podwatch import PodWatch
from bench.promhist import Histogram, histograms
from tests.deploy.helpers import helm_binary
from tests.e2e import driver
from tests.e2e.binaries import kubernetes_version
from tests.e2e.cluster import Cluster, missing, running_cluster
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import BUSYBOX_IMAGE
from tests.e2e.processes import StepFailed, interrupt_on_signals, wait_until

NAMESPACE: Final = "bench"
#: Devices of each driver on the node: room for a burst of whole devices.
MOCK_GPUS: Final = 24
SHAREGPU: Final = "gpu.sharegpu.dev"
WHOLE_SELECTOR: Final = (
    f"!('partition' in device.attributes['{SHAREGPU}']) || "
    f"device.attributes['{SHAREGPU}'].partition == 'whole'"
)
GRPC_METRIC: Final = "dra_grpc_operations_duration_seconds"
OPERATION_METRIC: Final = "dra_operations_duration_seconds"
PREPARE_METHOD: Final = "NodePrepareResources"
DAEMON_LABEL: Final = "mps.sharegpu.dev/daemon"


@dataclasses.dataclass(frozen=True)
class Shape:
    """One kind of pod: its claim template's spec (None: no claim) and the claim's driver."""

    key: str
    title: str
    claim: dict[str, Any] | None
    driver: str | None


#: The MPS shares (c) take the GPUs below this index, the TimeSlicing shares (d) the others: the
#: plugin refuses two strategies on one GPU, and the scheduler knows nothing of strategies.
SHARE_SPLIT: Final = MOCK_GPUS // 2


def _share(strategy: str | None, gpus: str) -> dict[str, Any]:
    """30 cores and 4Gi of a GPU whose index satisfies ``gpus`` (a CEL comparison)."""
    request = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": SHAREGPU,
            "selectors": [{"cel": {"expression": f"device.attributes['{SHAREGPU}'].index {gpus}"}}],
            "capacity": {"requests": {"cores": "30", "memory": "4Gi"}},
        },
    }
    devices: dict[str, Any] = {"requests": [request]}
    if strategy is not None:
        devices["config"] = [
            {
                "requests": ["gpu"],
                "opaque": {
                    "driver": SHAREGPU,
                    "parameters": {
                        "apiVersion": "resource.sharegpu.dev/v1alpha1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": strategy},
                    },
                },
            }
        ]
    return {"devices": devices}


WHOLE: Final = {
    "devices": {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": SHAREGPU,
                    "selectors": [{"cel": {"expression": WHOLE_SELECTOR}}],
                },
            }
        ]
    }
}
SHAPES: Final = {
    "a": Shape("a", "no claim", None, None),
    "b": Shape("b", "whole mock GPU (sharegpu)", WHOLE, SHAREGPU),
    "c": Shape(
        "c",
        "MPS share, per-claim daemon pod (sharegpu)",
        _share(None, f"< {SHARE_SPLIT}"),
        SHAREGPU,
    ),
    "d": Shape(
        "d",
        "consumable-capacity share, TimeSlicing, no daemon (sharegpu)",
        _share("TimeSlicing", f">= {SHARE_SPLIT}"),
        SHAREGPU,
    ),
    "e": Shape(
        "e", "whole device (upstream Go test driver)", testdriver.claim_spec(), testdriver.DRIVER
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.podstart", description=__doc__)
    parser.add_argument("--sequential", type=int, default=50, help="pods of each shape one by one")
    parser.add_argument("--burst", type=int, default=20, help="pods of a burst")
    parser.add_argument("--rounds", type=int, default=3, help="bursts of each shape")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    return parser


# --- the cluster -----------------------------------------------------------------------------


@contextmanager
def cluster(work: Path) -> Iterator[Cluster]:
    """The e2e cluster with the chart on :data:`MOCK_GPUS` mock GPUs and the test driver; all of
    it stopped by PID and removed afterwards."""
    problems = missing()
    helm = helm_binary()
    executable = testdriver.binary()
    if executable is None:
        problems.append("the test driver is not built (tests/e2e/build-binaries.sh test-driver)")
    if problems or helm is None or executable is None:
        raise SystemExit("podstart bench cannot run: " + "; ".join(problems))
    print("starting the control plane, a node, the chart and the test driver ...", flush=True)
    with running_cluster(work, helm, (f"kubeletPlugin.mock.gpus={MOCK_GPUS}",)) as c:
        try:
            driver.apply(c.plane, [testdriver.device_class()], "the test driver's DeviceClass")
            testdriver.start(c.plane, c.node, MOCK_GPUS, executable)
            c.plane.create_namespace(NAMESPACE)
            yield c
        finally:
            c.plane.kubectl("delete", "namespace", NAMESPACE, "--timeout=120s", check=False)


# --- pods ------------------------------------------------------------------------------------


def create_templates(plane: ControlPlane, shapes: list[Shape]) -> None:
    for shape in shapes:
        if shape.claim is None:
            continue
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"shape-{shape.key}", "namespace": NAMESPACE},
            "spec": {"spec": shape.claim},
        }
        _post(
            plane,
            f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
            template,
        )


def pod(name: str, node: str, shape: Shape) -> dict[str, Any]:
    """A busybox pod sleeping on ``node``, with the shape's claim from its template."""
    container: dict[str, Any] = {
        "name": "c",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
    }
    spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        # Deleted gracefully: a force deletion would let the claim be deallocated (and its device
        # given to the next claim) before the kubelet unprepares it.
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    if shape.claim is not None:
        spec["resourceClaims"] = [
            {"name": "gpu", "resourceClaimTemplateName": f"shape-{shape.key}"}
        ]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _post(plane: ControlPlane, path: str, body: dict[str, Any]) -> None:
    code, answer = plane.request("POST", path, body)
    if code not in (200, 201):
        raise StepFailed(f"POST {path}: {code} {answer}")


def create_pod(plane: ControlPlane, name: str, node: str, shape: Shape) -> float:
    """Create the pod; returns the monotonic time just before the request."""
    start = time.monotonic()
    _post(plane, f"/api/v1/namespaces/{NAMESPACE}/pods", pod(name, node, shape))
    return start


def empty_namespace(plane: ControlPlane) -> None:
    """Delete every pod of the namespace at once (gracefully: the kubelet stops and unprepares
    them first) and wait until no pod or claim is left."""
    plane.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods")

    def empty() -> bool:
        pods = plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")[1]["items"]
        claims = plane.request(
            "GET", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
        )[1]["items"]
        return not pods and not claims

    wait_until(empty, "empty the bench namespace", "no pod and no claim left", deadline_s=300)


# --- the kubelet's metrics -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Scrape:
    """The kubelet's DRA histograms at one moment: NodePrepareResources by driver, and the
    kubelet's PrepareResources of a whole pod."""

    grpc: dict[str, Histogram]
    operation: Histogram | None

    def minus(self, earlier: Scrape) -> Scrape:
        return Scrape(
            {d: h.minus(earlier.grpc.get(d)) for d, h in self.grpc.items()},
            self.operation.minus(earlier.operation) if self.operation else None,
        )


def scrape(plane: ControlPlane, node: str) -> Scrape:
    code, text = plane.request("GET", f"/api/v1/nodes/{node}/proxy/metrics")
    if code != 200 or not isinstance(text, str):
        raise StepFailed(f"kubelet metrics: {code}")
    grpc: dict[str, Histogram] = {}
    for labels, hist in histograms(text, GRPC_METRIC).items():
        fields = dict(labels)
        if fields.get("method_name", "").endswith(PREPARE_METHOD):
            name = fields.get("driver_name", "")
            grpc[name] = grpc[name].plus(hist) if name in grpc else hist
    operation = None
    for labels, hist in histograms(text, OPERATION_METRIC).items():
        if dict(labels).get("operation_name") == "PrepareResources":
            operation = hist if operation is None else operation.plus(hist)
    return Scrape(grpc, operation)


# --- the phases ------------------------------------------------------------------------------


@dataclasses.dataclass
class ShapeResult:
    sequential: list[float] = dataclasses.field(default_factory=list)
    burst: list[float] = dataclasses.field(default_factory=list)
    burst_walls: list[float] = dataclasses.field(default_factory=list)
    #: Exact NodePrepareResources (one call per pod, sequential phase).
    prepare_exact: list[float] = dataclasses.field(default_factory=list)
    #: Exact kubelet PrepareResources of the pod (sequential phase).
    pod_prepare_exact: list[float] = dataclasses.field(default_factory=list)
    #: Histogram of every NodePrepareResources of the shape (both phases).
    prepare_hist: Histogram | None = None
    #: Each MPS daemon pod's start (first seen -> Running), by the phase it started in.
    daemon_starts: dict[str, list[float]] = dataclasses.field(default_factory=dict)


def _add(result: ShapeResult, delta: Scrape, shape: Shape) -> None:
    if shape.driver is None:
        return
    hist = delta.grpc.get(shape.driver)
    if hist is None or hist.count <= 0:
        return
    result.prepare_hist = hist if result.prepare_hist is None else result.prepare_hist.plus(hist)


def sequential(
    c: Cluster, watch: PodWatch, shapes: list[Shape], rounds: int, results: dict[str, ShapeResult]
) -> None:
    plane, node = c.plane, c.node.name
    for i in range(rounds):
        order = shapes[i % len(shapes) :] + shapes[: i % len(shapes)]
        for shape in order:
            name = f"s{i}-{shape.key}"
            before = scrape(plane, node)
            start = create_pod(plane, name, node, shape)
            watch.wait([name])
            results[shape.key].sequential.append(watch.running[name] - start)
            delta = scrape(plane, node).minus(before)
            _add(results[shape.key], delta, shape)
            if shape.driver is not None:
                hist = delta.grpc.get(shape.driver)
                if hist is not None and hist.count == 1:
                    results[shape.key].prepare_exact.append(hist.sum)
                if delta.operation is not None and delta.operation.count == 1:
                    results[shape.key].pod_prepare_exact.append(delta.operation.sum)
        empty_namespace(plane)
        print(f"  sequential round {i + 1}/{rounds} done", flush=True)


def bursts(
    c: Cluster,
    watch: PodWatch,
    shapes: list[Shape],
    rounds: int,
    size: int,
    results: dict[str, ShapeResult],
) -> None:
    plane, node = c.plane, c.node.name
    for r in range(rounds):
        order = shapes[r % len(shapes) :] + shapes[: r % len(shapes)]
        for shape in order:
            before = scrape(plane, node)
            starts = {}
            for j in range(size):
                name = f"b{r}-{shape.key}-{j}"
                starts[name] = create_pod(plane, name, node, shape)
            watch.wait(starts, timeout_s=600)
            result = results[shape.key]
            result.burst += [watch.running[n] - t for n, t in starts.items()]
            result.burst_walls.append(max(watch.running[n] for n in starts) - min(starts.values()))
            _add(result, scrape(plane, node).minus(before), shape)
            empty_namespace(plane)
        print(f"  burst round {r + 1}/{rounds} done", flush=True)


def probe_daemon_pods(c: Cluster) -> str | None:
    """None where an MPS share's prepare starts a daemon pod, else why shape c is not measured."""
    plane, node = c.plane, c.node.name
    create_pod(plane, "probe-mps", node, SHAPES["c"])
    try:
        wait_until(
            lambda: (
                plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/probe-mps")[1]
                .get("status", {})
                .get("phase")
                == "Running"
            ),
            "probe: an MPS share's pod runs",
            "pod probe-mps Running",
            deadline_s=300,
        )
        code, pods = plane.request(
            "GET", f"/api/v1/namespaces/{driver.NAMESPACE}/pods?labelSelector={DAEMON_LABEL}"
        )
        found = code == 200 and bool(pods.get("items"))
    finally:
        empty_namespace(plane)
    if found:
        return None
    return (
        "the plugin's mock backend simulates the MPS daemon in its own process here (no daemon "
        f"pod labelled {DAEMON_LABEL} appeared for an MPS share), so the daemon-pod start a GPU "
        "node pays is not on this path"
    )


# --- figures ---------------------------------------------------------------------------------


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank above) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.999999) - 1))]


def summary(results: dict[str, ShapeResult], skipped: dict[str, str]) -> dict[str, Any]:
    base = results.get("a")
    out: dict[str, Any] = {}
    for key, r in results.items():
        entry: dict[str, Any] = {"title": SHAPES[key].title}
        for phase, values in (("sequential", r.sequential), ("burst", r.burst)):
            entry[phase] = {
                "n": len(values),
                "p50": quantile(values, 0.5),
                "p99": quantile(values, 0.99),
                "values": values,
            }
            if base is not None and key != "a":
                ref = base.sequential if phase == "sequential" else base.burst
                entry[phase]["added_p50"] = quantile(values, 0.5) - quantile(ref, 0.5)
                entry[phase]["added_p99"] = quantile(values, 0.99) - quantile(ref, 0.99)
        entry["burst_walls"] = r.burst_walls
        if key == "c":
            every = [v for values in r.daemon_starts.values() for v in values]
            entry["daemon_start"] = {
                "n": len(every),
                "p50": quantile(every, 0.5),
                "p99": quantile(every, 0.99),
            }
            for phase, values in r.daemon_starts.items():
                entry["daemon_start"][phase] = {
                    "n": len(values),
                    "p50": quantile(values, 0.5),
                    "p99": quantile(values, 0.99),
                    "values": values,
                }
        entry["prepare_exact"] = {
            "n": len(r.prepare_exact),
            "p50": quantile(r.prepare_exact, 0.5),
            "p99": quantile(r.prepare_exact, 0.99),
            "values": r.prepare_exact,
        }
        entry["pod_prepare_exact"] = {
            "n": len(r.pod_prepare_exact),
            "p50": quantile(r.pod_prepare_exact, 0.5),
            "p99": quantile(r.pod_prepare_exact, 0.99),
        }
        if r.prepare_hist is not None:
            h = r.prepare_hist
            entry["prepare_histogram"] = {
                "count": h.count,
                "mean": h.sum / h.count if h.count else float("nan"),
                "p50": h.quantile(0.5),
                "p99": h.quantile(0.99),
                "lowest_bucket": h.lowest_bound,
                "under_lowest_bucket": h.buckets.get(h.lowest_bound, 0.0) / h.count,
            }
        out[key] = entry
    for key, reason in skipped.items():
        out[key] = {"title": SHAPES[key].title, "not_measured": reason}
    return out


def ratios(figures: dict[str, Any]) -> dict[str, float]:
    """Added pod-start latency (p50, each phase) of b, c and d over the Go test driver's (e),
    and of c over the Go driver's plus the p50 start of the MPS daemon pods of the same phase
    (``c+daemon/<phase>``: the target for the MPS shape)."""
    out = {}
    for key in ("b", "c", "d"):
        if key not in figures or "not_measured" in figures[key] or "e" not in figures:
            continue
        for phase in ("sequential", "burst"):
            ours = figures[key][phase].get("added_p50")
            peer = figures["e"][phase].get("added_p50")
            if ours is not None and peer:
                out[f"{key}/{phase}"] = ours / peer
            daemon = figures[key].get("daemon_start", {}).get(phase)
            if ours is not None and peer is not None and daemon and daemon["n"]:
                out[f"c+daemon/{phase}"] = ours / (peer + daemon["p50"])
    return out


def report(figures: dict[str, Any]) -> None:
    ms = 1000.0
    print("\npod create -> Running (ms); added = shape p50 (p99) minus no-claim p50 (p99)")
    print(
        f"{'shape':<6}{'seq p50':>9}{'seq p99':>9}{'added':>15}{'burst p50':>11}"
        f"{'burst p99':>11}{'added':>15}"
    )
    for key, f in sorted(figures.items()):
        if "not_measured" in f:
            print(f"{key:<6}not measured: {f['not_measured']}")
            continue
        s, b = f["sequential"], f["burst"]
        added_s = f"{s.get('added_p50', 0) * ms:.0f} ({s.get('added_p99', 0) * ms:.0f})"
        added_b = f"{b.get('added_p50', 0) * ms:.0f} ({b.get('added_p99', 0) * ms:.0f})"
        print(
            f"{key:<6}{s['p50'] * ms:>9.0f}{s['p99'] * ms:>9.0f}{added_s:>15}"
            f"{b['p50'] * ms:>11.0f}{b['p99'] * ms:>11.0f}{added_b:>15}"
        )
    print(
        f"\nNodePrepareResources ({GRPC_METRIC}, ms): exact per pod in the sequential phase; "
        "histogram over both phases"
    )
    for key, f in sorted(figures.items()):
        if "not_measured" in f or key == "a":
            continue
        e, h = f["prepare_exact"], f.get("prepare_histogram", {})
        print(
            f"{key:<6}exact p50 {e['p50'] * ms:.1f} p99 {e['p99'] * ms:.1f} (n={e['n']}); "
            f"histogram n={h.get('count', 0):.0f} mean {h.get('mean', float('nan')) * ms:.1f} "
            f"p50 {h.get('p50', float('nan')) * ms:.0f} p99 {h.get('p99', float('nan')) * ms:.0f}"
            f", {h.get('under_lowest_bucket', float('nan')):.0%} under "
            f"{h.get('lowest_bucket', float('nan')) * ms:.0f} ms"
        )
    daemon = figures.get("c", {}).get("daemon_start")
    if daemon is not None:
        print(
            f"\nMPS daemon pod start (created -> Running), shape c: p50 {daemon['p50'] * ms:.0f} "
            f"ms, p99 {daemon['p99'] * ms:.0f} ms (n={daemon['n']})"
        )
        for phase in ("sequential", "burst"):
            d = daemon.get(phase)
            if d is not None:
                print(
                    f"  {phase}: p50 {d['p50'] * ms:.0f} ms, p99 {d['p99'] * ms:.0f} ms "
                    f"(n={d['n']})"
                )
    for name, value in ratios(figures).items():
        if name.startswith("c+daemon/"):
            print(
                f"added latency c/{name.split('/')[1]} over the Go test driver's plus the daemon "
                f"start: {value:.2f}x (target <= 1.0)"
            )
        else:
            print(f"added latency {name} over the Go test driver's: {value:.2f}x (target <= 1.2)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM or SIGINT ends the run like Ctrl-C: the cluster is stopped by PID and its
    # namespace removed.
    interrupt_on_signals()
    work = args.work or Path(tempfile.mkdtemp(prefix="sharegpu-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    started = time.time()
    with cluster(work) as c:
        create_templates(c.plane, list(SHAPES.values()))
        skipped: dict[str, str] = {}
        reason = probe_daemon_pods(c)
        if reason is not None:
            skipped["c"] = reason
        shapes = [s for k, s in SHAPES.items() if k not in skipped]
        results = {s.key: ShapeResult() for s in shapes}
        watch = PodWatch(c.plane, NAMESPACE)
        watch.start()
        # The MPS daemon pods the plugin starts for shape c: each one's start, created -> Running.
        daemons = PodWatch(c.plane, driver.NAMESPACE, DAEMON_LABEL)
        daemons.start()
        bursts_began = float("inf")
        try:
            print(f"sequential: {args.sequential} rounds of {len(shapes)} shapes", flush=True)
            sequential(c, watch, shapes, args.sequential, results)
            print(f"bursts: {args.rounds} rounds of {args.burst} pods per shape", flush=True)
            bursts_began = time.monotonic()
            bursts(c, watch, shapes, args.rounds, args.burst, results)
        finally:
            watch.stop()
            daemons.stop()
        if "c" in results:
            # The plugin deletes a daemon pod when it unprepares its claim: the watch keeps the
            # start of every daemon pod it saw Running.
            for added, running in daemons.started.values():
                phase = "sequential" if added < bursts_began else "burst"
                results["c"].daemon_starts.setdefault(phase, []).append(running - added)
    raw = {k: dataclasses.asdict(r) for k, r in results.items()}
    (work / "podstart-raw.json").write_text(json.dumps(raw, default=str))
    figures = summary(results, skipped)
    report(figures)
    document = {
        "bench": "podstart",
        "kubernetes": kubernetes_version(),
        "machine": {
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": time.time() - started,
        "args": {"sequential": args.sequential, "burst": args.burst, "rounds": args.rounds},
        "metric": GRPC_METRIC,
        "shapes": figures,
        "ratios": ratios(figures),
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
