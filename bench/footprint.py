"""Memory footprint of the node daemon, idle and under prepare/unprepare load.

Starts the plugin daemon (``kubeletplugin.main``, mock backend, 8 GPUs, consumable mode, health
monitoring on) as a subprocess against the in-process API server, registers it through the
kubelet simulator, and prints:

- its idle RSS (after start-up and registration; target <= 50 MiB) and how many modules it has
  loaded, with the heavy packages among them;
- its RSS after 1,000 / 5,000 / 10,000 prepare/unprepare cycles (each cycle: one claim with one
  consumable-capacity share, prepared then unprepared through the DRA gRPC socket, as kubelet
  does). Flat means nothing grows per cycle.

Then, in this process, the client CPU time (``time.thread_time`` of the calling thread) of one
claim GET as prepare sends it, against the same in-process API server: through
:class:`~sharegpu.kube.rest.KubeRest` (its transport), through the official client's request
path (``param_serialize`` + ``call_api``, which KubeRest used before), and a bare urllib3
request on the same pool as the floor. The client comes from a kubeconfig with a token, as on a
node (so the official path runs the kubeconfig's token-refresh hook on every request).

The daemon runs under a small wrapper (``--serve``) that also answers ``modules`` on its standard
input with its module count; it stops when standard input closes.

Run: ``python bench/footprint.py [--cycles 1000,5000,10000] [--root DIR] [--gets 3000]``
(``--root``: the source tree the daemon runs from, default this one; ``--cycles ''`` or
``--gets 0`` skips that part).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

from benchclaims import allocated_claim

ROOT: Final = Path(__file__).resolve().parent.parent
NODE: Final = "footprint-node"
GI: Final = 1024**3
#: Top-level packages whose presence in the daemon is reported.
HEAVY: Final = ("kubernetes", "grpc", "opentelemetry", "yaml", "jsonschema", "google", "requests")


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (``VmRSS`` of ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def serve(argv: list[str]) -> int:
    """Child mode: run the daemon's ``main`` with ``argv``; answer ``modules`` on stdin."""
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


def make_claim(i: int, driver: str) -> dict[str, Any]:
    """A claim allocated as kube-scheduler writes it: one share on one GPU of the node."""
    return allocated_claim(f"fp-{i}", driver, NODE, f"gpu-{i % 8}", 10, GI)


def daemon_args(tmp: Path, kubeconfig: str) -> list[str]:
    (tmp / "boot_id").write_text("0f2b7a52-5d7e-4c1e-9a51-2f4d8c9e6b10\n")
    (tmp / "registry").mkdir()
    return [
        "--node-name",
        NODE,
        "--kubeconfig",
        kubeconfig,
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
        "--boot-id-file",
        str(tmp / "boot_id"),
        "--log-level",
        "warning",
    ]


def measure(cycles: list[int], root: Path) -> None:
    from api import names
    from kubeletplugin.kubelet.preparer import ClaimRef
    from sharegpu.local.apiserver import KubeAPIServer
    from sharegpu.local.kubelet import KubeletSim

    driver = names.DEFAULT_DRIVER_NAME
    tmp = Path(tempfile.mkdtemp(prefix="sgfp-", dir="/tmp"))
    try:
        with KubeAPIServer() as apiserver:
            apiserver.store.create(
                "nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
            )
            kubeconfig = apiserver.write_kubeconfig(tmp / "kubeconfig")
            env = {**os.environ, "PYTHONPATH": str(root)}
            env.pop("OTEL_TRACES_EXPORTER", None)
            proc = subprocess.Popen(
                [sys.executable, __file__, "--serve", *daemon_args(tmp, kubeconfig)],
                cwd=root,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdin is not None and proc.stdout is not None
            try:
                with KubeletSim(tmp / "registry") as kubelet:
                    deadline = time.monotonic() + 60
                    while not kubelet.registration_sockets():
                        if proc.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"the daemon did not start ({proc.poll()})")
                        time.sleep(0.1)
                    plugin = kubelet.register(driver, timeout=30)
                    time.sleep(2.0)  # let start-up work (first publish, health) settle
                    proc.stdin.write("modules\n")
                    proc.stdin.flush()
                    loaded = json.loads(proc.stdout.readline())
                    idle = rss_kib(proc.pid)
                    print(
                        f"plugin daemon (mock backend, 8 GPUs), tree {root}, "
                        f"python {sys.version.split()[0]}"
                    )
                    print(
                        f"  idle: RSS {idle / 1024:6.1f} MiB, {loaded['modules']} modules "
                        f"({', '.join(f'{k} {v}' for k, v in loaded['heavy'].items())})"
                    )
                    done = 0
                    start = time.perf_counter()
                    for target in cycles:
                        while done < target:
                            obj = make_claim(done, driver)
                            apiserver.store.put("resourceclaims", obj)
                            meta = obj["metadata"]
                            claim = ClaimRef(
                                namespace=meta["namespace"], uid=meta["uid"], name=meta["name"]
                            )
                            result = plugin.prepare([claim])[meta["uid"]]
                            if result.error:
                                raise RuntimeError(f"prepare {meta['name']}: {result.error}")
                            errors = plugin.unprepare([claim])
                            if errors[meta["uid"]]:
                                raise RuntimeError(f"unprepare {meta['name']}: {errors}")
                            apiserver.store.delete_now("resourceclaims", meta["name"], "default")
                            done += 1
                        rss = rss_kib(proc.pid)
                        per = (rss - idle) * 1024 / done
                        print(
                            f"  after {done:6d} cycles: RSS {rss / 1024:6.1f} MiB "
                            f"({(rss - idle) / 1024:+.1f} MiB, {per:+.0f} bytes/cycle; "
                            f"{(time.perf_counter() - start) / done * 1000:.2f} ms/cycle)"
                        )
                    plugin.close()
            finally:
                proc.stdin.close()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def claim_get_cpu(gets: int) -> None:
    """Client CPU per claim GET: KubeRest (transport) vs the official client vs bare urllib3."""
    import statistics

    from api import names
    from kubeletplugin.prepare.claims import KubeClaimGetter
    from sharegpu.kube.rest import load_api_client, resource_path
    from sharegpu.local.apiserver import KubeAPIServer

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
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cycles", default="1000,5000,10000", help="checkpoints, ascending")
    parser.add_argument("--root", type=Path, default=ROOT, help="source tree to measure")
    parser.add_argument("--gets", type=int, default=3000, help="claim GETs per client path")
    ns = parser.parse_args(args)
    if ns.cycles:
        measure([int(c) for c in ns.cycles.split(",")], ns.root.resolve())
    if ns.gets:
        claim_get_cpu(ns.gets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
