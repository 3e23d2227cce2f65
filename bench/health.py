"""XID-to-taint latency of the kubelet plugin with its production publisher settings.

The design target: an unhealthy GPU is tainted in the node's ResourceSlices within 2 s. This
script builds the plugin from its flags (mock backend, 8 GPUs, a mock health file), publishes
through the in-process API server, then injects an XID 79 on a different GPU each round and
prints how long it took until (a) the health stream carried the UNHEALTHY list and (b) the
taint was stored by the API server (p50 and max, seconds).

    python bench/health.py [--mode consumable|partitions|exclusive]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from api import names
from kubeletplugin.config import parse_config
from kubeletplugin.main import build_plugin
from sharegpuctl.local.apiserver import KubeAPIServer

NODE = "bench-node"
GPUS = 8
TAINT_KEY = names.unhealthy_taint_key(names.DEFAULT_DRIVER_NAME)


def tainted_devices(server: KubeAPIServer) -> set[str]:
    slices: list[dict[str, Any]] = server.store.list("resourceslices")
    return {
        d["name"]
        for s in slices
        for d in s["spec"].get("devices", [])
        if any(t["key"] == TAINT_KEY for t in d.get("taints", []))
    }


def measure(mode: str) -> tuple[list[float], list[float]]:
    with KubeAPIServer() as server, tempfile.TemporaryDirectory() as tmp:
        server.store.create(
            "nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
        )
        health_file = Path(tmp) / "health.yaml"
        # Unix socket paths must stay short: a directory directly under /tmp.
        sockets = Path(tempfile.mkdtemp(prefix="sg-bench-", dir="/tmp"))
        boot_id = Path(tmp) / "boot_id"
        boot_id.write_text("0f2b7a52-5d7e-4c1e-9a51-2f4d8c9e6b10\n")
        config = parse_config(
            [
                "--node-name",
                NODE,
                "--kubeconfig",
                server.write_kubeconfig(Path(tmp) / "kubeconfig"),
                "--device-backend",
                "mock",
                "--mock-gpus",
                str(GPUS),
                "--mock-health-file",
                str(health_file),
                "--sharing-mode",
                mode,
                "--health-recovery-probes",
                "1000",
                "--plugin-registry-dir",
                str(sockets / "registry"),
                "--plugin-data-dir",
                str(sockets / "data"),
                "--cdi-dir",
                str(Path(tmp) / "cdi"),
                "--mock-boot-id-file",
                str(boot_id),
            ],
            environ={},
        )
        plugin = build_plugin(config)
        assert plugin.health_source is not None
        subscription = plugin.health_source.subscribe()
        stream_times: dict[int, float] = {}
        start_times: dict[int, float] = {}

        def read_stream() -> None:
            for devices in subscription:
                now = time.monotonic()
                for d in devices:
                    if d.health.name == "UNHEALTHY" and d.device_name.count("-") == 1:
                        index = int(d.device_name.split("-")[1])
                        stream_times.setdefault(index, now)

        reader = threading.Thread(target=read_stream, daemon=True)
        reader.start()
        plugin.start()
        try:
            if not plugin.publisher.wait_synced(60):
                raise SystemExit(f"{mode}: the pool was never published")
            taint_latency, stream_latency = [], []
            for index in range(GPUS):
                time.sleep(1.5)  # let the publisher's debounce interval pass
                entries = "".join(f"{i}: {{xids: [79]}}\n" for i in range(index + 1))
                tmp_file = health_file.with_suffix(".tmp")
                tmp_file.write_text(entries)
                start = time.monotonic()
                os.replace(tmp_file, health_file)
                start_times[index] = start
                name = names.device_name(index)

                def done(device: str = name) -> bool:
                    return device in tainted_devices(server)

                if not server.wait_for(done, 60, 0.005):
                    raise SystemExit(f"{mode}: GPU {index} was not tainted within 60 s")
                taint_latency.append(time.monotonic() - start)
            for index in range(GPUS):
                if index in stream_times:
                    stream_latency.append(stream_times[index] - start_times[index])
            return taint_latency, stream_latency
        finally:
            subscription.close()
            plugin.stop()
            shutil.rmtree(sockets, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=names.SHARING_MODES, action="append")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print(f"{'mode':<12} {'rounds':>6} {'stream p50':>11} {'taint p50':>10} {'taint max':>10}")
    for mode in args.mode or names.SHARING_MODES:
        taint, stream = measure(mode)
        print(
            f"{mode:<12} {len(taint):>6} {statistics.median(stream):>10.3f}s "
            f"{statistics.median(taint):>9.3f}s {max(taint):>9.3f}s"
        )


if __name__ == "__main__":
    main()
