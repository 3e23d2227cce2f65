"""A tenant floods the admission webhook with heavy selectors through the API server's identity:
latency of other tenants' plain reviews meanwhile, and how many went unanswered.

Usage: python bench/webhook_flood.py [--attackers 40] [--legit 16] [--rounds 10]
       [--timeout 5] [--code DIR]

Three processes on loopback:

- the real ``WebhookServer`` (``--code DIR``: import the controller from another checkout, to
  measure an older version with the same load), with default limits, a serving certificate and
  a client CA generated here (trustme), so connections presenting the "API server" client
  certificate are verified at the handshake exactly as in a cluster;
- the flood: ``--attackers`` keep-alive connections, all with the API server's client
  certificate (every review of a cluster comes from the API server), each sending without pause
  ResourceClaim reviews of ``userInfo.username: tenant-a`` carrying 2 selectors of 8 KiB never
  sent before (so each needs a compile), as a tenant creating claims concurrently makes the API
  server do;
- this process: after the flood has run 2 s, ``--rounds`` rounds of ``--legit`` concurrent
  1-GPU claim reviews of ``tenant-b``, each on a new connection with the same client
  certificate, each given ``--timeout`` seconds (the chart's webhook ``timeoutSeconds``).

It prints p50/p99/max of the answered plain reviews, how many went unanswered (connection
closed or refused, or no answer within the timeout: the API server would then apply the
webhook's failurePolicy), and what the flood got (answers, "not checked" answers, failures).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

DRIVER = "gpu.sharegpu.dev"
ROOT = Path(__file__).resolve().parent.parent


def claim(name: str, selectors: list[str]) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def review(obj: dict[str, Any], user: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
                "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "claims"},
                "operation": "CREATE",
                "namespace": "default",
                "userInfo": {"username": user, "groups": ["system:authenticated"]},
                "object": obj,
            },
        }
    ).encode()


def heavy_selectors(serial: int) -> list[str]:
    """Two distinct 8 KiB selectors never sent before (within the per-object budget)."""
    out = []
    for i in range(2):
        head = f"device.attributes['{DRIVER}'].productName == '{serial}-{i}-"
        out.append(head + "x" * (8 * 1024 - 16 - len(head) - 1) + "'")
    return out


def client_context(certs: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / "serving-ca.crt"))
    context.load_cert_chain(str(certs / "apiserver.crt"), str(certs / "apiserver.key"))
    return context


def make_certificates(certs: Path) -> None:
    import trustme

    serving, client = trustme.CA(), trustme.CA()
    leaf = serving.issue_cert("localhost", "127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(str(certs / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(certs / "tls.key"))
    serving.cert_pem.write_to_path(str(certs / "serving-ca.crt"))
    client.cert_pem.write_to_path(str(certs / "client-ca.crt"))
    apiserver = client.issue_cert("kube-apiserver")
    apiserver.cert_chain_pems[0].write_to_path(str(certs / "apiserver.crt"))
    apiserver.private_key_pem.write_to_path(str(certs / "apiserver.key"))


def serve(certs: Path) -> None:
    """The webhook server (child process): prints its port, serves until stdin closes."""
    from controller.webhook import AdmissionHandler, CertificateReloader, WebhookServer

    reloader = CertificateReloader(
        str(certs / "tls.crt"), str(certs / "tls.key"), client_ca_file=str(certs / "client-ca.crt")
    )
    server = WebhookServer("127.0.0.1:0", AdmissionHandler(DRIVER), reloader).start()
    print(server.port, flush=True)
    sys.stdin.read()
    print(json.dumps({"rejected": server.rejected, "evicted": server.evicted}), flush=True)
    server.stop()


def flood(port: int, certs: Path, attackers: int, seconds: float) -> None:
    """The attacker (child process): prints what its reviews got as JSON at the end."""
    context = client_context(certs)
    stop = time.monotonic() + seconds
    lock = threading.Lock()
    counts = {"answered": 0, "not_checked": 0, "failed": 0}
    serial = iter(range(10**9))

    def attacker() -> None:
        conn: http.client.HTTPSConnection | None = None
        while time.monotonic() < stop:
            with lock:
                n = next(serial)
            body = review(claim(f"flood-{n}", heavy_selectors(n)), "tenant-a")
            try:
                if conn is None:
                    conn = http.client.HTTPSConnection(
                        "localhost", port, context=context, timeout=10
                    )
                conn.request("POST", "/validate/resourceclaims", body=body)
                answer = json.loads(conn.getresponse().read())
                warned = any("not checked" in w for w in answer["response"].get("warnings", []))
                with lock:
                    counts["not_checked" if warned else "answered"] += 1
            except (OSError, http.client.HTTPException, ValueError, KeyError):
                with lock:
                    counts["failed"] += 1
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.01)

    threads = [threading.Thread(target=attacker, daemon=True) for _ in range(attackers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(counts), flush=True)


def plain_review(port: int, context: ssl.SSLContext, timeout: float) -> float | None:
    """Seconds to the answer of one plain 1-GPU review on a new connection; None unanswered."""
    body = review(claim("plain", []), "tenant-b")
    start = time.monotonic()
    conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=timeout)
    try:
        conn.request("POST", "/validate/resourceclaims", body=body)
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        if resp.status != 200 or answer["response"]["allowed"] is not True:
            return None
    except (OSError, http.client.HTTPException, ValueError, KeyError):
        return None
    finally:
        conn.close()
    took = time.monotonic() - start
    return took if took <= timeout else None


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attackers", type=int, default=40)
    parser.add_argument("--legit", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--code", default=str(ROOT), help="checkout whose controller is served")
    parser.add_argument("--serve", metavar="CERTS", help=argparse.SUPPRESS)
    parser.add_argument("--flood", nargs=3, metavar=("PORT", "CERTS", "S"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve))
        return
    if args.flood:
        flood(int(args.flood[0]), Path(args.flood[1]), args.attackers, float(args.flood[2]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp)
        make_certificates(certs)
        env = {**os.environ, "PYTHONPATH": args.code}
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(certs)],
            cwd=args.code,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # one warning per review turned away
            text=True,
        )
        assert server.stdout is not None and server.stdin is not None
        port = int(server.stdout.readline())
        flood_s = 2.0 + args.rounds * (args.timeout + 1.0)
        attacker = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--attackers",
                str(args.attackers),
                "--flood",
                str(port),
                str(certs),
                str(flood_s),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(2.0)
        context = client_context(certs)
        took: list[float] = []
        unanswered = 0
        with ThreadPoolExecutor(max_workers=args.legit) as pool:
            for _ in range(args.rounds):
                round_start = time.monotonic()
                jobs = [
                    pool.submit(plain_review, port, context, args.timeout)
                    for _ in range(args.legit)
                ]
                for job in jobs:
                    result = job.result()
                    if result is None:
                        unanswered += 1
                    else:
                        took.append(result)
                time.sleep(max(0.0, 1.0 - (time.monotonic() - round_start)))
        attacker_out, _ = attacker.communicate()
        server_out, _ = server.communicate("")
    sent = args.rounds * args.legit
    print(f"code: {args.code}")
    print(f"flood: {args.attackers} connections of tenant-a, 2 x 8 KiB new selectors per review")
    print(f"flood got: {attacker_out.strip()}  server: {server_out.strip()}")
    if took:
        print(
            f"plain reviews of tenant-b: {sent} sent, {len(took)} answered, "
            f"{unanswered} unanswered; p50 {percentile(took, 50) * 1000:.0f} ms, "
            f"p99 {percentile(took, 99) * 1000:.0f} ms, max {max(took) * 1000:.0f} ms"
        )
    else:
        print(f"plain reviews of tenant-b: {sent} sent, none answered")


if __name__ == "__main__":
    main()
