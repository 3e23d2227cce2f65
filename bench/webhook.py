"""Latency of the admission webhook at a fixed rate: p50/p90/p99/max per review.

Usage: python bench/webhook.py [--rate 200] [--seconds 10] [--cpu 0]

The webhook server (the real ``WebhookServer``: HTTPS with a trustme certificate, the real
checks of ``sharegpu.admission.checks``) runs in its own process pinned to one CPU (``--cpu``). This
process sends AdmissionReviews open-loop at ``--rate`` per second over one keep-alive HTTPS
connection, cycling through a mix of claims, templates and device classes (good ones, ones
with warnings, ones denied; CEL selectors included), and records for each review the time
from its *scheduled* send time to the full answer, so any queueing behind a slow review counts.

It also prints the in-process cost of ``AdmissionHandler.review`` alone (no HTTP, no TLS).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from api.names import DEFAULT_DRIVER_NAME as DRIVER

D = f"device.attributes['{DRIVER}']"
C = f"device.capacity['{DRIVER}']"


def _claim(requests: list[dict[str, Any]], config: list[Any] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if config:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "bench", "namespace": "default"},
        "spec": {"devices": devices},
    }


def _req(name: str, capacity: dict[str, str] | None, selectors: list[str]) -> dict[str, Any]:
    ex: dict[str, Any] = {"deviceClassName": DRIVER}
    if capacity:
        ex["capacity"] = {"requests": capacity}
    if selectors:
        ex["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": ex}


def _config(strategy: str) -> list[Any]:
    return [
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "resource.sharegpu.dev/v1alpha1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": strategy},
                },
            }
        }
    ]


def objects() -> list[dict[str, Any]]:
    """The review mix: allowed, warned and denied objects of the three kinds."""
    return [
        _claim([_req("gpu", {"cores": "30", "memory": "10Gi"}, [])], _config("MPS")),
        _claim(
            [
                _req(
                    "gpu",
                    {"cores": "50", "memory": "1000Mi"},
                    [
                        f"{D}.productName.startsWith('NVIDIA')",
                        f"{C}.memory.compareTo(quantity('40Gi')) >= 0",
                    ],
                )
            ]
        ),
        _claim([_req("a", None, [f"{D}.productname == 'x'"]), _req("b", {"memory": "4Gi"}, [])]),
        _claim([_req("gpu", {"cores": "150"}, [])], _config("Mps")),
        {
            "apiVersion": "resource.k8s.io/v1beta2",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "bench", "namespace": "default"},
            "spec": {"spec": _claim([_req("gpu", {"cores": "10", "memory": "2Gi"}, [])])["spec"]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {
                "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}],
                "config": _config("TimeSlicing"),
            },
        },
    ]


def review(obj: dict[str, Any]) -> dict[str, Any]:
    group, version = obj["apiVersion"].split("/")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": obj["kind"]},
            "operation": "CREATE",
            "namespace": obj["metadata"].get("namespace"),
            "object": obj,
        },
    }


def serve(cert: str, key: str, cpu: int) -> None:
    """Child process: pin to ``cpu``, serve, print the port, run until stdin closes."""
    from controller.webhook import AdmissionHandler, CertificateReloader, WebhookServer

    os.sched_setaffinity(0, {cpu})
    server = WebhookServer("127.0.0.1:0", AdmissionHandler(DRIVER), CertificateReloader(cert, key))
    handler_class: Any = server.RequestHandlerClass
    plain_post = handler_class.do_POST
    handled: list[float] = []

    def timed_post(self: Any) -> None:
        # from the parsed request headers to the flushed answer: body read, JSON, checks, write
        start = time.perf_counter()
        plain_post(self)
        handled.append(time.perf_counter() - start)

    handler_class.do_POST = timed_post
    server.start()
    print(server.port, flush=True)
    sys.stdin.readline()
    print(json.dumps(handled[50:]), flush=True)  # without the warm-up
    sys.stdin.read()
    server.stop()


def percentiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=100, method="inclusive")
    return (
        f"p50 {q[49] * 1e3:.2f} ms  p90 {q[89] * 1e3:.2f} ms  p99 {q[98] * 1e3:.2f} ms  "
        f"max {max(values) * 1e3:.2f} ms"
    )


def in_process(n: int) -> list[float]:
    from controller.webhook import AdmissionHandler

    handler = AdmissionHandler(DRIVER)
    bodies = [review(o) for o in objects()]
    times = []
    for i in range(n):
        start = time.perf_counter()
        handler.review(bodies[i % len(bodies)])
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="reviews per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--cpu", type=int, default=0, help="CPU the server is pinned to")
    parser.add_argument("--serve", nargs=2, metavar=("CERT", "KEY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], args.serve[1], args.cpu)
        return

    import trustme

    tmp = Path(tempfile.mkdtemp(prefix="sharegpu-bench-"))
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    cert.cert_chain_pems[0].write_to_path(str(tmp / "tls.crt"))
    cert.private_key_pem.write_to_path(str(tmp / "tls.key"))
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--cpu",
            str(args.cpu),
            "--serve",
            *(str(tmp / f) for f in ("tls.crt", "tls.key")),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        context = ssl.create_default_context()
        ca.configure_trust(context)
        conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=30)
        bodies = [json.dumps(review(o)).encode() for o in objects()]
        headers = {"Content-Type": "application/json"}
        for i in range(50):  # warm-up: TLS handshake, CEL compile cache
            conn.request("POST", "/validate", body=bodies[i % len(bodies)], headers=headers)
            conn.getresponse().read()
        total = int(args.rate * args.seconds)
        interval = 1.0 / args.rate
        latencies: list[float] = []
        results: dict[str, int] = {}
        start = time.perf_counter()
        for i in range(total):
            scheduled = start + i * interval
            delay = scheduled - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            conn.request("POST", "/validate", body=bodies[i % len(bodies)], headers=headers)
            answer = json.loads(conn.getresponse().read())["response"]
            latencies.append(time.perf_counter() - scheduled)
            label = "allowed" if answer["allowed"] else "denied"
            label += "+warnings" if answer.get("warnings") else ""
            results[label] = results.get(label, 0) + 1
        elapsed = time.perf_counter() - start
        conn.close()
        assert child.stdin is not None
        child.stdin.write("report\n")
        child.stdin.flush()
        handled = json.loads(child.stdout.readline())
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(30)
    print(
        f"HTTPS, server pinned to CPU {args.cpu}: {total} reviews in {elapsed:.1f} s "
        f"({total / elapsed:.0f}/s offered {args.rate:.0f}/s), {results}"
    )
    print(f"  per review, client (scheduled send to answer): {percentiles(latencies)}")
    print(f"  per review, server (request to flushed answer): {percentiles(handled)}")
    print(f"  in-process AdmissionHandler.review only:        {percentiles(in_process(5000))}")


if __name__ == "__main__":
    main()
