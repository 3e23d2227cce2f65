"""Memory footprint of the node daemon, idle and under prepare/unprepare load, against a floor.

First, unless ``--no-floor``, a *floor*: the least a Python node daemon of this design runs (a
urllib3 TLS GET of its Node the in-cluster way, the DRA and registration gRPC servers of the
generated stubs; :func:`floor_serve`), its idle RSS, then its RSS after it also imports each of
the libraries the daemon is built on besides gRPC and the HTTP client (:data:`FLOOR_LIBRARIES`).

Starts the plugin daemon (``kubeletplugin.main``, mock backend, 8 GPUs, consumable mode, health
monitoring on, ``/metrics`` served as the chart configures it) as a subprocess against the
in-process API server, registers it through the kubelet simulator, and prints:

- its idle RSS (after start-up and registration; target <= 50 MiB) and how many modules it has
  loaded, with the heavy packages among them;
- its RSS after the first claim, which carries an opaque GpuConfig (so the config models are
  loaded), and after 1,000 / 5,000 / 10,000 prepare/unprepare cycles (each cycle: one claim with
  one consumable-capacity share, prepared then unprepared through the DRA gRPC socket, as
  kubelet does). Flat means nothing grows per cycle.

Next to each RSS figure: PSS and private memory (``/proc/<pid>/smaps_rollup``; shared-library
pages that other processes also map count fully in RSS, proportionally in PSS, not in private).

The daemon connects as it does in production unless ``--auth kubeconfig`` is given:

- ``in-cluster`` (default): the service-account way, no kubeconfig. ``KUBERNETES_SERVICE_HOST``
  and ``KUBERNETES_SERVICE_PORT`` point at a TLS front (a test CA's certificate for 127.0.0.1)
  that forwards to the in-process API server, and the official in-cluster loader reads the token
  and CA from a temporary directory instead of ``/var/run/secrets/kubernetes.io/serviceaccount``
  (the wrapper sets the two file names of the lightly loaded loader module before the daemon
  starts; nothing else differs from production);
- ``kubeconfig``: a kubeconfig with a token, plain HTTP (as on a developer's machine).

The daemon runs with the environment the container image sets (the ``ENV`` instructions of
``deploy/Dockerfile``, read from that file) on top of this process's, so the bench measures the
interpreter settings production runs with.

Then, in this process, the client CPU time (``time.thread_time`` of the calling thread) of one
claim GET as prepare sends it, against the same in-process API server: through
:class:`~sharegpu.kube.rest.KubeRest` (its transport), through the official client's request
path (``param_serialize`` + ``call_api``, which KubeRest used before), and a bare urllib3
request on the same pool as the floor. The client comes from a kubeconfig with a token, as on a
node (so the official path runs the kubeconfig's token-refresh hook on every request).

The daemon runs under a small wrapper (``--serve``) that also answers ``modules`` on its standard
input with its module count; it stops when standard input closes.

Run: ``python bench/footprint.py [--cycles 1000,5000,10000] [--auth in-cluster|kubeconfig]
[--root DIR] [--gets 3000] [--no-floor]`` (``--root``: the source tree the daemon and the floor
run from, default this one; ``--cycles ''`` or ``--gets 0`` skips that part).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from benchchild import bench_child
from benchclaims import allocated_claim

ROOT: Final = Path(__file__).resolve().parent.parent
NODE: Final = "footprint-node"
GI: Final = 1024**3
#: Top-level packages whose presence in the daemon is reported.
HEAVY: Final = (
    "kubernetes",
    "grpc",
    "opentelemetry",
    "yaml",
    "jsonschema",
    "google",
    "requests",
    "pydantic",
)
AUTHS: Final = ("in-cluster", "kubeconfig")
#: Environment variable of the wrapper: the directory holding the service account's
#: ``token`` and ``ca.crt`` (in-cluster runs only; removed before the daemon starts).
SA_DIR_ENV: Final = "SHAREGPU_FOOTPRINT_SA_DIR"
#: An ``ENV`` instruction of a Dockerfile (continuation lines joined), and its ``KEY=VALUE``s.
_DOCKER_ENV: Final = re.compile(r"^ENV\s+((?:[^\n]*\\\n)*[^\n]*)", re.MULTILINE)


def image_env(dockerfile: Path) -> dict[str, str]:
    """The variables the ``ENV`` instructions of ``dockerfile`` set (``KEY=VALUE`` form, as the
    project's Dockerfile writes them), in order."""
    env: dict[str, str] = {}
    for match in _DOCKER_ENV.finditer(dockerfile.read_text()):
        for word in shlex.split(match.group(1).replace("\\\n", " ")):
            key, sep, value = word.partition("=")
            if not sep:
                raise ValueError(f"{dockerfile}: ENV {word!r} is not KEY=VALUE")
            env[key] = value
    return env


def memory_kib(pid: int) -> dict[str, int]:
    """``Rss``, ``Pss`` and ``Private`` (clean + dirty) of ``pid`` in KiB, from
    ``/proc/<pid>/smaps_rollup``."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            fields[parts[0].rstrip(":")] = int(parts[1])
    return {
        "Rss": fields["Rss"],
        "Pss": fields["Pss"],
        "Private": fields["Private_Clean"] + fields["Private_Dirty"],
    }


def memory_line(pid: int, base: int | None = None) -> tuple[int, str]:
    """RSS of ``pid`` in KiB and a line of its figures (with the RSS change from ``base``)."""
    mem = memory_kib(pid)
    rss = rss_kib(pid)
    change = "" if base is None else f" ({(rss - base) / 1024:+.1f} MiB)"
    return rss, (
        f"RSS {rss / 1024:6.1f} MiB{change}; PSS {mem['Pss'] / 1024:.1f}, "
        f"private {mem['Private'] / 1024:.1f} MiB"
    )


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (``VmRSS`` of ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def serve(argv: list[str]) -> int:
    """Child mode: run the daemon's ``main`` with ``argv``; answer ``modules`` on stdin. With
    :data:`SA_DIR_ENV` set, the in-cluster loader reads the service account from there."""
    sa_dir = os.environ.pop(SA_DIR_ENV, None)
    if sa_dir is not None:
        from sharegpu.kube.connection import official

        # The module the daemon's load_connection will use (lightly loaded, kept by official()):
        # its loader reads these two module globals when called.
        loader = official()._modules.get("kubernetes.config.incluster_config")
        vars(loader).update(
            SERVICE_TOKEN_FILENAME=os.path.join(sa_dir, "token"),
            SERVICE_CERT_FILENAME=os.path.join(sa_dir, "ca.crt"),
        )
    from kubeletplugin.main import main

    def answer() -> None:
        for line in sys.stdin:
            if line.strip() == "modules":
                names = list(sys.modules)
                heavy = {p: sum(1 for n in names if n.split(".")[0] == p) for p in HEAVY}
                print(json.dumps({"modules": len(names), "heavy": heavy}), flush=True)
        os.kill(os.getpid(), 15)  # stdin closed: stop the daemon as kubelet's SIGTERM would

    threading.Thread(target=answer, daemon=True).start()
    return main(argv)


#: The floor's steps after its start: a label and the modules it then imports. These are the
#: libraries the daemon is built on besides gRPC and the HTTP client (pydantic: the GpuConfig
#: models; the OpenTelemetry metrics SDK and its Prometheus exporter: ``/metrics``; PyYAML: CDI
#: specs, the mock backend's file and the MPS daemon's pod template).
FLOOR_LIBRARIES: Final = (
    ("pydantic (BaseModel)", ("pydantic.main",)),
    (
        "OpenTelemetry metrics + Prometheus exporter",
        ("opentelemetry.sdk.metrics", "opentelemetry.exporter.prometheus"),
    ),
    ("PyYAML", ("yaml",)),
)


@dataclass(frozen=True)
class Setup:
    """What a measured child runs against: the in-process API server (with the bench's Node),
    a temporary directory, the child's flags and environment to reach the server the ``auth``
    way (the image's environment on top of this process's), and the image's variables."""

    apiserver: Any
    tmp: Path
    auth_args: list[str]
    env: dict[str, str]
    image: dict[str, str]


@contextmanager
def apiserver_setup(root: Path, auth: str, prefix: str) -> Iterator[Setup]:
    """The API server, connection and environment a child measured from ``root`` uses; all of
    it is removed on exit."""
    from sharegpuctl.local.apiserver import KubeAPIServer

    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        with (
            KubeAPIServer() as apiserver,
            connection(auth, apiserver, tmp) as (auth_args, auth_env),
        ):
            apiserver.store.create(
                "nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
            )
            image = image_env(root / "deploy" / "Dockerfile")
            env = {**os.environ, **image, **auth_env, "PYTHONPATH": str(root)}
            for name in ("OTEL_TRACES_EXPORTER", "KUBECONFIG"):
                env.pop(name, None)
            if auth == "kubeconfig":
                for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
                    env.pop(name, None)
            yield Setup(apiserver, tmp, auth_args, env, image)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def floor_serve() -> int:
    """Child mode of the floor: the least a Python node daemon of this design runs. It GETs its
    Node over TLS the in-cluster way (the service account of :data:`SA_DIR_ENV`, the API server
    of ``KUBERNETES_SERVICE_HOST``/``PORT``) with urllib3, and serves the DRA and registration
    gRPC services (the generated stubs, the daemon's thread-pool sizes) on unix sockets in the
    current directory; then imports the modules each ``import a,b`` line on stdin names, answering
    every line with ``ok``."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    import urllib3

    from kubeletplugin.kubelet.grpcapi.gen import dra_v1_pb2_grpc, pluginregistration_v1_pb2_grpc
    from kubeletplugin.kubelet.server import REGISTRATION_WORKERS

    sa_dir = Path(os.environ.pop(SA_DIR_ENV))
    pool = urllib3.HTTPSConnectionPool(
        os.environ["KUBERNETES_SERVICE_HOST"],
        int(os.environ["KUBERNETES_SERVICE_PORT"]),
        ca_certs=str(sa_dir / "ca.crt"),
        cert_reqs="CERT_REQUIRED",
    )
    token = (sa_dir / "token").read_text()
    response = pool.request(
        "GET", f"/api/v1/nodes/{NODE}", headers={"Authorization": f"Bearer {token}"}
    )
    json.loads(response.data)
    dra = grpc.server(ThreadPoolExecutor(32))
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(dra_v1_pb2_grpc.DRAPluginServicer(), dra)
    dra.add_insecure_port("unix:dra.sock")
    reg = grpc.server(ThreadPoolExecutor(REGISTRATION_WORKERS))
    pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(
        pluginregistration_v1_pb2_grpc.RegistrationServicer(), reg
    )
    reg.add_insecure_port("unix:reg.sock")
    dra.start()
    reg.start()
    print("ok", flush=True)
    for line in sys.stdin:
        command, _, names = line.strip().partition(" ")
        if command == "import":
            for name in names.split(","):
                importlib.import_module(name)
        print("ok", flush=True)
    dra.stop(None)
    reg.stop(None)
    return 0


def floor_footprint(root: Path) -> None:
    """Print the floor's RSS (:func:`floor_serve`), idle, then with each of
    :data:`FLOOR_LIBRARIES` imported, in the image's environment, reaching the API server the
    in-cluster way as the daemon does."""
    with (
        apiserver_setup(root, "in-cluster", "sgfloor-") as setup,
        bench_child(__file__, ["--floor-serve"], setup.tmp, setup.env) as proc,
    ):
        assert proc.stdin is not None and proc.stdout is not None
        if proc.stdout.readline().strip() != "ok":
            raise RuntimeError(f"the floor did not start ({proc.poll()})")
        time.sleep(2.0)  # as the daemon's figure: let its threads settle
        base, figures = memory_line(proc.pid)
        print(
            "floor (Python, urllib3 TLS GET in-cluster, DRA + registration gRPC servers; "
            f"python {sys.version.split()[0]}):"
        )
        print(f"  idle: {figures}")
        for label, modules in FLOOR_LIBRARIES:
            proc.stdin.write(f"import {','.join(modules)}\n")
            proc.stdin.flush()
            if proc.stdout.readline().strip() != "ok":
                raise RuntimeError(f"the floor failed to import {modules}")
            _, figures = memory_line(proc.pid, base)
            print(f"  + {label}: {figures}")


def make_claim(i: int, driver: str, opaque: bool = False) -> dict[str, Any]:
    """A claim allocated as kube-scheduler writes it: one share on one GPU of the node; with
    ``opaque``, the allocation also carries a GpuConfig from the claim (MPS, 50% threads)."""
    claim = allocated_claim(f"fp-{i}", driver, NODE, f"gpu-{i % 8}", 10, GI)
    if opaque:
        from api import names

        parameters = {
            "apiVersion": names.GROUP_VERSION,
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 5}},
        }
        claim["status"]["allocation"]["devices"]["config"] = [
            {
                "source": "FromClaim",
                "requests": ["gpu"],
                "opaque": {"driver": driver, "parameters": parameters},
            }
        ]
    return claim


class TlsFront:
    """HTTPS on 127.0.0.1 (a test CA's certificate for that address) forwarding every
    connection's bytes to an HTTP server, as a cluster's API server answers in-cluster clients.
    ``ca_pem`` is the CA certificate; :meth:`close` ends every connection."""

    def __init__(self, backend_port: int) -> None:
        import trustme

        ca = trustme.CA()
        self.ca_pem = ca.cert_pem.bytes()
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(self._context)
        self._backend = ("127.0.0.1", backend_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._connect, args=(raw,), daemon=True).start()

    def _connect(self, raw: socket.socket) -> None:
        try:
            client = self._context.wrap_socket(raw, server_side=True)
            backend = socket.create_connection(self._backend)
        except OSError:
            raw.close()
            return
        with self._lock:
            self._sockets += [client, backend]
        threading.Thread(target=self._pump, args=(backend, client), daemon=True).start()
        self._pump(client, backend)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for sock in (source, sink):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()


@contextmanager
def connection(auth: str, apiserver: Any, tmp: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    """The daemon's flags and environment variables to reach ``apiserver`` the ``auth`` way
    (module docstring)."""
    if auth == "kubeconfig":
        yield ["--kubeconfig", apiserver.write_kubeconfig(tmp / "kubeconfig")], {}
        return
    front = TlsFront(apiserver.port)
    try:
        sa_dir = tmp / "serviceaccount"
        sa_dir.mkdir()
        (sa_dir / "token").write_text("sharegpu-test-token")
        (sa_dir / "ca.crt").write_bytes(front.ca_pem)
        yield (
            [],
            {
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(front.port),
                SA_DIR_ENV: str(sa_dir),
            },
        )
    finally:
        front.close()


def daemon_args(tmp: Path, auth_args: list[str]) -> list[str]:
    (tmp / "boot_id").write_text("0f2b7a52-5d7e-4c1e-9a51-2f4d8c9e6b10\n")
    (tmp / "registry").mkdir()
    return [
        "--node-name",
        NODE,
        *auth_args,
        "--device-backend",
        "mock",
        "--mock-gpus",
        "8",
        "--plugin-registry-dir",
        str(tmp / "registry"),
        "--plugin-data-dir",
        str(tmp / "data"),
        "--cdi-dir",
        str(tmp / "cdi"),
        "--mock-boot-id-file",
        str(tmp / "boot_id"),
        "--metrics-address",  # served in production (the chart always sets it)
        "127.0.0.1:0",
        "--log-level",
        "warning",
    ]


def measure(cycles: list[int], root: Path, auth: str) -> None:
    from api import names
    from kubeletplugin.kubelet.preparer import ClaimRef
    from sharegpuctl.local.kubelet import KubeletSim

    driver = names.DEFAULT_DRIVER_NAME
    with (
        apiserver_setup(root, auth, "sgfp-") as setup,
        bench_child(
            __file__, ["--serve", *daemon_args(setup.tmp, setup.auth_args)], root, setup.env
        ) as proc,
        KubeletSim(setup.tmp / "registry") as kubelet,
    ):
        apiserver = setup.apiserver

        def modules() -> str:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("modules\n")
            proc.stdin.flush()
            loaded = json.loads(proc.stdout.readline())
            heavy = ", ".join(f"{k} {v}" for k, v in loaded["heavy"].items())
            return f"{loaded['modules']} modules ({heavy})"

        deadline = time.monotonic() + 60
        while not kubelet.registration_sockets():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not start ({proc.poll()})")
            time.sleep(0.1)
        plugin = kubelet.register(driver, timeout=30)
        time.sleep(2.0)  # let start-up work (first publish, health) settle
        loaded = modules()
        idle, figures = memory_line(proc.pid)
        settings = " ".join(f"{k}={v}" for k, v in setup.image.items())
        print(
            f"plugin daemon (mock backend, 8 GPUs, {auth}), tree {root}, "
            f"python {sys.version.split()[0]}, image env: {settings or 'none'}"
        )
        print(f"  idle: {figures}, {loaded}")
        done = 0
        start = time.perf_counter()
        for target in [1, *(c for c in cycles if c > 1)]:
            while done < target:
                obj = make_claim(done, driver, opaque=done == 0)
                apiserver.store.put("resourceclaims", obj)
                meta = obj["metadata"]
                claim = ClaimRef(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])
                result = plugin.prepare([claim])[meta["uid"]]
                if result.error:
                    raise RuntimeError(f"prepare {meta['name']}: {result.error}")
                errors = plugin.unprepare([claim])
                if errors[meta["uid"]]:
                    raise RuntimeError(f"unprepare {meta['name']}: {errors}")
                apiserver.store.delete_now("resourceclaims", meta["name"], "default")
                done += 1
            rss, figures = memory_line(proc.pid, idle)
            if done == 1:
                print(f"  after the first claim (opaque GpuConfig): {figures}, {modules()}")
                first = rss
                continue
            per = (rss - first) * 1024 / (done - 1)
            print(
                f"  after {done:6d} cycles: {figures}, {per:+.0f} bytes/cycle since "
                f"the first; {(time.perf_counter() - start) / done * 1000:.2f} ms/cycle"
            )
        plugin.close()


def claim_get_cpu(gets: int) -> None:
    """Client CPU per claim GET: KubeRest (transport) vs the official client vs bare urllib3."""
    import statistics

    from api import names
    from kubeletplugin.prepare.claims import KubeClaimGetter
    from sharegpu.kube.rest import load_api_client, resource_path
    from sharegpuctl.local.apiserver import KubeAPIServer

    tmp = Path(tempfile.mkdtemp(prefix="sgget-", dir="/tmp"))
    try:
        with KubeAPIServer() as apiserver:
            obj = make_claim(1, names.DEFAULT_DRIVER_NAME)
            apiserver.store.put("resourceclaims", obj)
            api = load_api_client(apiserver.write_kubeconfig(tmp / "kubeconfig"), {})
            name = obj["metadata"]["name"]
            path = resource_path(
                names.RESOURCE_GROUP, names.RESOURCE_VERSION, "resourceclaims", "default", name
            )
            getter = KubeClaimGetter(api)

            def via_kuberest() -> None:
                getter.get_claim("default", name)

            def via_official() -> None:
                params = api.param_serialize(
                    "GET",
                    path,
                    query_params=[],
                    header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"],
                )
                response = api.call_api(*params, _request_timeout=10.0).response
                data = response.data
                response.release_conn()
                json.loads(data)

            pool = api.rest_client.pool_manager
            url = api.configuration.host + path
            configuration = api.configuration
            token = {
                "Authorization": f"{configuration.api_key_prefix.get('BearerToken', 'Bearer')} "
                f"{configuration.api_key['BearerToken']}"
            }

            def bare() -> None:
                response = pool.request("GET", url, headers=token, preload_content=False)
                data = response.data
                response.release_conn()
                json.loads(data)

            paths = {"KubeRest": via_kuberest, "official": via_official, "bare urllib3": bare}
            samples: dict[str, list[float]] = {k: [] for k in paths}
            for i in range(gets + 100):  # interleaved, so every path sees the same noise
                for label, fn in paths.items():
                    start = time.thread_time()
                    fn()
                    if i >= 100:
                        samples[label].append(time.thread_time() - start)
            api.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"claim GET, client CPU per request ({gets} each, interleaved, thread CPU time):")
    floor = statistics.fmean(samples["bare urllib3"])
    for label, values in samples.items():
        mean = statistics.fmean(values)
        print(
            f"  {label:<13} mean {mean * 1e3:6.3f} ms  median "
            f"{statistics.median(values) * 1e3:6.3f} ms  ({mean / floor:.2f}x bare)"
        )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--serve"]:
        return serve(args[1:])
    if args[:1] == ["--floor-serve"]:
        return floor_serve()
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cycles", default="1000,5000,10000", help="checkpoints, ascending")
    parser.add_argument("--root", type=Path, default=ROOT, help="source tree to measure")
    parser.add_argument(
        "--auth", choices=AUTHS, default=AUTHS[0], help="how the daemon connects (docstring)"
    )
    parser.add_argument("--gets", type=int, default=3000, help="claim GETs per client path")
    parser.add_argument(
        "--floor", action=argparse.BooleanOptionalAction, default=True, help="measure the floor"
    )
    ns = parser.parse_args(args)
    if ns.floor:
        floor_footprint(ns.root.resolve())
    if ns.cycles:
        measure([int(c) for c in ns.cycles.split(",")], ns.root.resolve(), ns.auth)
    if ns.gets:
        claim_get_cpu(ns.gets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
