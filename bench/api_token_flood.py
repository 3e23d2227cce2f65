"""Random bearer tokens flood the JSON API from four addresses: what happens to a legitimate
client whose tokens are not cached yet.

Usage: python bench/api_token_flood.py [--flooders 48] [--requests 40] [--review-ms 200]
       [--code DIR]

Three processes on loopback:

- the JSON API (``serve_api`` with the real ``KubeAuthorizer`` at its defaults; ``--code DIR``
  imports the controller from another checkout, to measure an older version) in front of the
  embedded API server, whose TokenReviews take ``--review-ms`` each (an API server under load);
- the flood: ``--flooders`` clients from 127.0.0.2-5 sending random tokens without pause;
- this process, from 127.0.0.9 after the flood has run 2 s: ``--requests`` requests, one at a
  time, each with a valid token never used before (so each needs a TokenReview).

It prints how the legitimate requests were answered (codes) and their p50/p99/max latency.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEGIT = "127.0.0.9"


class Empty:
    """No GPUs, always ready (bound methods: served alike by every version)."""

    def gpus(self, node: str | None) -> list[dict[str, object]]:
        return []

    def ready(self) -> bool:
        return True


def serve(requests: int, review_ms: float) -> None:
    """The API server and the JSON API (child process): prints the port, serves until stdin
    closes."""
    from controller.apiauth import KubeAuthorizer
    from controller.httpapi import serve_api
    from sharegpu.kube.rest import KubeRest
    from sharegpuctl.local.apiserver import KubeAPIServer

    with KubeAPIServer() as apiserver:
        for i in range(requests):
            apiserver.reviews.add_token(f"good-{i}", "alice", audiences=("sharegpu.dev",))
        apiserver.reviews.allow("alice", "list", "resource.sharegpu.dev", "gpus")
        apiserver.inject_fault(
            "create", "tokenreviews", action="delay", delay_s=review_ms / 1000, times=None
        )
        client = apiserver.client()
        auth = KubeAuthorizer(KubeRest(client))
        api = serve_api("127.0.0.1:0", Empty().gpus, Empty().ready, authorizer=auth)
        print(api.port, flush=True)
        sys.stdin.read()
        api.stop()
        client.close()


def get(port: int, token: str, source: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request("GET", "/api/v1/gpus", headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def flood(port: int, flooders: int, seconds: float) -> None:
    """The attacker (child process): prints the codes its requests got as JSON at the end."""
    stop = time.monotonic() + seconds
    codes: Counter[str] = Counter()
    lock = threading.Lock()

    def flooder(source: str) -> None:
        while time.monotonic() < stop:
            try:
                code = str(get(port, secrets.token_hex(16), source))
            except (OSError, http.client.HTTPException):
                code = "failed"
            with lock:
                codes[code] += 1

    threads = [
        threading.Thread(target=flooder, args=(f"127.0.0.{2 + i % 4}",), daemon=True)
        for i in range(flooders)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(dict(codes)), flush=True)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flooders", type=int, default=48)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--review-ms", type=float, default=200.0)
    parser.add_argument("--code", default=str(ROOT), help="checkout whose controller is served")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--flood", nargs=2, metavar=("PORT", "S"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.requests, args.review_ms)
        return
    if args.flood:
        flood(int(args.flood[0]), args.flooders, float(args.flood[1]))
        return
    env = {**os.environ, "PYTHONPATH": f"{args.code}{os.pathsep}{ROOT}"}
    server = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            "--requests",
            str(args.requests),
            "--review-ms",
            str(args.review_ms),
        ],
        cwd=args.code,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # a warning per failed review
        text=True,
    )
    assert server.stdout is not None
    port = int(server.stdout.readline())
    flood_s = 2.0 + args.requests * (2 + args.review_ms / 1000)
    attacker = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--flooders",
            str(args.flooders),
            "--flood",
            str(port),
            str(flood_s),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)
    codes: Counter[str] = Counter()
    took: list[float] = []
    for i in range(args.requests):
        start = time.monotonic()
        try:
            code = str(get(port, f"good-{i}", LEGIT))
        except (OSError, http.client.HTTPException):
            code = "failed"
        codes[code] += 1
        if code == "200":
            took.append(time.monotonic() - start)
    attacker.terminate()
    attacker.communicate()
    server.communicate("")
    print(f"code: {args.code}")
    print(
        f"flood: {args.flooders} clients from 4 addresses, random tokens; "
        f"TokenReviews take {args.review_ms:g} ms"
    )
    print(f"legitimate client ({args.requests} requests, each a new valid token): {dict(codes)}")
    if took:
        print(
            f"answered 200: p50 {percentile(took, 50) * 1000:.0f} ms, "
            f"p99 {percentile(took, 99) * 1000:.0f} ms, max {max(took) * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
