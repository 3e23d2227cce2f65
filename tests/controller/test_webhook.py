"""The admission webhook through real HTTPS (trustme certificates), with a table of objects."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme

from api.names import DEFAULT_DRIVER_NAME as DRIVER
from controller.metrics import ControllerMetrics
from controller.webhook import AdmissionHandler, CertificateReloader, WebhookServer
from sharegpu.admission.checks import reserved_memory
from sharegpu.kube import httpserve
from sharegpu.kube.telemetry import Telemetry
from tests.controller.webhook_helpers import (
    Endpoint,
    claim,
    device_class,
    exactly,
    gpu_config,
    issue_certificate,
    template,
)
from tests.kube.helpers import all_closed, short_limits, stall, trickle

D = f"device.attributes['{DRIVER}']"
C = f"device.capacity['{DRIVER}']"

#: (id, object, allowed, substrings of the denial message, substrings of the warnings)
CASES: list[tuple[str, dict[str, Any], bool, list[str], list[str]]] = [
    ("whole gpu", claim(exactly()), True, [], []),
    ("share", claim(exactly({"cores": "30", "memory": "10Gi"})), True, [], []),
    (
        "qualified share v1beta2",
        claim(exactly({f"{DRIVER}/cores": "50", f"{DRIVER}/memory": "4Gi"}), version="v1beta2"),
        True,
        [],
        # Kubernetes accepts it, but kube-scheduler matches capacity names exactly.
        ["devices publish the capacity 'cores', not", "write 'memory'"],
    ),
    (
        "good selectors",
        claim(
            exactly(
                selectors=[
                    f"{D}.productName.startsWith('NVIDIA')",
                    f"{C}.memory.compareTo(quantity('40Gi')) >= 0",
                ]
            )
        ),
        True,
        [],
        [],
    ),
    (
        "other driver untouched",
        claim(exactly({"cores": "500"}, ["device.attributes['x.example.com'].foo"], "other")),
        True,
        [],
        [],
    ),
    (
        "good config",
        claim(exactly(), config=gpu_config({"sharing": {"strategy": "MPS"}})),
        True,
        [],
        [],
    ),
    (
        "cores out of range",
        claim(exactly({"cores": "150", "memory": "1Gi"})),
        False,
        ["spec.devices.requests[0].exactly.capacity.requests[cores]", "between 1 and 100"],
        [],
    ),
    (
        "memory rounded",
        claim(exactly({"cores": "10", "memory": "1000Mi"})),
        True,
        [],
        ["reserved as 1Gi"],
    ),
    (
        "memory only",
        claim(exactly({"memory": "8Gi"})),
        True,
        [],
        ["memory requested without cores"],
    ),
    ("cores only", claim(exactly({"cores": "8"})), True, [], ["cores requested without memory"]),
    (
        "unknown capacity",
        claim(exactly({"cors": "8", "memory": "1Gi"})),
        False,
        ["no capacity 'cors'", "did you mean 'cores'"],
        ["memory requested without cores"],
    ),
    (
        "typo in attribute",
        claim(exactly(selectors=[f"{D}.productname == 'H100'"])),
        False,
        ["selectors[0].cel.expression", "no attribute 'productname'", "'productName'"],
        [],
    ),
    (
        "cel syntax error",
        claim(exactly(selectors=[f"{D}.productName == "])),
        False,
        ["CEL compile error", "1:"],
        [],
    ),
    (
        "cel ip library",
        claim(exactly(selectors=[f"ip({D}.productName).family() == 4"])),
        True,
        [],
        [],
    ),
    (
        "cel optional-field syntax",
        claim(exactly(selectors=[f"{D}.?productName.orValue('') == 'H100'"])),
        True,
        [],
        [],
    ),
    (
        "cel nested deeper than the local parser follows",
        claim(exactly(selectors=["(" * 60 + f"{D}.productName == 'H100'" + ")" * 60])),
        True,
        [],
        ["not checked", "nested deeper"],
    ),
    (
        "cel unknown function",
        claim(exactly(selectors=[f"{D}.productName.bogus()"])),
        False,
        ["CEL compile error", "undeclared reference to 'bogus'"],
        [],
    ),
    (
        "cel syntax error with .? in a string",
        claim(exactly(selectors=[f"{D}.productName.matches('H.?100') &&"])),
        False,
        ["CEL compile error", "Syntax error"],
        [],
    ),
    (
        "bad strategy",
        claim(exactly(), config=gpu_config({"sharing": {"strategy": "Mps"}})),
        False,
        ["spec.devices.config[0].opaque.parameters", "sharing.strategy", "MPS"],
        [],
    ),
    (
        "first available",
        claim(
            {
                "name": "gpu",
                "firstAvailable": [
                    {
                        "name": "big",
                        "deviceClassName": DRIVER,
                        "capacity": {"requests": {"cores": "0", "memory": "1Gi"}},
                    },
                    {"name": "any", "deviceClassName": DRIVER},
                ],
            }
        ),
        False,
        ["requests[0].firstAvailable[0].capacity.requests[cores]"],
        [],
    ),
    (
        "template half share",
        template({"devices": {"requests": [exactly({"memory": "300Mi"})]}}),
        True,
        [],
        ["memory requested without cores", "300Mi is reserved as 512Mi"],
    ),
    (
        "template bad selector",
        template({"devices": {"requests": [exactly(selectors=[f"{C}.mem.isInteger()"])]}}),
        False,
        ["spec.spec.devices.requests[0].exactly.selectors[0]", "'memory'"],
        [],
    ),
    (
        "mps override within the share",
        claim(
            exactly({"cores": "30", "memory": "4Gi"}),
            config=gpu_config(
                {"sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 20}}}
            ),
        ),
        True,
        [],
        [],
    ),
    (
        "mps override above the share",
        claim(
            exactly({"cores": "30", "memory": "4Gi"}),
            config=gpu_config(
                {"sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 60}}}
            ),
        ),
        False,
        ["spec.devices.config[0].opaque.parameters", "activeThreadPercentage 60 is above the 30"],
        [],
    ),
    (
        "limits memory above the rounded share",
        claim(
            exactly({"cores": "30", "memory": "1000Mi"}),
            config=gpu_config(
                {"sharing": {"strategy": "Limits", "limits": {"deviceMemoryLimit": "2Gi"}}}
            ),
        ),
        False,
        ["deviceMemoryLimit 2Gi is above the 1Gi memory"],
        ["reserved as 1Gi"],
    ),
    ("class good", device_class([f"device.driver == '{DRIVER}'"]), True, [], []),
    (
        "class bad config and selector",
        device_class(
            [f"{D}.uid == 'x'"], gpu_config({"sharing": {"strategy": "TimeSlicing", "mps": {}}})
        ),
        False,
        ["spec.selectors[0]", "'uuid'", "spec.config[0].opaque.parameters"],
        [],
    ),
]


@pytest.mark.parametrize(
    ("obj", "allowed", "denial", "warns"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_review_table(
    endpoint: Endpoint, obj: dict[str, Any], allowed: bool, denial: list[str], warns: list[str]
) -> None:
    response = endpoint.review(obj)
    assert response["allowed"] is allowed, response
    message = response.get("status", {}).get("message", "")
    for text in denial:
        assert text in message, message
    if not allowed:
        assert response["status"]["code"] == 422
    joined = "\n".join(response.get("warnings", []))
    for text in warns:
        assert text in joined, joined
    if not warns:
        assert "warnings" not in response


def test_delete_is_allowed_unchecked(endpoint: Endpoint) -> None:
    bad = claim(exactly({"cores": "1000"}))
    assert endpoint.review(bad, operation="DELETE")["allowed"] is True


def test_malformed_reviews_and_unknown_paths(endpoint: Endpoint) -> None:
    status, answer = endpoint.call("POST", "/validate/resourceclaims", {"kind": "Pod"})
    assert status == 400 and "AdmissionReview" in answer["error"]
    status, _ = endpoint.call("POST", "/validate/pods", {"kind": "AdmissionReview"})
    assert status == 404


def test_a_deeply_nested_foreign_config_keeps_the_denial(endpoint: Endpoint) -> None:
    """Another driver's opaque config nested 3,000 deep (the API server accepts 10,000) used to
    turn the denial of the claim into an HTTP 500; it is reviewed like any other claim."""
    foreign = {"opaque": {"driver": "other.example.com", "parameters": "DEEP"}}
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-deep",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "operation": "CREATE",
            "object": claim(exactly({"cores": "1000"}), config=[foreign]),
        },
    }
    deep = '{"a":' * 3000 + "1" + "}" * 3000
    data = json.dumps(body).replace('"DEEP"', deep).encode()
    status, answer = endpoint.call_raw("/validate/resourceclaims", data)
    assert status == 200, answer
    response = answer["response"]
    assert response["uid"] == "u-deep" and response["allowed"] is False
    assert "cores" in response["status"]["message"]


def test_bad_content_length_is_a_bad_request(endpoint: Endpoint) -> None:
    conn = http.client.HTTPSConnection(
        "localhost", endpoint.server.port, context=endpoint.context, timeout=30
    )
    try:
        conn.putrequest("POST", "/validate/resourceclaims")
        conn.putheader("Content-Length", "lots")
        conn.endheaders()
        resp = conn.getresponse()
        assert resp.status == 400 and b"missing or oversized body" in resp.read()
    finally:
        conn.close()


def test_a_failing_check_is_logged_and_answered_500(
    endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: AdmissionHandler, kind: str, obj: dict[str, Any]) -> list[Any]:
        raise RuntimeError("a defect in a check")

    monkeypatch.setattr(AdmissionHandler, "findings", broken)
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "operation": "CREATE",
            "object": claim(exactly()),
        },
    }
    with caplog.at_level(logging.ERROR, logger="controller.webhook"):
        status, answer = endpoint.call("POST", "/validate/resourceclaims", body)
    assert status == 500 and answer == {"error": "internal error while reviewing the object"}
    assert any(
        r.levelno == logging.ERROR and "a defect in a check" in (r.exc_text or "")
        for r in caplog.records
    )
    text = endpoint.telemetry.scrape().decode()
    assert 'sharegpu_webhook_reviews_total{kind="unknown",result="error"} 1.0' in text


def test_health_endpoints(endpoint: Endpoint) -> None:
    assert endpoint.call("GET", "/healthz") == (200, "ok\n")
    assert endpoint.call("GET", "/readyz") == (200, "ok\n")


def test_reviews_are_counted(endpoint: Endpoint) -> None:
    endpoint.review(claim(exactly()))
    endpoint.review(claim(exactly({"cores": "0"})))
    text = endpoint.telemetry.scrape().decode()
    assert 'sharegpu_webhook_reviews_total{kind="ResourceClaim",result="allowed"} 1.0' in text
    assert 'sharegpu_webhook_reviews_total{kind="ResourceClaim",result="denied"} 1.0' in text


def test_certificate_is_reloaded_when_files_change(endpoint: Endpoint, tmp_path: Path) -> None:
    new_ca = trustme.CA()
    issue_certificate(new_ca, tmp_path)
    endpoint.context = ssl.create_default_context()
    new_ca.configure_trust(endpoint.context)
    assert endpoint.call("GET", "/healthz")[0] == 200  # served with the new certificate
    assert endpoint.server.certificates.reloads == 1


def test_reload_failure_keeps_previous_certificate(endpoint: Endpoint, tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate")
    assert endpoint.call("GET", "/healthz")[0] == 200
    assert endpoint.server.certificates.reloads == 0


def test_reserved_memory_rounding() -> None:
    mi = 1024**2
    assert reserved_memory(1) == 256 * mi
    assert reserved_memory(256 * mi) == 256 * mi
    assert reserved_memory(256 * mi + 1) == 512 * mi


def test_clients_that_stall_or_trickle_are_cut_at_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that never finishes its TLS handshake, and one that sends its request one byte
    every 0.5 s after the handshake (each read well within a per-read timeout), are both cut at
    the request deadline; reviews are answered meanwhile."""
    monkeypatch.setattr(httpserve, "DEFAULT_LIMITS", short_limits(request_timeout_s=2.0))
    ca = trustme.CA()
    cert, key = issue_certificate(ca, tmp_path)
    telemetry = Telemetry("test-webhook")
    admission = AdmissionHandler(DRIVER, ControllerMetrics(telemetry))
    server = WebhookServer("127.0.0.1:0", admission, CertificateReloader(cert, key, 0.0)).start()
    endpoint = Endpoint(server, ca, telemetry)
    handshake = stall(server.port, b"\x16")
    trickler = endpoint.context.wrap_socket(
        socket.create_connection(("127.0.0.1", server.port), timeout=30),
        server_hostname="localhost",
    )
    request = b"POST /validate HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 100
    try:
        trickler.sendall(request[:1])
        assert endpoint.call("GET", "/healthz") == (200, "ok\n")
        assert endpoint.review(claim(exactly()))["allowed"] is True
        assert trickle([trickler], request, timeout_s=8.0) == []
        all_closed([handshake], timeout_s=1.0)
    finally:
        handshake.close()
        trickler.close()
        server.stop()
        telemetry.shutdown()
