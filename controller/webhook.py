"""The validating admission webhook (AdmissionReview v1 over HTTPS).

Endpoints (POST, ``Content-Type: application/json``)::

    /validate/resourceclaims           ResourceClaim          (resource.k8s.io v1, v1beta2)
    /validate/resourceclaimtemplates   ResourceClaimTemplate  (v1, v1beta2)
    /validate/deviceclasses            DeviceClass            (v1, v1beta2)
    /validate                          any of them, by the object's kind

plus ``GET /healthz`` (the process serves) and ``GET /readyz`` (a certificate is loaded).

Every check is a function of :mod:`sharegpu.admission.checks` (shared with ``sharegpu validate``):
errors deny the object with one message listing each ``path: problem``; warnings are returned
as AdmissionReview ``warnings`` (kubectl prints them) and the object is allowed. DELETE and
objects of other kinds are allowed unchecked.

Failure policy: the chart registers the webhook with ``failurePolicy: Ignore`` by default, so a
controller outage never blocks claims (of any driver); the scheduler and the kubelet plugin
still reject what cannot work, only later and less clearly. ``Fail`` makes admission strict at
the price of blocking all DRA object writes while no replica answers.

TLS: the certificate and key are read from files and reloaded when either file changes (checked
at most once per second, on new connections), so a rotated Secret needs no restart. A reload
that fails keeps the previous certificate and logs why.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from controller.metrics import ControllerMetrics
from sharegpu.admission.checks import (
    Finding,
    check_device_class,
    check_resource_claim,
    check_resource_claim_template,
    errors,
    warnings,
)
from sharegpu.kube import jsonbody
from sharegpu.kube.telemetry import parse_address

log = logging.getLogger(__name__)

#: URL path suffix -> kind it validates.
ENDPOINTS = {
    "resourceclaims": "ResourceClaim",
    "resourceclaimtemplates": "ResourceClaimTemplate",
    "deviceclasses": "DeviceClass",
}
_MAX_BODY = 3 * 1024 * 1024
_MAX_WARNINGS = 10


class CertificateReloader:
    """An ``ssl.SSLContext`` for the current contents of a cert/key pair."""

    def __init__(self, cert_file: str, key_file: str, check_interval_s: float = 1.0) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.check_interval_s = check_interval_s
        self._lock = threading.Lock()
        self._stamp: tuple[float, int, float, int] | None = None
        self._checked = 0.0
        self.reloads = 0
        try:
            self._context = self._load()
        except (OSError, ssl.SSLError) as exc:  # no certificate at start-up is fatal
            raise ValueError(
                f"cannot load the TLS certificate {cert_file} with key {key_file}: "
                f"{getattr(exc, 'strerror', None) or exc}"
            ) from None

    def _file_stamp(self) -> tuple[float, int, float, int]:
        c, k = os.stat(self.cert_file), os.stat(self.key_file)
        return (c.st_mtime, c.st_size, k.st_mtime, k.st_size)

    def _load(self) -> ssl.SSLContext:
        stamp = self._file_stamp()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        self._stamp = stamp
        return context

    def context(self) -> ssl.SSLContext:
        """The context to use for a new connection (reloaded if the files changed)."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked < self.check_interval_s:
                return self._context
            self._checked = now
            try:
                changed = self._file_stamp() != self._stamp
                if changed:
                    self._context = self._load()
                    self.reloads += 1
                    log.info("webhook: reloaded TLS certificate from %s", self.cert_file)
            except (OSError, ssl.SSLError) as exc:
                log.error("webhook: keeping the previous certificate: reload failed: %s", exc)
            return self._context


def review_response(uid: str, findings: Iterable[Finding], what: str) -> tuple[dict[str, Any], str]:
    """The AdmissionReview ``response`` for ``findings`` and its result label."""
    found = list(findings)
    errs = errors(found)
    warns = [str(w) for w in warnings(found)][:_MAX_WARNINGS]
    response: dict[str, Any] = {"uid": uid, "allowed": not errs}
    if warns:
        response["warnings"] = warns
    if errs:
        response["status"] = {
            "code": 422,
            "reason": "Invalid",
            "message": f"{what} is invalid: " + "; ".join(str(e) for e in errs),
        }
        return response, "denied"
    return response, "warned" if warns else "allowed"


class AdmissionHandler:
    """Validates AdmissionReview requests; independent of HTTP so it can be benchmarked."""

    def __init__(
        self,
        driver: str,
        metrics: ControllerMetrics | None = None,
        device_classes: Iterable[str] = (),
    ) -> None:
        self.driver = driver
        self.metrics = metrics
        self.device_classes = frozenset(device_classes)

    def findings(self, kind: str, obj: dict[str, Any]) -> list[Finding]:
        """The checks of one object of ``kind``."""
        if kind == "ResourceClaim":
            return check_resource_claim(obj, self.driver, self.device_classes)
        if kind == "ResourceClaimTemplate":
            return check_resource_claim_template(obj, self.driver, self.device_classes)
        if kind == "DeviceClass":
            return check_device_class(obj, self.driver)
        return []

    def review(self, body: Any, expected_kind: str | None = None) -> dict[str, Any]:
        """Answer one AdmissionReview (v1) body; raises ValueError for a malformed review."""
        if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
            raise ValueError("expected an AdmissionReview object")
        request = body.get("request")
        if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
            raise ValueError("AdmissionReview.request.uid is missing")
        uid = request["uid"]
        kind = str((request.get("kind") or {}).get("kind", ""))
        obj = request.get("object")
        if request.get("operation") == "DELETE" or not isinstance(obj, dict):
            response: dict[str, Any] = {"uid": uid, "allowed": True}
            result = "allowed"
        elif expected_kind is not None and kind != expected_kind:
            response = {"uid": uid, "allowed": True}
            result = "allowed"
            log.warning("webhook: %s sent to the %s endpoint; allowed", kind, expected_kind)
        else:
            meta = obj.get("metadata") or {}
            name = meta.get("name") or meta.get("generateName") or ""
            ns = request.get("namespace") or meta.get("namespace")
            what = f"{kind} {ns}/{name}" if ns else f"{kind} {name}"
            response, result = review_response(uid, self.findings(kind, obj), what)
        if self.metrics is not None:
            self.metrics.review(kind or "unknown", result)
        return {
            "apiVersion": body.get("apiVersion", "admission.k8s.io/v1"),
            "kind": "AdmissionReview",
            "response": response,
        }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    #: Buffer each answer and send it in one segment (no Nagle / delayed-ACK stalls).
    wbufsize = 64 * 1024
    admission: AdmissionHandler
    ready: Callable[[], bool]

    def setup(self) -> None:
        self.request.settimeout(10.0)
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request.do_handshake()
        super().setup()

    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._send(200, b"ok\n", "text/plain")
        elif self.path == "/readyz":
            ok = self.ready()
            self._send(200 if ok else 503, b"ok\n" if ok else b"not ready\n", "text/plain")
        else:
            self._send(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/validate":
            expected = None
        elif path.startswith("/validate/") and path[len("/validate/") :] in ENDPOINTS:
            expected = ENDPOINTS[path[len("/validate/") :]]
        else:
            self._send(404, b"not found\n", "text/plain")
            return
        raw_length = self.headers.get("Content-Length") or "0"
        length = int(raw_length) if raw_length.isdigit() else -1
        if length <= 0 or length > _MAX_BODY:
            self._send(400, b'{"error":"missing or oversized body"}')
            return
        try:
            body = jsonbody.decode(self.rfile.read(length))
            answer = self.admission.review(body, expected)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            self._failed(400, str(exc))
            return
        except Exception:
            # A defect in a check: logged where an operator sees it, answered so the API
            # server applies the webhook's failurePolicy at once instead of a dropped connection.
            log.exception("webhook: reviewing a request to %s failed", self.path)
            self._failed(500, "internal error while reviewing the object")
            return
        self._send(200, json.dumps(answer, separators=(",", ":")).encode())

    def _failed(self, code: int, message: str) -> None:
        if self.admission.metrics is not None:
            self.admission.metrics.review("unknown", "error")
        self._send(code, json.dumps({"error": message}).encode())

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("webhook %s", format % args)


class WebhookServer(ThreadingHTTPServer):
    """HTTPS server for :class:`AdmissionHandler`; TLS per connection from the reloader."""

    daemon_threads = True

    def __init__(
        self, address: str, admission: AdmissionHandler, certificates: CertificateReloader
    ) -> None:
        self.certificates = certificates
        handler = type(
            "WebhookHandler",
            (_Handler,),
            {"admission": admission, "ready": staticmethod(lambda: True)},
        )
        super().__init__(parse_address(address), handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        tls = self.certificates.context().wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False
        )
        return tls, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        # TLS handshake failures and clients that go away are expected; no tracebacks.
        log.debug("webhook: connection from %s failed", client_address, exc_info=True)

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self.server_address[1])

    def start(self) -> WebhookServer:
        """Serve in a daemon thread."""
        threading.Thread(
            target=self.serve_forever, args=(0.1,), name="webhook-https", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.shutdown()
        self.server_close()
