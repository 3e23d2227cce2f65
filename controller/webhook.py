"""The validating admission webhook (AdmissionReview v1 over HTTPS): ``POST /validate`` (any kind)
and ``/validate/{resourceclaims,resourceclaimtemplates,deviceclasses}``, ``GET /healthz`` and
``/readyz`` (a certificate is loaded).

Invariants: every check is :mod:`sharegpu.admission.checks`'s (errors deny with ``path:
problem``, warnings allow; DELETE and other kinds pass); with a
:class:`~controller.quotaadmit.QuotaAdmitter` a passing claim CREATE is charged or denied 403,
and only a review proven by the API server's client certificate writes a charge; every review
with a string ``request.uid`` is answered with it, other bodies get 400, 500 is a defect, each
logged in one line; work and answer are bounded (20 errors, 10 warnings, 1,000 characters
each); the certificate is reloaded when its files change, TLS 1.3 or 1.2 with ECDHE and AEAD
only (:func:`server_tls_context`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from api.jsontypes import json_type
from controller.checkgate import CompileGate
from controller.metrics import REVIEWED_KINDS, ControllerMetrics, ReviewResult
from controller.quotaadmit import QuotaAdmitter, not_enforced_warning
from sharegpu.admission.checks import (
    ERROR,
    WARNING,
    ClassConfigs,
    Finding,
    check_device_class,
    check_resource_claim,
    check_resource_claim_template,
    errors,
    uncompiled_selector_bytes,
    warnings,
)
from sharegpu.kube import httpserve, jsonbody
from sharegpu.kube.telemetry import parse_address

log = logging.getLogger(__name__)

#: URL path suffix -> kind it validates.
ENDPOINTS = {
    "resourceclaims": "ResourceClaim",
    "resourceclaimtemplates": "ResourceClaimTemplate",
    "deviceclasses": "DeviceClass",
}
#: The largest review body read: the API server's limit on a request body (3 MiB). An object is
#: at most 1.5 MiB (etcd's default request limit), so a review with both the object and the old
#: object fits.
_MAX_BODY = 3 * 1024 * 1024
#: Seconds to read a review in full (head and body): the API server gives up after the chart's
#: ``timeoutSeconds`` (5 s), so a slower request only holds a slot.
_REQUEST_TIMEOUT_S = 4.0
#: At most this many warnings are returned with an answer.
_MAX_WARNINGS = 10


#: TLS 1.2 cipher suites the webhook accepts: forward secret (ECDHE) and authenticated
#: encryption (AES-GCM, ChaCha20-Poly1305) only. TLS 1.3 suites are all of that kind.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL"


def server_tls_context() -> ssl.SSLContext:
    """A server context without a certificate: TLS 1.2 or newer, TLS 1.2 only with
    :data:`TLS12_CIPHERS` (no CBC, no RSA key exchange), no compression, no renegotiation.

    Invariant: every cipher suite the context offers is an AEAD suite.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    return context


class CertificateReloader:
    """An ``ssl.SSLContext`` for the current contents of a cert/key pair and, with
    ``client_ca_file``, of the CA bundle that signs the API server's client certificate (the
    context then asks every client for a certificate; one that presents a certificate this CA
    did not sign fails the handshake, one that presents none is served unauthenticated)."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        check_interval_s: float = 1.0,
        client_ca_file: str | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file or None
        self.check_interval_s = check_interval_s
        self._lock = threading.Lock()
        self._stamp: tuple[float, ...] | None = None
        self._checked = 0.0
        self.reloads = 0
        try:
            self._context = self._load()
        except (OSError, ssl.SSLError) as exc:  # no certificate at start-up is fatal
            ca = f" and client CA {client_ca_file}" if client_ca_file else ""
            raise ValueError(
                f"cannot load the TLS certificate {cert_file} with key {key_file}{ca}: "
                f"{getattr(exc, 'strerror', None) or exc}"
            ) from None

    def _file_stamp(self) -> tuple[float, ...]:
        files = [self.cert_file, self.key_file]
        if self.client_ca_file:
            files.append(self.client_ca_file)
        stamp: list[float] = []
        for path in files:
            st = os.stat(path)
            stamp += [st.st_mtime, st.st_size]
        return tuple(stamp)

    def _load(self) -> ssl.SSLContext:
        stamp = self._file_stamp()
        context = server_tls_context()
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            context.load_verify_locations(cafile=self.client_ca_file)
            context.verify_mode = ssl.CERT_OPTIONAL
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


#: The ``operation`` values of an AdmissionReview request.
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
#: The AdmissionReview versions answered (the answer has the request's version).
REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
#: At most this many errors are listed in a denial (then how many more there are).
_MAX_ERRORS = 20
#: A finding longer than this many characters is cut in a denial or warning.
_MAX_FINDING_CHARS = 1000
#: Text a client chose is cut to this many characters in a log line.
_MAX_LOGGED_CHARS = 200


class NotAnAdmissionReview(ValueError):
    """A body that is not an AdmissionReview with a ``request.uid``: there is no uid to
    answer, so it is answered 400 instead of with an AdmissionReview."""


def _clip(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."


def _logged(text: str) -> str:
    """Client-chosen text for a log line: cut and quoted, so it cannot break the line."""
    return repr(_clip(text, _MAX_LOGGED_CHARS))


def _not_one_of(allowed: Iterable[str], value: Any) -> str:
    """The message for a field whose ``value`` is none of ``allowed``."""
    got = _logged(value) if isinstance(value, str) else json_type(value)
    return f"must be one of {', '.join(allowed)}, got {got}"


def review_response(
    uid: str, findings: Iterable[Finding], what: str
) -> tuple[dict[str, Any], ReviewResult]:
    """The AdmissionReview ``response`` for ``findings`` and its result label.

    Errors deny (code 422) with one message listing the first :data:`_MAX_ERRORS` of them, the
    first :data:`_MAX_WARNINGS` warnings are returned as warnings; each finding is cut to
    :data:`_MAX_FINDING_CHARS` characters, so the size of the answer is bounded whatever the
    object holds.
    """
    found = list(findings)
    errs = errors(found)
    warns = [_clip(str(w), _MAX_FINDING_CHARS) for w in warnings(found)[:_MAX_WARNINGS]]
    response: dict[str, Any] = {"uid": uid, "allowed": not errs}
    if warns:
        response["warnings"] = warns
    if errs:
        listed = [_clip(str(e), _MAX_FINDING_CHARS) for e in errs[:_MAX_ERRORS]]
        if len(errs) > _MAX_ERRORS:
            listed.append(f"and {len(errs) - _MAX_ERRORS} more errors")
        response["status"] = {
            "code": 422,
            "reason": "Invalid",
            "message": f"{what} is invalid: " + "; ".join(listed),
        }
        return response, "denied"
    return response, "warned" if warns else "allowed"


def _request_problems(request: Mapping[str, Any]) -> list[Finding]:
    """Shape errors of the AdmissionReview's ``request`` fields read besides the object."""
    found: list[Finding] = []
    gvk = request.get("kind")
    if not isinstance(gvk, Mapping):
        found.append(
            Finding(
                ERROR,
                "request.kind",
                f"must be an object (group, version, kind), got {json_type(gvk)}",
                malformed=True,
            )
        )
    elif not isinstance(gvk.get("kind"), str) or not gvk["kind"]:
        found.append(
            Finding(
                ERROR,
                "request.kind.kind",
                f"must be a non-empty string, got {json_type(gvk.get('kind'))}",
                malformed=True,
            )
        )
    operation = request.get("operation")
    if operation is not None and operation not in OPERATIONS:
        found.append(
            Finding(
                ERROR,
                "request.operation",
                _not_one_of(OPERATIONS, operation),
                malformed=True,
            )
        )
    namespace = request.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        found.append(
            Finding(
                ERROR,
                "request.namespace",
                f"must be a string, got {json_type(namespace)}",
                malformed=True,
            )
        )
    return found


def _described(kind: str, request: Mapping[str, Any], obj: Mapping[str, Any]) -> str:
    """``Kind namespace/name`` of the reviewed object, from the fields that are strings."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = next((n for n in (meta.get("name"), meta.get("generateName")) if isinstance(n, str)), "")
    ns = next(
        (n for n in (request.get("namespace"), meta.get("namespace")) if isinstance(n, str) and n),
        "",
    )
    name = _clip(name, 253)
    return f"{kind} {_clip(ns, 63)}/{name}" if ns else f"{kind} {name}"


class AdmissionHandler:
    """Validates AdmissionReview requests; independent of HTTP so it can be benchmarked.

    Invariants: :meth:`answer` returns for every body; a body that is an AdmissionReview with a
    ``request.uid`` is answered 200 with that uid, a review with fields of the wrong shape is
    denied naming each field's path, and each malformed review or body is logged in exactly
    one line (no traceback); 500 only for a defect in a check. The review metric's labels come
    from fixed sets (:func:`controller.metrics.review_kind_label`).
    """

    def __init__(
        self,
        driver: str,
        metrics: ControllerMetrics | None = None,
        device_classes: Iterable[str] = (),
        quota: QuotaAdmitter | None = None,
        gate: CompileGate | None = None,
        class_configs: ClassConfigs | None = None,
        largest_gpu_memory: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.driver = driver
        #: The largest usable memory of the cluster's GPUs (None: none known); a burstLimit
        #: above it is refused.
        self.largest_gpu_memory = largest_gpu_memory
        #: The watched DeviceClasses' config entries (a claim's burstLimit is judged against
        #: its class's burstPolicy; None: classes are not watched, the node judges it).
        self.class_configs = class_configs
        #: Bounds the checks that compile new selectors (:mod:`controller.checkgate`).
        self.gate = gate or CompileGate()
        self.metrics = metrics
        self.device_classes = frozenset(device_classes)
        #: Charges created claims to GpuQuotas (None: quotas are not enforced).
        self.quota = quota
        self._lock = threading.Lock()
        self._warned_unauthenticated = False
        #: Whether the last claim CREATE judged against GpuQuotas (not a dry run) came from the
        #: API server, so it could be charged (None: none yet).
        self.charging: bool | None = None

    def bounded_findings(
        self, kind: str, obj: dict[str, Any], requester: str = ""
    ) -> list[Finding]:
        """:meth:`findings` under the compile gate: a check that compiles new selectors waits
        for a slot of ``requester``'s (:func:`requester_key`); without one in time the object
        is allowed, not checked, with a warning."""
        pending = uncompiled_selector_bytes(obj, self.driver)
        found = self.gate.run(pending > 0, lambda: self.findings(kind, obj), requester)
        if found is not None:
            return found
        log.warning(
            "webhook: a %s of %s with %d bytes of new selectors was allowed unchecked: no "
            "compile slot of that requester came free within %.1f s, or it had %d waiting",
            kind,
            _logged(requester),
            pending,
            self.gate.wait_s,
            self.gate.queue_per_user,
        )
        return [
            Finding(
                WARNING,
                "spec",
                f"not checked: the admission webhook is busy compiling selectors (at most "
                f"{self.gate.slots} objects at once, {self.gate.per_user} of one requester, "
                f"with {self.gate.queue_per_user} more waiting) and this object's {pending} "
                f"bytes of new selectors could not be compiled within {self.gate.wait_s:g} s; "
                "it is allowed as Kubernetes would allow it (`sharegpu validate` checks it "
                "offline)",
            )
        ]

    def findings(self, kind: str, obj: dict[str, Any]) -> list[Finding]:
        """The checks of one object of ``kind``."""
        if kind == "ResourceClaim":
            return check_resource_claim(
                obj,
                self.driver,
                self.device_classes,
                self.class_configs,
                self.largest_gpu_memory,
            )
        if kind == "ResourceClaimTemplate":
            return check_resource_claim_template(
                obj,
                self.driver,
                self.device_classes,
                self.class_configs,
                self.largest_gpu_memory,
            )
        if kind == "DeviceClass":
            return check_device_class(obj, self.driver)
        return []

    def answer(
        self,
        data: bytes,
        expected_kind: str | None = None,
        *,
        from_api_server: bool = False,
        requester: str | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """The HTTP status and JSON answer for one request body (see the class invariants;
        ``from_api_server`` and ``requester``: see :meth:`review`):
        200 and an AdmissionReview; 400 and ``{"error": ...}`` for a body that is no JSON or
        not an AdmissionReview with a ``request.uid``; 500 and ``{"error": ...}`` when a
        check fails, logged with its traceback so the defect can be found."""
        try:
            body = jsonbody.decode(data)
        except ValueError as exc:  # not JSON, or nested deeper than any API server sends
            return self._refused(f"invalid JSON body: {exc}")
        try:
            return 200, self.review(
                body, expected_kind, from_api_server=from_api_server, requester=requester
            )
        except NotAnAdmissionReview as exc:
            return self._refused(str(exc))
        except Exception:
            # A defect in a check: logged where an operator sees it, answered so the API
            # server applies the webhook's failurePolicy at once instead of a dropped connection.
            log.exception("webhook: reviewing a %s failed", expected_kind or "request")
        self._count(None, "error")
        return 500, {"error": "internal error while reviewing the object"}

    def _quota(
        self,
        request: Mapping[str, Any],
        obj: dict[str, Any],
        what: str,
        response: dict[str, Any],
        result: ReviewResult,
        from_api_server: bool,
    ) -> tuple[dict[str, Any], ReviewResult]:
        """Charge an admitted claim on CREATE to its namespace's GpuQuotas
        (:mod:`controller.quotaadmit`); a claim that does not fit is denied 403 Forbidden with
        the quota, what is used, asked, the limit and what is left. While the GpuQuota CRD is
        not installed the claim is admitted with a warning saying quotas are not enforced.

        Invariant: only a review ``from_api_server`` (its client certificate verified) writes a
        charge; any other is judged as a dry run, so a forged review never changes quota state,
        and is admitted with :func:`~controller.quotaadmit.not_enforced_warning` when a quota
        applies.
        """
        namespace = request.get("namespace")
        if self.quota is None or request.get("operation") != "CREATE":
            return response, result
        if not isinstance(namespace, str) or not namespace:
            return response, result
        dry_run = request.get("dryRun") is True
        if not dry_run:
            self.charging = from_api_server
        if not from_api_server and not dry_run:
            self._note_unauthenticated()
        decision = self.quota.admit(namespace, obj, dry_run=dry_run or not from_api_server)
        warning = decision.warning
        if warning is None and decision.applies and not (from_api_server or dry_run):
            warning = not_enforced_warning(_clip(namespace, 63))
        if warning is not None and decision.denial is None:
            warns = [*response.get("warnings", []), warning][:_MAX_WARNINGS]
            return {**response, "warnings": warns}, "warned"
        if decision.denial is None:
            return response, result
        denied = {
            **response,
            "allowed": False,
            "status": {
                "code": 403,
                "reason": "Forbidden",
                "message": f"{what} is forbidden: {_clip(decision.denial, _MAX_FINDING_CHARS)}",
            },
        }
        return denied, "denied"

    def _note_unauthenticated(self) -> None:
        """Log, once per process, that reviews not tied to the API server are not charged."""
        with self._lock:
            first, self._warned_unauthenticated = not self._warned_unauthenticated, True
        if first:
            log.warning(
                "webhook: a review came without the API server's client certificate; such "
                "reviews are judged against GpuQuotas but never charged (the controller charges "
                "the claims it sees). See docs/security.md to configure client authentication."
            )

    def _refused(self, reason: str) -> tuple[int, dict[str, Any]]:
        log.warning("webhook: refused a body that is not an AdmissionReview: %s", _logged(reason))
        self._count(None, "error")
        return 400, {"error": reason}

    def _count(self, kind: object, result: ReviewResult) -> None:
        if self.metrics is not None:
            self.metrics.review(kind, result)

    def review(
        self,
        body: Any,
        expected_kind: str | None = None,
        *,
        from_api_server: bool = False,
        requester: str | None = None,
    ) -> dict[str, Any]:
        """Answer one AdmissionReview (v1) body (see the class invariants). Only a review
        ``from_api_server`` (the HTTP layer verified the API server's client certificate) may
        charge GpuQuotas; any other is judged against them without a write. Compiles are
        bounded per ``requester`` (None: the review's ``request.userInfo``, see
        :func:`requester_key`).

        Raises :class:`NotAnAdmissionReview` (a ``ValueError``) for a body that is not an
        AdmissionReview with a string ``request.uid``; any other exception is a defect.
        """
        if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
            raise NotAnAdmissionReview("expected an AdmissionReview object")
        request = body.get("request")
        if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
            raise NotAnAdmissionReview("AdmissionReview.request.uid is missing")
        uid: str = request["uid"]
        version = body.get("apiVersion")
        if version is None:  # null is an absent field
            version = REVIEW_VERSIONS[0]
        malformed = _request_problems(request)
        if version not in REVIEW_VERSIONS:
            malformed.insert(
                0,
                Finding(
                    ERROR,
                    "apiVersion",
                    _not_one_of(REVIEW_VERSIONS, version),
                    malformed=True,
                ),
            )
            version = REVIEW_VERSIONS[0]
        gvk = request.get("kind")
        kind = gvk.get("kind") if isinstance(gvk, Mapping) else None
        obj = request.get("object")
        if malformed:
            response, result = review_response(uid, malformed, "AdmissionReview")
        elif request.get("operation") == "DELETE":
            response, result = {"uid": uid, "allowed": True}, "allowed"
        elif expected_kind is not None and kind != expected_kind:
            response, result = {"uid": uid, "allowed": True}, "allowed"
            log.warning(
                "webhook: %s sent to the %s endpoint; allowed", _logged(str(kind)), expected_kind
            )
        elif kind not in REVIEWED_KINDS:
            response, result = {"uid": uid, "allowed": True}, "allowed"
        elif not isinstance(obj, dict):
            malformed = [
                Finding(
                    ERROR,
                    "request.object",
                    f"must be an object, got {json_type(obj)}",
                    malformed=True,
                )
            ]
            response, result = review_response(uid, malformed, str(kind))
        else:
            who = requester if requester is not None else requester_key(request)
            found = self.bounded_findings(str(kind), obj, who)
            malformed = [f for f in found if f.malformed]
            what = _described(str(kind), request, obj)
            response, result = review_response(uid, found, what)
            if response["allowed"] and kind == "ResourceClaim":
                response, result = self._quota(
                    request, obj, what, response, result, from_api_server
                )
        if malformed:
            more = f" (and {len(malformed) - 1} more)" if len(malformed) > 1 else ""
            log.warning(
                "webhook: denied a malformed review %s: %s%s",
                _logged(uid),
                _logged(str(malformed[0])),
                more,
            )
        self._count(kind, result)
        return {"apiVersion": version, "kind": "AdmissionReview", "response": response}


#: The longest user name kept as a requester key (Kubernetes names are far shorter).
_MAX_REQUESTER_CHARS = 512


def requester_key(request: Mapping[str, Any]) -> str:
    """Whom the compile gate counts a review against: ``user <username>`` of the review's
    ``request.userInfo`` (``user `` when absent or not a string; cut to 512 characters).
    Trusted only where the API server is known to have sent the review."""
    info = request.get("userInfo")
    name = info.get("username") if isinstance(info, Mapping) else None
    return "user " + (name[:_MAX_REQUESTER_CHARS] if isinstance(name, str) else "")


def api_server_certificate(sock: Any, client_names: frozenset[str]) -> bool:
    """Whether ``sock`` presented a certificate the client CA verified (the context asks for
    one only with a client CA) carrying one of ``client_names`` (when any)."""
    cert = sock.getpeercert() if isinstance(sock, ssl.SSLSocket) else None
    if not cert:
        return False
    return not client_names or bool(certificate_names(cert) & client_names)


class _Handler(httpserve.BoundedRequestHandler):
    protocol_version = "HTTP/1.1"
    #: Buffer each answer and send it in one segment (no Nagle / delayed-ACK stalls).
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True
    admission: AdmissionHandler
    ready: Callable[[], bool]
    #: Names (subject CN or DNS SAN) a client certificate must carry; empty: any the CA signed.
    client_names: frozenset[str]
    #: Whether a client CA is configured (so a review without its certificate is not the API
    #: server's, and its ``userInfo`` is not believed).
    verifies_clients: bool

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
        from_api_server = api_server_certificate(self.connection, self.client_names)
        # A review the API server is not known to have sent is counted against its address.
        requester = None if from_api_server or not self.verifies_clients else self._peer()
        code, answer = self.admission.answer(
            self.body, expected, from_api_server=from_api_server, requester=requester
        )
        self._send(code, json.dumps(answer, separators=(",", ":")).encode())

    def _peer(self) -> str:
        address = self.client_address
        return "peer " + (str(address[0]) if isinstance(address, tuple) else "")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("webhook %s", format % args)


def certificate_names(cert: Mapping[str, Any]) -> frozenset[str]:
    """The subject common names and DNS subject alternative names of a verified peer
    certificate (as ``ssl.SSLSocket.getpeercert`` decodes it)."""
    found: set[str] = set()
    for rdn in cert.get("subject") or ():
        found.update(value for key, value in rdn if key == "commonName")
    found.update(value for key, value in cert.get("subjectAltName") or () if key == "DNS")
    return frozenset(found)


class WebhookServer(httpserve.BoundedHTTPServer):
    """HTTPS server for :class:`AdmissionHandler`; TLS per connection from the reloader.

    A bounded server (:mod:`sharegpu.kube.httpserve`, ``limits`` default
    ``httpserve.DEFAULT_LIMITS`` with bodies up to 3 MiB, a review read in full within 4 s and
    one peer address holding at most half the slots): each connection does its TLS handshake
    in its own thread under the request deadline, so a client that never finishes one holds
    neither the accept loop nor a thread past the deadline; a slow head or body is evicted at
    the cap or cut by the minimum body rate. ``start()`` serves in a daemon
    thread, ``stop()`` stops serving and closes the socket, ``port`` is the bound port.
    With a client CA in ``certificates``, a review whose client certificate that CA verified
    (and, when ``client_names`` is not empty, names one of them) is from the API server and may
    charge GpuQuotas; every other review is judged without charging. Such a connection, once
    its handshake is done, is served from a pool of its own (``max_trusted_connections``, 256)
    that the per-peer cap never touches, and its reviews' compiles are counted against their
    ``request.userInfo`` user (:mod:`controller.checkgate`); every other connection stays
    capped per address and its compiles are counted against its address (without a client CA
    against the ``userInfo`` user, which the API server's own address shares).
    """

    def __init__(
        self,
        address: str,
        admission: AdmissionHandler,
        certificates: CertificateReloader,
        limits: httpserve.ServerLimits | None = None,
        client_names: Iterable[str] = (),
    ) -> None:
        self.certificates = certificates
        names = frozenset(client_names)
        verifies = certificates.client_ca_file is not None
        handler = type(
            "WebhookHandler",
            (_Handler,),
            {
                "admission": admission,
                "ready": staticmethod(lambda: True),
                "client_names": names,
                "verifies_clients": verifies,
            },
        )
        if limits is None:
            base = httpserve.DEFAULT_LIMITS
            limits = dataclasses.replace(
                base,
                max_body_bytes=_MAX_BODY,
                request_timeout_s=min(base.request_timeout_s, _REQUEST_TIMEOUT_S),
                max_connections_per_peer=base.max_connections // 2,
            )
        super().__init__(
            parse_address(address),
            handler,
            limits,
            tls_context=certificates.context,
            trusted=(lambda sock: api_server_certificate(sock, names)) if verifies else None,
            name="webhook-https",
        )
