"""The whole controller process: flags, /metrics, the JSON API, SIGTERM, expected errors."""

from __future__ import annotations

import json
import logging
import signal
import ssl
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from prometheus_client.parser import text_string_to_metric_families

import sharegpu.kube.telemetry as telemetry_module
from controller.config import config_from_args
from controller.main import Controller, build_parser
from controller.tracker import Tracker
from sharegpu.kube import httpserve
from sharegpu.kube.leader import LeaderElector
from sharegpu.kube.rest import KubeRest
from sharegpu.kube.telemetry import Telemetry, span_exporter_from_env
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.controller import helpers as h
from tests.helpers import eventually
from tests.kube.helpers import all_closed, get_with_retries, short_limits, stall

DEADLINE_S = 30.0
#: The CA of the certificates the running controller serves (the webhook's and the API's).
_CA = trustme.CA()
_TRUST = ssl.create_default_context()
_CA.configure_trust(_TRUST)
#: The audience the JSON API's tokens are bound to.
AUDIENCE = ("sharegpu.dev",)


def _get(
    port: int, path: str, token: str | None = None, scheme: str = "https"
) -> tuple[int, bytes]:
    """GET from the JSON API (HTTPS, as the chart serves it) or, with ``scheme="http"``, from
    the probe or metrics port."""
    host = "localhost" if scheme == "https" else "127.0.0.1"
    request = urllib.request.Request(f"{scheme}://{host}:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    context = _TRUST if scheme == "https" else None
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.fixture
def running(apiserver: KubeAPIServer, tmp_path: Path) -> Iterator[tuple[Controller, h.Cluster]]:
    cert = _CA.issue_cert("localhost")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    cert.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    args = build_parser().parse_args(
        [
            f"--kubeconfig={apiserver.write_kubeconfig(tmp_path / 'kubeconfig')}",
            "--webhook-address=127.0.0.1:0",
            f"--tls-cert-file={tmp_path / 'tls.crt'}",
            f"--tls-key-file={tmp_path / 'tls.key'}",
            "--metrics-address=127.0.0.1:0",
            "--api-address=127.0.0.1:0",
            f"--api-tls-cert-file={tmp_path / 'tls.crt'}",
            f"--api-tls-key-file={tmp_path / 'tls.key'}",
            "--probe-address=127.0.0.1:0",
            "--leader-elect=true",
            "--lease-namespace=sharegpu",
        ]
    )
    client = apiserver.client()
    cluster = h.Cluster(KubeRest(client))
    for node in ("n1", "n2"):
        cluster.add_slice(h.node_slice(node, 2))
    cluster.add_claim("a", [h.result("n1", "gpu-1", cores=30, memory="10Gi")])
    apiserver.inject_fault("create", "gpus", code=500, times=1)  # one failed write, retried
    controller = Controller(config_from_args(args))
    controller.start()
    try:
        yield controller, cluster
    finally:
        controller.stop()
        client.close()


def test_metrics_scraped_and_parsed(
    apiserver: KubeAPIServer, running: tuple[Controller, h.Cluster]
) -> None:
    controller, cluster = running
    eventually(cluster.converged, timeout_s=DEADLINE_S)
    assert controller.metrics_server is not None
    status, body = _get(controller.metrics_server.server_address[1], "/metrics", scheme="http")
    assert status == 200
    samples: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[(s.name, s.labels.get("gpu", ""))] = s.value
    assert samples[("sharegpu_gpu_cores_allocated", "n1-gpu-1")] == 30
    assert samples[("sharegpu_gpu_cores_capacity", "n1-gpu-1")] == 100
    assert samples[("sharegpu_gpu_memory_allocated_bytes", "n1-gpu-1")] == 10 * h.GI
    assert samples[("sharegpu_gpu_memory_capacity_bytes", "n2-gpu-0")] == h.GPU_MEMORY
    assert samples[("sharegpu_gpu_claims", "n1-gpu-1")] == 1
    assert samples[("sharegpu_gpu_claims", "n1-gpu-0")] == 0
    assert samples[("sharegpu_reconcile_duration_seconds_count", "")] >= 1
    errors = [
        s
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == "sharegpu_api_errors_total"
    ]
    assert [(e.labels, e.value) for e in errors] == [
        ({"verb": "post", "resource": "gpus", "code": "500"}, 1.0)
    ]


def test_tracker_stops_before_the_lease_is_released(
    apiserver: KubeAPIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby may take a released lease at once: no write of this replica may follow."""
    order: list[str] = []
    tracker_stop, release = Tracker.stop, LeaderElector._release

    def stop_tracker(self: Tracker) -> None:
        tracker_stop(self)
        order.append("tracker stopped")

    def release_lease(self: LeaderElector) -> None:
        order.append("lease released")
        release(self)

    monkeypatch.setattr(Tracker, "stop", stop_tracker)
    monkeypatch.setattr(LeaderElector, "_release", release_lease)
    args = build_parser().parse_args(
        [
            f"--kubeconfig={apiserver.write_kubeconfig(tmp_path / 'kubeconfig')}",
            "--disable-webhook",
            "--metrics-address=",
            "--api-address=",
            "--leader-elect=true",
            "--lease-namespace=sharegpu",
        ]
    )
    controller = Controller(config_from_args(args))
    controller.start()
    try:
        assert controller.elector is not None
        assert controller.elector.wait_for_leadership(DEADLINE_S)
    finally:
        controller.stop()
    assert order == ["tracker stopped", "lease released"]


def test_stop_closes_the_api_client(apiserver: KubeAPIServer, tmp_path: Path) -> None:
    """An in-process controller that stops closes its pooled connections to the API server."""
    args = build_parser().parse_args(
        [
            f"--kubeconfig={apiserver.write_kubeconfig(tmp_path / 'kubeconfig')}",
            "--disable-webhook",
            "--metrics-address=",
            "--api-address=",
            "--leader-elect=true",
            "--lease-namespace=sharegpu",
        ]
    )
    controller = Controller(config_from_args(args))
    controller.start()
    try:
        assert controller.tracker is not None and controller.tracker.wait_synced(DEADLINE_S)
        pools = controller.tracker.kube.api_client.rest_client.pool_manager.pools
        assert len(pools) > 0
    finally:
        controller.stop()
    assert len(pools) == 0


def test_json_api_and_probes(
    apiserver: KubeAPIServer, running: tuple[Controller, h.Cluster]
) -> None:
    controller, cluster = running
    eventually(cluster.converged, timeout_s=DEADLINE_S)
    assert controller.api_server is not None
    port = controller.api_server.server_address[1]
    assert _get(port, "/healthz")[0] == 200
    eventually(lambda: _get(port, "/readyz")[0] == 200, timeout_s=DEADLINE_S)
    apiserver.reviews.add_token("reader-token", "reader", audiences=AUDIENCE)
    apiserver.reviews.allow("reader", "list", "resource.sharegpu.dev", "gpus")
    status, body = _get(port, "/api/v1/gpus", "reader-token")
    items = json.loads(body)["items"]
    assert status == 200 and [i["metadata"]["name"] for i in items] == [
        "n1-gpu-0",
        "n1-gpu-1",
        "n2-gpu-0",
        "n2-gpu-1",
    ]
    stored = cluster.stored()
    assert all(i["status"] == stored[i["metadata"]["name"]]["status"] for i in items)
    status, body = _get(port, "/api/v1/nodes/n2/gpus", "reader-token")
    assert status == 200 and {i["spec"]["node"] for i in json.loads(body)["items"]} == {"n2"}
    assert _get(port, "/api/v1/nope", "reader-token")[0] == 404


def test_the_json_api_is_served_only_to_users_who_may_list_gpu_objects(
    apiserver: KubeAPIServer, running: tuple[Controller, h.Cluster]
) -> None:
    """The JSON API shows every tenant's claims and pods: the same RBAC as the GPU objects."""
    controller, _ = running
    assert controller.api_server is not None
    port = controller.api_server.server_address[1]
    apiserver.reviews.add_token("tenant-token", "tenant", audiences=AUDIENCE)
    apiserver.reviews.add_token("ops-token", "ops", groups=("gpu-admins",), audiences=AUDIENCE)
    # A token for the Kubernetes API (its default audience) is no key to the JSON API.
    apiserver.reviews.add_token("kube-token", "ops", groups=("gpu-admins",))
    apiserver.reviews.allow("gpu-admins", "list", "resource.sharegpu.dev", "gpus")
    status, body = _get(port, "/api/v1/gpus")
    assert status == 401 and b"needs a bearer token" in body
    status, body = _get(port, "/api/v1/gpus", "forged-token")
    assert status == 401 and b"not valid" in body
    status, body = _get(port, "/api/v1/gpus", "tenant-token")
    assert status == 403 and b"may not list gpus.resource.sharegpu.dev" in body
    assert _get(port, "/api/v1/nodes/n1/gpus", "tenant-token")[0] == 403
    assert _get(port, "/api/v1/gpus", "ops-token")[0] == 200
    status, body = _get(port, "/api/v1/gpus", "kube-token")
    assert status == 401 and b"not valid for audience 'sharegpu.dev'" in body
    # Probes carry no data and need no credentials; the probe port serves nothing else.
    assert _get(port, "/healthz")[0] == 200
    assert controller.probe_server is not None
    probes = controller.probe_server.server_address[1]
    assert _get(probes, "/healthz", scheme="http") == (200, b"ok\n")
    assert _get(probes, "/readyz", scheme="http")[0] == 200
    assert _get(probes, "/api/v1/gpus", "ops-token", scheme="http")[0] == 404
    # Decisions are cached: polling again costs no further review.
    reviews = apiserver.request_count("create", "tokenreviews")
    for _ in range(5):
        assert _get(port, "/api/v1/gpus", "ops-token")[0] == 200
        assert _get(port, "/api/v1/gpus", "tenant-token")[0] == 403
    assert apiserver.request_count("create", "tokenreviews") == reviews


def _run(args: list[str], **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "controller", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _communicate(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """``communicate`` with the deadline; a process that overruns it is killed, not left."""
    try:
        return proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.process
def test_sigterm_shuts_down_cleanly(apiserver: KubeAPIServer, tmp_path: Path) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    proc = _run(
        [
            f"--kubeconfig={kubeconfig}",
            "--disable-webhook",
            "--metrics-address=127.0.0.1:0",
            "--api-address=127.0.0.1:0",
            "--log-format=json",
        ]
    )
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(json.loads(line))
            if "tracking GPUs" in lines[-1]["msg"]:
                break
        eventually(lambda: apiserver.open_watches() >= 4, timeout_s=DEADLINE_S)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    messages = [json.loads(line)["msg"] for line in err.splitlines()]
    assert any("SIGTERM" in m for m in messages) and messages[-1] == "stopped"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--disable-tracker"], "needs --tls-cert-file and --tls-key-file"),
        (
            ["--disable-webhook", "--kubeconfig=/nonexistent/kubeconfig"],
            "kubeconfig /nonexistent/kubeconfig (from --kubeconfig) does not exist",
        ),
        (
            ["--disable-tracker", "--tls-cert-file=/nonexistent.crt", "--tls-key-file=/x.key"],
            "cannot load the TLS certificate /nonexistent.crt",
        ),
    ],
)
@pytest.mark.process
def test_expected_errors_without_traceback(args: list[str], message: str) -> None:
    proc = _run([*args, "--metrics-address=", "--api-address="])
    _, err = _communicate(proc)
    assert proc.returncode == 1
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.process
def test_bad_flag_values_are_usage_errors() -> None:
    proc = _run(["--leader-elect=maybe"])
    _, err = _communicate(proc)
    assert proc.returncode == 2 and "expected true or false" in err


def test_traces_only_when_configured(caplog: pytest.LogCaptureFixture) -> None:
    assert span_exporter_from_env({}) is None
    assert span_exporter_from_env({"OTEL_TRACES_EXPORTER": "none"}) is None
    assert span_exporter_from_env({"OTEL_TRACES_EXPORTER": "console"}) is not None
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401

        have_otlp = True
    except ImportError:
        have_otlp = False
    telemetry_module._warned_missing_otlp = False
    with caplog.at_level(logging.WARNING):
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
        telemetry = Telemetry("t", env)
        telemetry.shutdown()
        Telemetry("t", env).shutdown()
    assert telemetry.tracing_enabled is have_otlp
    if not have_otlp:
        warnings = [r for r in caplog.records if "OTLP exporter is not installed" in r.message]
        assert len(warnings) == 1  # said once per process, not per instance


def test_servers_listen_on_localhost_by_default() -> None:
    args = build_parser().parse_args([])
    assert args.webhook_address == "127.0.0.1:8443"
    assert args.metrics_address == "127.0.0.1:9401"
    assert args.api_address == "127.0.0.1:8080"


def test_every_server_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The webhook, the JSON API (the probes) and /metrics: threads stay within the cap, and
    each staller (one byte of a request, or of a TLS handshake) is cut at the deadline (or
    evicted for a newer connection) while the probes still answer."""
    cap = 4
    monkeypatch.setattr(httpserve, "DEFAULT_LIMITS", short_limits(max_connections=cap))
    cert = trustme.CA().issue_cert("localhost")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    cert.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    args = build_parser().parse_args(
        [
            "--disable-tracker",
            "--webhook-address=127.0.0.1:0",
            f"--tls-cert-file={tmp_path / 'tls.crt'}",
            f"--tls-key-file={tmp_path / 'tls.key'}",
            "--metrics-address=127.0.0.1:0",
            "--api-address=127.0.0.1:0",
        ]
    )
    controller = Controller(config_from_args(args))
    controller.start()
    stallers = []
    try:
        assert controller.webhook and controller.metrics_server and controller.api_server
        ports = [
            controller.webhook.server_address[1],
            controller.metrics_server.server_address[1],
            controller.api_server.server_address[1],
        ]
        baseline = threading.active_count()

        def within_the_caps() -> None:
            assert threading.active_count() <= baseline + 3 * (cap + httpserve.EVICTING_MAX)

        stallers = [stall(port) for port in ports for _ in range(20)]
        # Until the last staller is cut (1 s deadline; the webhook's former handshake timeout
        # was 10 s), the three servers' threads stay within their caps.
        all_closed(stallers, timeout_s=6.0, meanwhile=within_the_caps)
        assert get_with_retries(ports[2], "/healthz") == 200
        assert get_with_retries(ports[1], "/metrics") == 200
    finally:
        for sock in stallers:
            sock.close()
        controller.stop()
