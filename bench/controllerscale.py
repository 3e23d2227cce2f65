"""The controller's GPU tracker against the real kube-apiserver: ``--nodes`` nodes of 8 mock
H100s (the plugin's own slices, consumable-capacity mode) and ``--claims`` allocated claims
with their pods, and the admission webhook's latency while the API server is busy.

Starts the control plane of the end-to-end run (tests/e2e: etcd and kube-apiserver of the pinned
release, in the run's sealed network namespace; the controller manager only until the
namespaces have their ServiceAccount, and no scheduler, so nothing but this bench writes), applies
the CRDs, then, while the real ``WebhookServer`` (:func:`bench.webhook.serve`, its own process
inside the namespace) gets AdmissionReviews open-loop at ``--rate`` per second from a process
of its own inside the namespace, each review's latency counted in the phase it was sent in:

1. ``quiet``: ``--quiet-s`` seconds with the API server idle;
2. ``load``: the slices (one per node, :func:`kubeletplugin.devices.slices.preview_slices`), the
   pods and the claims are created through :data:`bench.schedthroughput.CLIENT_THREADS` client
   threads, each claim then given its allocation (a status patch; :mod:`bench.tracker`'s
   shapes: one share of 1-10 cores and 256Mi-2Gi of one GPU, reserved for its pod);
3. ``sync``: a real controller ``Tracker`` starts in a child process of its own (an interpreter
   alone, as in the controller's pod), with the admin kubeconfig; it reports the time until its
   informers have listed everything, the time until every GPU object is created and its status
   written, the CPU time its process used (from its start, imports included), and its resident
   memory (now and peak, ``VmRSS``/``VmHWM``).

The API server's and etcd's resident memory are read from /proc at the end.

Run as root: ``python -m bench.controllerscale [--nodes 1000] [--claims 5000] [--rate 50]
[--json bench/results/controllerscale.json]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Final

from api import names
from bench import webhook
from bench.schedthroughput import CONSUMABLE, control_plane, parallel, sharegpu_slices
from bench.tracker import NAMESPACES, make_claim, make_pod, node_name, proc_mib
from tests.e2e import driver
from tests.e2e.binaries import kubernetes_version
from tests.e2e.controlplane import ControlPlane
from tests.e2e.processes import StepFailed, interrupt_on_signals
from tests.paths import REPO_ROOT

DRIVER: Final = names.DEFAULT_DRIVER_NAME
GPUS_PER_NODE: Final = 8
PHASES: Final = ("quiet", "load", "sync")
GPUS_PATH: Final = f"/apis/{names.API_GROUP}/{names.API_VERSION}/{names.GPU_PLURAL}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.controllerscale", description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000, help="nodes of 8 GPUs (1000)")
    parser.add_argument("--claims", type=int, default=5000, help="allocated claims (5000)")
    parser.add_argument("--rate", type=float, default=50.0, help="webhook reviews per second")
    parser.add_argument("--quiet-s", type=float, default=20.0, help="seconds of the quiet phase")
    parser.add_argument("--cpu", type=int, default=0, help="CPU the webhook server is pinned to")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--tracker", metavar="KUBECONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--reviews", nargs=2, metavar=("PORT", "CAFILE"), help=argparse.SUPPRESS)
    return parser


# --- the tracker's own process ---------------------------------------------------------------


def tracker_child(kubeconfig: str) -> int:
    """Child process (inside the namespace): start a Tracker, print one JSON line of figures
    once every GPU object is written, then run until standard input closes."""
    from controller.tracker import Tracker
    from sharegpu.kube.rest import KubeRest, load_api_client

    rss0 = proc_mib()
    api_client = load_api_client(kubeconfig)
    tracker = Tracker(KubeRest(api_client), DRIVER)
    start = time.perf_counter()
    tracker.start()
    try:
        if not tracker.wait_synced(1800):
            raise SystemExit("the tracker's informers did not list everything in 30 min")
        listed = time.perf_counter() - start
        while not tracker.idle():
            time.sleep(0.05)
        written = time.perf_counter() - start
        figures = {
            "listed_s": listed,
            "written_s": written,
            "writes": tracker.writes,
            "cpu_s": time.process_time(),
            "rss_before_mib": rss0,
            "rss_mib": proc_mib(),
            "peak_rss_mib": proc_mib("VmHWM"),
        }
        print(json.dumps(figures), flush=True)
        sys.stdin.read()
    finally:
        tracker.stop()
        api_client.close()
    return 0


# --- the webhook under load ------------------------------------------------------------------


def reviews_child(port: int, cafile: str, rate: float) -> int:
    """Child process (inside the namespace, an interpreter of its own so that no other thread
    of the bench holds its GIL): send AdmissionReviews open-loop at ``rate`` per second to the
    webhook server at ``port``, each latency (scheduled send to full answer) kept under the
    phase named by the last line read from standard input; at ``stop`` (or its end) print one
    JSON line ``{"latencies": {phase: [s, ...]}, "answers": {...}}``."""
    phase = [PHASES[0]]
    stopping = threading.Event()

    def read_phases() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
            phase[0] = line.strip()
        stopping.set()

    threading.Thread(target=read_phases, daemon=True).start()
    context = ssl.create_default_context(cafile=cafile)
    conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=60)
    bodies = [json.dumps(webhook.review(o)).encode() for o in webhook.objects()]
    headers = {"Content-Type": "application/json"}
    for i in range(50):  # warm-up: TLS handshake, CEL compile cache
        conn.request("POST", "/validate", body=bodies[i % len(bodies)], headers=headers)
        conn.getresponse().read()
    latencies: dict[str, list[float]] = {}
    answers: dict[str, int] = {}
    interval = 1.0 / rate
    start = time.perf_counter()
    i = 0
    while not stopping.is_set():
        scheduled = start + i * interval
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        current = phase[0]
        conn.request("POST", "/validate", body=bodies[i % len(bodies)], headers=headers)
        answer = json.loads(conn.getresponse().read())["response"]
        latencies.setdefault(current, []).append(time.perf_counter() - scheduled)
        label = "allowed" if answer["allowed"] else "denied"
        answers[label] = answers.get(label, 0) + 1
        i += 1
    conn.close()
    print(json.dumps({"latencies": latencies, "answers": answers}), flush=True)
    return 0


class Reviews:
    """The reviews' child process (:func:`reviews_child`): :meth:`phase` names the phase of
    the reviews that follow, :meth:`stop` ends it and keeps its figures."""

    def __init__(self, plane: ControlPlane, port: int, cafile: Path, rate: float):
        argv = [sys.executable, "-m", "bench.controllerscale", "--rate", str(rate)]
        self.child = subprocess.Popen(
            plane.network.argv([*argv, "--reviews", str(port), str(cafile)]),
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.latencies: dict[str, list[float]] = {p: [] for p in PHASES}
        self.answers: dict[str, int] = {}

    def phase(self, name: str) -> None:
        assert self.child.stdin is not None
        self.child.stdin.write(name + "\n")
        self.child.stdin.flush()

    def stop(self) -> None:
        out, _ = self.child.communicate("stop\n", timeout=120)
        if self.child.returncode != 0 or not out.strip():
            raise StepFailed(f"the webhook reviews' process ended with {self.child.returncode}")
        figures = json.loads(out.strip().splitlines()[-1])
        self.latencies.update(figures["latencies"])
        self.answers = figures["answers"]


def start_webhook(plane: ControlPlane, work: Path, cpu: int) -> tuple[Any, subprocess.Popen[str]]:
    """The webhook server in its own process inside the namespace; returns the CA that trusts
    its certificate and the process (its first output line is its port)."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    crt, key = work / "webhook.crt", work / "webhook.key"
    cert.cert_chain_pems[0].write_to_path(str(crt))
    cert.private_key_pem.write_to_path(str(key))
    argv = [sys.executable, str(REPO_ROOT / "bench" / "webhook.py"), "--cpu", str(cpu)]
    child = subprocess.Popen(
        plane.network.argv([*argv, "--serve", str(crt), str(key)]),
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return ca, child


def percentiles(values: list[float]) -> dict[str, float]:
    """n, p50, p99 and max of ``values`` (s), in ms (nearest rank)."""
    ordered = sorted(values)
    if len(ordered) < 2:
        return {"n": len(ordered)}

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3

    return {
        "n": len(ordered),
        "p50_ms": rank(0.50),
        "p99_ms": rank(0.99),
        "max_ms": ordered[-1] * 1e3,
    }


# --- the objects -----------------------------------------------------------------------------


def load(plane: ControlPlane, nodes: int, claims: int) -> dict[str, float]:
    """Create the slices, the pods and the allocated claims; returns each kind's seconds."""
    took: dict[str, float] = {}
    render = sharegpu_slices(CONSUMABLE)
    base = "/apis/resource.k8s.io/v1"
    start = time.monotonic()
    calls = [
        ("POST", f"{base}/resourceslices", s) for n in range(nodes) for s in render(node_name(n))
    ]
    parallel(plane, calls, "create the slices")
    took["slices_s"] = time.monotonic() - start
    print(f"  {len(calls):,} slices in {took['slices_s']:.0f} s", flush=True)
    start = time.monotonic()
    pods = [make_pod(i) for i in range(claims)]
    for p in pods:
        p["metadata"].pop("uid")
    calls = [("POST", f"/api/v1/namespaces/{p['metadata']['namespace']}/pods", p) for p in pods]
    parallel(plane, calls, "create the pods")
    took["pods_s"] = time.monotonic() - start
    print(f"  {len(pods):,} pods in {took['pods_s']:.0f} s", flush=True)
    rng = random.Random(1)
    made = [
        make_claim(i, node_name(rng.randrange(nodes)), rng.randrange(GPUS_PER_NODE), rng)
        for i in range(claims)
    ]
    start = time.monotonic()
    calls = []
    for c in made:
        body = {k: v for k, v in c.items() if k != "status"}
        body["metadata"] = {k: v for k, v in c["metadata"].items() if k != "uid"}
        calls.append(
            ("POST", f"{base}/namespaces/{c['metadata']['namespace']}/resourceclaims", body)
        )
    parallel(plane, calls, "create the claims")
    took["claims_s"] = time.monotonic() - start
    print(f"  {len(made):,} claims in {took['claims_s']:.0f} s", flush=True)
    start = time.monotonic()
    calls = [
        (
            "PATCH",
            f"{base}/namespaces/{c['metadata']['namespace']}/resourceclaims/"
            f"{c['metadata']['name']}/status",
            {"status": c["status"]},
        )
        for c in made
    ]
    parallel(plane, calls, "allocate the claims")
    took["allocations_s"] = time.monotonic() - start
    return took


def check_gpus(plane: ControlPlane, args: argparse.Namespace) -> tuple[int, int]:
    """The GPU objects and the allocations their status lists (listed in pages of 500); fails
    unless there is one object per GPU and one allocation per claim."""
    gpus = allocations = 0
    token = ""
    while True:
        path = f"{GPUS_PATH}?limit=500" + (f"&continue={token}" if token else "")
        code, answer = plane.request("GET", path)
        if code != 200:
            raise StepFailed(f"GET {path}: {code} {str(answer)[:300]}")
        for gpu in answer["items"]:
            gpus += 1
            allocations += len((gpu.get("status") or {}).get("allocations") or [])
        token = answer["metadata"].get("continue") or ""
        if not token:
            break
    if gpus != args.nodes * GPUS_PER_NODE or allocations != args.claims:
        raise StepFailed(
            f"{gpus} GPU objects listing {allocations} allocations, not "
            f"{args.nodes * GPUS_PER_NODE} listing {args.claims}"
        )
    return gpus, allocations


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid``, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- the run ---------------------------------------------------------------------------------


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with control_plane(work) as plane:
        driver.apply_crds(plane)
        for ns in range(NAMESPACES):
            plane.create_namespace(f"ns-{ns}")
        # Nothing but this bench writes: the controller manager would rewrite the claims'
        # reservations (their pods' UIDs are the bench's own).
        for process in list(plane.processes.started):
            if process.name == "kube-controller-manager":
                plane.processes.stop(process)
        ca, server = start_webhook(plane, work, args.cpu)
        try:
            assert server.stdout is not None and server.stdin is not None
            port = int(server.stdout.readline())
            cafile = work / "webhook-ca.pem"
            ca.cert_pem.write_to_path(str(cafile))
            reviews = Reviews(plane, port, cafile, args.rate)
            try:
                print(f"quiet: webhook reviews for {args.quiet_s:.0f} s", flush=True)
                time.sleep(args.quiet_s)
                reviews.phase("load")
                print(f"load: {args.nodes:,} slices, {args.claims:,} pods and claims", flush=True)
                figures["load"] = load(plane, args.nodes, args.claims)
                reviews.phase("sync")
                print("sync: the tracker starts", flush=True)
                figures["tracker"] = sync(plane, args)
            finally:
                reviews.stop()
            figures["webhook"] = {p: percentiles(v) for p, v in reviews.latencies.items()}
            figures["webhook_answers"] = reviews.answers
            figures["gpu_objects"], figures["allocations"] = check_gpus(plane, args)
            figures["rss_mib"] = {
                p.name: rss_mib(p.pid)
                for p in plane.processes.started
                if p.name in ("etcd", "kube-apiserver") and p.running()
            }
        except BaseException:
            traceback.print_exc()  # before the cleanup, which may take a while
            raise
        finally:
            # The server prints its own timings when its input ends: read them away.
            server.communicate(timeout=60)
    return figures


def sync(plane: ControlPlane, args: argparse.Namespace) -> dict[str, Any]:
    """Start the tracker's process; its figures once every GPU object is written."""
    argv = [sys.executable, "-m", "bench.controllerscale", "--tracker"]
    child = subprocess.Popen(
        plane.network.argv([*argv, str(plane.admin_kubeconfig)]),
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if not line:
            raise StepFailed(
                f"the tracker's process ended with {child.wait(30)} before its figures"
            )
        result: dict[str, Any] = json.loads(line)
        print(f"  tracker: {result}", flush=True)
        return result
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(60)


def report(figures: dict[str, Any], args: argparse.Namespace) -> None:
    t, ld = figures["tracker"], figures["load"]
    print(
        f"\nload ({args.nodes:,} slices, {args.claims:,} pods, claims and allocations): "
        + ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in ld.items())
    )
    print(
        f"tracker: informers listed everything in {t['listed_s']:.1f} s; all "
        f"{figures['gpu_objects']:,} GPU objects created and their status written (listing "
        f"{figures['allocations']:,} allocations) in "
        f"{t['written_s']:.1f} s ({t['writes']:,} writes, {t.get('cpu_s', 0):.1f} s of the tracker "
        f"process' CPU); RSS {t['rss_mib']:.0f} MiB "
        f"(peak {t['peak_rss_mib']:.0f} MiB, {t['rss_before_mib']:.0f} MiB before the tracker)"
    )
    print(
        "API server and etcd RSS: "
        + ", ".join(f"{k} {v:.0f} MiB" for k, v in figures["rss_mib"].items())
    )
    print(f"webhook reviews at {args.rate:.0f}/s, scheduled send to answer:")
    for phase, p in figures["webhook"].items():
        if p["n"] >= 2:
            print(
                f"  {phase:<6} n={p['n']:>6}  p50 {p['p50_ms']:.1f} ms  p99 {p['p99_ms']:.1f} ms  "
                f"max {p['max_ms']:.1f} ms"
            )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.tracker:
        return tracker_child(args.tracker)
    if args.reviews:
        return reviews_child(int(args.reviews[0]), args.reviews[1], args.rate)
    if args.nodes < 1 or args.claims < 1 or args.rate <= 0 or args.quiet_s <= 0:
        raise SystemExit("--nodes and --claims must be at least 1, --rate and --quiet-s above 0")
    # SIGTERM or SIGINT ends the run like Ctrl-C: the cluster is stopped by PID and its
    # namespace removed.
    interrupt_on_signals()
    work = args.work or Path(tempfile.mkdtemp(prefix="sharegpu-ctrlscale-"))
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    started = time.time()
    figures = run(args, work)
    document = {
        "bench": "controllerscale",
        "kubernetes": kubernetes_version(),
        "machine": {
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": time.time() - started,
        "args": {"nodes": args.nodes, "claims": args.claims, "rate": args.rate, "cpu": args.cpu},
        **figures,
    }
    report(figures, args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
