"""Throughput of the in-process API server through the official kubernetes client.

Creates ``--objects`` GPU custom objects (one client thread per ``--writers``) while a watch
streams every event, then patches their status, lists them, and creates ``--slices``
ResourceSlices of 64 devices each (schema plus slice-rule validation). Prints objects per second
for each phase.

    python bench/apiserver.py [--objects 28000] [--writers 4] [--slices 200]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

from kubernetes import client, watch

from api import names
from sharegpuctl.local.apiserver import KubeAPIServer

GPU_ARGS = (names.API_GROUP, names.API_VERSION, names.GPU_PLURAL)


def gpu_name(i: int) -> str:
    return names.gpu_object_name(f"node-{i // 8}", i % 8)


def slice_body(i: int) -> dict[str, Any]:
    return {
        "apiVersion": names.RESOURCE_GROUP_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"node-{i}-slice"},
        "spec": {
            "driver": names.DEFAULT_DRIVER_NAME,
            "pool": {"name": f"node-{i}", "generation": 0, "resourceSliceCount": 1},
            "nodeName": f"node-{i}",
            "devices": [
                {
                    "name": f"gpu-{d}",
                    "attributes": {
                        "uuid": {"string": f"GPU-{i}-{d}"},
                        "index": {"int": d},
                        "driverVersion": {"version": "570.86.15"},
                    },
                    "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}},
                }
                for d in range(64)
            ],
        },
    }


def run(objects: int, writers: int, slices: int) -> None:
    with KubeAPIServer() as server:
        seen = threading.Event()
        count = [0]

        def consume() -> None:
            with server.client() as api:
                custom = client.CustomObjectsApi(api)
                w = watch.Watch()
                for _ in w.stream(
                    custom.list_cluster_custom_object, *GPU_ARGS, timeout_seconds=600
                ):
                    count[0] += 1
                    if count[0] == objects:
                        seen.set()
                        w.stop()

        def write(k: int) -> None:
            with server.client() as api:
                custom = client.CustomObjectsApi(api)
                for i in range(k, objects, writers):
                    custom.create_cluster_custom_object(
                        *GPU_ARGS, {"metadata": {"name": gpu_name(i)}, "spec": {"index": i % 8}}
                    )

        consumer = threading.Thread(target=consume)
        consumer.start()
        server.wait_for(lambda: server.open_watches() == 1)
        start = time.perf_counter()
        threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        created = time.perf_counter()
        seen.wait(600)
        watched = time.perf_counter()
        consumer.join()
        print(
            f"create {objects} GPU objects ({writers} writers): {objects / (created - start):.0f}/s"
        )
        print(f"  watch saw all of them {watched - created:.2f} s after the last create")

        with server.client() as api:
            custom = client.CustomObjectsApi(api)
            start = time.perf_counter()
            for i in range(objects // 10):
                custom.patch_cluster_custom_object_status(
                    *GPU_ARGS, gpu_name(i), {"status": {"allocated": i}}
                )
            patched = time.perf_counter()
            items = custom.list_cluster_custom_object(*GPU_ARGS)["items"]
            listed = time.perf_counter()
            print(f"status patch {objects // 10}: {(objects // 10) / (patched - start):.0f}/s")
            print(f"list {len(items)} objects: {listed - patched:.2f} s")

            start = time.perf_counter()
            for i in range(slices):
                resp = api.call_api(
                    "POST",
                    f"{server.url}/apis/resource.k8s.io/v1/resourceslices",
                    header_params={"Content-Type": "application/json"},
                    body=slice_body(i),
                )
                resp.read()
                if resp.status != 201:
                    raise SystemExit(f"slice {i}: HTTP {resp.status}: {json.loads(resp.data)}")
            done = time.perf_counter()
            print(f"create {slices} ResourceSlices of 64 devices: {slices / (done - start):.0f}/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--objects", type=int, default=28000)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--slices", type=int, default=200)
    args = parser.parse_args()
    run(args.objects, args.writers, args.slices)


if __name__ == "__main__":
    main()
