"""Latency of NodePrepareResources through the real unix socket, against the in-process API server.

Measures, for claims with one device each (a consumable-capacity share):

- the plugin: ``PluginServer`` + ``DeviceState`` (GET the claim, checkpoint PrepareStarted
  (durable), write the CDI spec (atomic, not durable: the start rewrites it from the
  checkpoint), checkpoint PrepareCompleted (durable));
- a floor: a minimal gRPC server on the same kind of socket that only GETs the claim and writes
  one fsynced file (temporary file, fsync, rename, directory fsync);

each server in its own process (as on a node). Prints p50/p99 of both and their ratios, the wall
time of 32 concurrent prepares of distinct claims (one claim per call, as kubelet sends them for
32 pods), and the wall time of preparing 128 claims (8 GPUs x 16 shares, one call each, all
released at once) on a node that holds nothing prepared. Then the ratios the targets are stated
in, plugin over floor: single-claim p99 (target <= 1.2), 32 concurrent (<= 1.25), 128 from cold
(<= 1.3). Calls to the two servers alternate, so both see the same noise from the rest of the
machine. Every claim is unprepared after it is measured, so the node state stays small.

Run: ``python bench/prepare.py [--iterations 300] [--rounds 15] [--cold-rounds 5]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import kubernetes.config
from benchchild import bench_child
from benchclaims import allocated_claim

from api import names
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.table import node_devices
from kubeletplugin.fsutil import atomic_write
from kubeletplugin.kubelet.grpcapi.gen import dra_v1_pb2, dra_v1_pb2_grpc
from kubeletplugin.kubelet.server import PluginServer
from kubeletplugin.prepare.cdi import CdiSpecWriter
from kubeletplugin.prepare.checkpoint import Checkpoint
from kubeletplugin.prepare.claims import KubeClaimGetter
from kubeletplugin.prepare.state import DeviceState
from sharegpuctl.local.apiserver import KubeAPIServer

DRIVER = names.DEFAULT_DRIVER_NAME
NODE = "bench-node"
GI = 1024**3


#: The targets, plugin over floor, of the three figures the bench compares.
TARGET_SINGLE_P99 = 1.2
TARGET_CONCURRENT = 1.25
TARGET_COLD = 1.3
#: The concurrent and the cold load.
CONCURRENT_CLAIMS = 32
COLD_GPUS = 8
COLD_SHARES_PER_GPU = 16


def make_claim(i: int, *, gpu: int | None = None, cores: int = 10) -> dict[str, Any]:
    """A claim allocated as kube-scheduler writes it: one 2Gi share on one GPU (``gpu-<i % 8>``
    unless ``gpu`` names the index)."""
    device = f"gpu-{i % 8 if gpu is None else gpu}"
    return allocated_claim(f"bench-{i}", DRIVER, NODE, device, cores, 2 * GI)


class FloorServicer(dra_v1_pb2_grpc.DRAPluginServicer):  # type: ignore[misc]
    """The least a prepare can do: GET the claim, write one fsynced file, answer."""

    def __init__(self, client: kubernetes.client.ApiClient, out_dir: Path) -> None:
        self._api = kubernetes.client.ResourceV1Api(client)
        self._dir = out_dir

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = dra_v1_pb2.NodePrepareResourcesResponse()
        for c in request.claims:
            # Unparsed: the HTTP response, whose ``data`` is the body.
            unparsed: Any = self._api.read_namespaced_resource_claim(
                c.name, c.namespace, _preload_content=False
            )
            raw = unparsed.data
            claim = json.loads(raw)
            atomic_write(self._dir / f"{c.uid}.json", json.dumps(claim["status"]).encode())
            entry = response.claims[c.uid]
            entry.devices.add(
                request_names=["gpu"], pool_name=NODE, device_name="gpu-0", cdi_device_ids=["x"]
            )
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = dra_v1_pb2.NodeUnprepareResourcesResponse()
        for c in request.claims:
            (self._dir / f"{c.uid}.json").unlink(missing_ok=True)
            response.claims[c.uid].error = ""
        return response


def _call(stub: Any, method: str, claims: list[dict[str, Any]]) -> Any:
    req_type = (
        dra_v1_pb2.NodePrepareResourcesRequest
        if method == "NodePrepareResources"
        else dra_v1_pb2.NodeUnprepareResourcesRequest
    )
    request = req_type(
        claims=[
            dra_v1_pb2.Claim(
                namespace=c["metadata"]["namespace"],
                name=c["metadata"]["name"],
                uid=c["metadata"]["uid"],
            )
            for c in claims
        ]
    )
    response = getattr(stub, method)(request, timeout=45)
    for uid, entry in response.claims.items():
        if entry.error:
            raise RuntimeError(f"{method} {uid}: {entry.error}")
    return response


class Target:
    """One server under test, reached through its unix socket."""

    def __init__(self, socket: str) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        self.stub = dra_v1_pb2_grpc.DRAPluginStub(self.channel)
        self.latencies: list[float] = []
        self.concurrent_walls: list[float] = []
        self.cold_walls: list[float] = []

    def prepare_once(self, c: dict[str, Any]) -> float:
        start = time.perf_counter()
        _call(self.stub, "NodePrepareResources", [c])
        elapsed = time.perf_counter() - start
        _call(self.stub, "NodeUnprepareResources", [c])
        return elapsed

    def prepare_concurrently(self, claims: list[dict[str, Any]]) -> float:
        """Wall time from the release of all callers until the last prepare returned."""
        barrier = threading.Barrier(len(claims) + 1)

        def one(c: dict[str, Any]) -> None:
            barrier.wait()
            _call(self.stub, "NodePrepareResources", [c])

        with ThreadPoolExecutor(len(claims)) as pool:  # one caller per claim, as kubelet
            futures = [pool.submit(one, c) for c in claims]
            barrier.wait()
            start = time.perf_counter()
            for f in futures:
                f.result()
            wall = time.perf_counter() - start
        _call(self.stub, "NodeUnprepareResources", claims)
        return wall


def measure(
    targets: dict[str, Target],
    apiserver: KubeAPIServer,
    iterations: int,
    rounds: int,
    cold_rounds: int,
) -> None:
    """Alternate the targets call by call, so both see the same machine noise."""
    n = 0

    def fresh(gpu: int | None = None, cores: int = 10) -> dict[str, Any]:
        nonlocal n
        n += 1
        c = make_claim(n, gpu=gpu, cores=cores)
        apiserver.store.put("resourceclaims", c)
        return c

    def cold_load() -> list[dict[str, Any]]:
        """8 GPUs x 16 shares of 6 cores: every GPU ends up 96% granted."""
        return [
            fresh(gpu=g, cores=100 // COLD_SHARES_PER_GPU)
            for _ in range(COLD_SHARES_PER_GPU)
            for g in range(COLD_GPUS)
        ]

    warmup = 20
    for i in range(warmup + iterations):
        for target in targets.values():
            elapsed = target.prepare_once(fresh())
            if i >= warmup:
                target.latencies.append(elapsed)
    for _ in range(rounds):
        for target in targets.values():
            target.concurrent_walls.append(
                target.prepare_concurrently([fresh() for _ in range(CONCURRENT_CLAIMS)])
            )
    for _ in range(cold_rounds):
        for target in targets.values():
            target.cold_walls.append(target.prepare_concurrently(cold_load()))


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _kube_client(kubeconfig: Path) -> kubernetes.client.ApiClient:
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    return kubernetes.client.ApiClient(configuration)


def serve(kind: str, root: Path, cdi_dir: Path, kubeconfig: Path) -> None:
    """Child-process mode: run one server, print its socket path, serve until stdin closes."""
    client = _kube_client(kubeconfig)
    stop: Callable[[], None]
    if kind == "plugin":
        state = DeviceState(
            driver_name=DRIVER,
            node_name=NODE,
            devices=node_devices(MockBackend(NODE, 8).discover(), names.SHARING_MODE_CONSUMABLE),
            claims=KubeClaimGetter(client),
            cdi=CdiSpecWriter(cdi_dir, DRIVER),
            checkpoint=Checkpoint(root / "data"),
        )
        state.start()
        plugin = PluginServer(DRIVER, root / "reg", root / "plugin", state)
        plugin.start()
        socket = str(plugin.dra_socket.path)

        def stop() -> None:
            plugin.stop(grace=1.0)
            state.close()

    else:
        out = root / "floor-files"
        out.mkdir(parents=True)
        socket = str(root / "floor.sock")
        floor = grpc.server(ThreadPoolExecutor(32))
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(FloorServicer(client, out), floor)
        floor.add_insecure_port(f"unix:{socket}")
        floor.start()

        def stop() -> None:
            floor.stop(1.0).wait()

    print(socket, flush=True)
    sys.stdin.read()
    stop()
    client.close()


@contextlib.contextmanager
def server_process(kind: str, root: Path, cdi_dir: Path, kubeconfig: Path) -> Iterator[str]:
    """Run :func:`serve` in a child process (its own interpreter, as on a node); yields the
    socket path."""
    root.mkdir(parents=True)
    args = ["--serve", kind, "--root", str(root), "--cdi-dir", str(cdi_dir)]
    with bench_child(__file__, [*args, "--kubeconfig", str(kubeconfig)]) as proc:
        assert proc.stdout is not None
        socket = proc.stdout.readline().strip()
        if not socket:
            raise RuntimeError(f"{kind} server did not start (exit code {proc.wait()})")
        yield socket


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=15, help="rounds of 32 concurrent prepares")
    parser.add_argument(
        "--cold-rounds", type=int, default=5, help="rounds of 128 prepares on an empty node"
    )
    parser.add_argument(
        "--cdi-parent",
        type=Path,
        default=Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp"),
        help="where the CDI spec dir is created (default: tmpfs /dev/shm, as /var/run/cdi is "
        "tmpfs on nodes; the checkpoint and the floor's file stay on disk under /tmp)",
    )
    parser.add_argument("--serve", choices=("plugin", "floor"), help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cdi-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.iterations, args.rounds, args.cold_rounds) < 1:
        parser.error("--iterations, --rounds and --cold-rounds must be at least 1")
    if args.serve:
        serve(args.serve, args.root, args.cdi_dir, args.kubeconfig)
        return 0
    root = Path(tempfile.mkdtemp(prefix="sgbench-", dir="/tmp"))
    cdi_dir = Path(tempfile.mkdtemp(prefix="sgbench-cdi-", dir=args.cdi_parent))
    try:
        with KubeAPIServer() as apiserver:
            kubeconfig = root / "kubeconfig"
            apiserver.write_kubeconfig(kubeconfig)
            with (
                server_process("floor", root / "floor", cdi_dir, kubeconfig) as floor_socket,
                server_process("plugin", root / "plugin", cdi_dir, kubeconfig) as plugin_socket,
            ):
                targets = {"floor": Target(floor_socket), "plugin": Target(plugin_socket)}
                measure(targets, apiserver, args.iterations, args.rounds, args.cold_rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(cdi_dir, ignore_errors=True)
    ms = 1000.0
    print(
        f"NodePrepareResources, 1 claim / 1 device, {args.iterations} calls each, "
        f"alternating, cpus={os.cpu_count()}, CDI dir under {args.cdi_parent}"
    )
    for name, t in targets.items():
        lat = t.latencies
        print(
            f"  {name:<7} p50 {pct(lat, 50) * ms:7.2f} ms   p99 {pct(lat, 99) * ms:7.2f} ms   "
            f"mean {statistics.fmean(lat) * ms:7.2f} ms"
        )
    plugin, floor = targets["plugin"], targets["floor"]
    ratio50 = pct(plugin.latencies, 50) / pct(floor.latencies, 50)
    ratio99 = pct(plugin.latencies, 99) / pct(floor.latencies, 99)
    print(
        f"  ratio   p50 {ratio50:.2f}x   p99 {ratio99:.2f}x   (target: p99 <= {TARGET_SINGLE_P99}x)"
    )
    wall = statistics.median(plugin.concurrent_walls)
    floor_wall = statistics.median(floor.concurrent_walls)
    print(
        f"{CONCURRENT_CLAIMS} concurrent prepares (median of {args.rounds} rounds): "
        f"plugin {wall * ms:.1f} ms ({wall / pct(plugin.latencies, 99):.1f}x its single-claim "
        f"p99), floor {floor_wall * ms:.1f} ms ({floor_wall / pct(floor.latencies, 99):.1f}x)"
    )
    cold = statistics.median(plugin.cold_walls)
    floor_cold = statistics.median(floor.cold_walls)
    print(
        f"{COLD_GPUS * COLD_SHARES_PER_GPU} claims ({COLD_GPUS} GPUs x {COLD_SHARES_PER_GPU} "
        f"shares) from cold, one call each (median of {args.cold_rounds} rounds): "
        f"plugin {cold * ms:.1f} ms, floor {floor_cold * ms:.1f} ms"
    )
    print("ratios, plugin / floor:")
    for label, ratio, target in (
        ("single-claim p99", ratio99, TARGET_SINGLE_P99),
        (f"{CONCURRENT_CLAIMS} concurrent", wall / floor_wall, TARGET_CONCURRENT),
        (f"{COLD_GPUS * COLD_SHARES_PER_GPU} from cold", cold / floor_cold, TARGET_COLD),
    ):
        verdict = "within" if ratio <= target else "over"
        print(f"  {label:<17} {ratio:5.2f}x   (target <= {target}x: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
