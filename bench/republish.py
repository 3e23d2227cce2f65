"""Wipe-to-republish latency of the slice publisher with its production settings.

Kubelet deletes a node's ResourceSlices when it starts and 30 s after a driver disconnects; the
plugin must have them back within 5 s. This script starts the in-process API server, publishes
8 mock GPUs per sharing mode, deletes every slice ``--rounds`` times and prints how long the
complete pool took to come back (p50 and max, seconds).

    python bench/republish.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from api import names
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.table import node_devices
from kubeletplugin.publish.publisher import SlicePublisher
from sharegpu.kube.rest import KubeRest
from sharegpuctl.local.apiserver import KubeAPIServer

NODE = "bench-node"


def pool_complete(server: KubeAPIServer, expected: int) -> bool:
    slices: list[dict[str, Any]] = server.store.list("resourceslices")
    return len(slices) == expected and {
        s["spec"]["pool"]["resourceSliceCount"] for s in slices
    } == {expected}


def measure(mode: str, rounds: int) -> list[float]:
    with KubeAPIServer() as server:
        server.store.create(
            "nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
        )
        client = server.client()
        publisher = SlicePublisher(
            KubeRest(client),
            names.DEFAULT_DRIVER_NAME,
            NODE,
            node_devices(MockBackend(NODE).discover(), mode),
        )
        publisher.start()
        try:
            if not publisher.wait_synced(60):
                raise SystemExit(f"{mode}: the pool was never published")
            expected = server.store.count("resourceslices")
            times = []
            for _ in range(rounds):
                time.sleep(1.5)  # let the debounce interval pass, as between real wipes
                for s in server.store.list("resourceslices"):
                    server.store.delete_now("resourceslices", s["metadata"]["name"])
                start = time.monotonic()
                if not server.wait_for(lambda: pool_complete(server, expected), 60, 0.005):
                    raise SystemExit(f"{mode}: the pool did not come back within 60 s")
                times.append(time.monotonic() - start)
            return times
        finally:
            publisher.stop()
            client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    print(f"{'mode':<12} {'rounds':>6} {'p50 s':>8} {'max s':>8}")
    for mode in names.SHARING_MODES:
        times = measure(mode, args.rounds)
        print(f"{mode:<12} {len(times):>6} {statistics.median(times):>8.3f} {max(times):>8.3f}")


if __name__ == "__main__":
    main()
