"""Entry point of ``sharegpu-controller`` (also ``python -m controller``).

Runs, in one process: the admission webhook (HTTPS), the tracker that keeps the ``GPU``
objects (with optional leader election), the read-only JSON API (also the health probes) and
the Prometheus ``/metrics`` endpoint. The three servers listen on 127.0.0.1 unless their
address flags say otherwise (the chart passes the pod IP); each is a bounded server
(:mod:`sharegpu.kube.httpserve`): a capped number of connections, each cut when its request is
not read within the deadline. SIGTERM or SIGINT stops everything cleanly (a leader releases its
lease first). Expected failures (bad flags, unreadable kubeconfig or certificates, ports in use)
end with a one-line error and exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
from collections.abc import Callable
from typing import Final

from api.names import CONTROLLER_LEASE_NAME, DEFAULT_DRIVER_NAME
from api.version import VERSION
from controller.apiauth import DEFAULT_AUDIENCE, KubeAuthorizer
from controller.httpapi import serve_api, serve_probes
from controller.metrics import ControllerMetrics
from controller.quotaadmit import QuotaAdmitter
from controller.quotacharge import ChargeBasis, basis_of
from controller.quotacontroller import QuotaController
from controller.tracker import Tracker
from controller.webhook import AdmissionHandler, CertificateReloader, WebhookServer
from sharegpu.kube.httpserve import BoundedHTTPServer
from sharegpu.kube.leader import LeaderElector
from sharegpu.kube.lifecycle import Lifecycle
from sharegpu.kube.logs import LOG_FORMATS, LOG_LEVELS, configure_logging
from sharegpu.kube.rest import KubeApiError, KubeConfigError, KubeRest, load_api_client
from sharegpu.kube.telemetry import Telemetry, parse_address, serve_metrics

log = logging.getLogger("controller")

API_AUTH_KUBERNETES: Final = "kubernetes"
API_AUTH_NONE: Final = "none"
API_AUTH_MODES: Final = (API_AUTH_KUBERNETES, API_AUTH_NONE)

#: Seconds one API request of the tracker or the leader election may take (lists are paged).
REQUEST_TIMEOUT_S = 30.0


def _unknown(_namespace: str) -> bool | None:
    """No quota cache: whether a namespace has GpuQuotas is unknown (ask the API server)."""
    return None


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false (got {text!r})")


def _address(text: str) -> str:
    if text:
        try:
            parse_address(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of the controller."""
    p = argparse.ArgumentParser(
        prog="sharegpu-controller",
        description="sharegpu controller: admission webhook, per-GPU allocation tracking "
        "(GPU objects), JSON API and Prometheus metrics.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    env = os.environ.get
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (else $KUBECONFIG, else the in-cluster configuration)",
    )
    p.add_argument(
        "--driver-name",
        default=env("DRIVER_NAME", DEFAULT_DRIVER_NAME),
        help="DRA driver name (env DRIVER_NAME; default %(default)s)",
    )
    p.add_argument(
        "--webhook-address",
        type=_address,
        default="127.0.0.1:8443",
        help="HTTPS address of the admission webhook; the API server must reach it, e.g. "
        "$(POD_IP):8443 (default %(default)s)",
    )
    p.add_argument(
        "--tls-cert-file",
        default="",
        help="webhook serving certificate (PEM); reloaded when it changes",
    )
    p.add_argument("--tls-key-file", default="", help="webhook private key (PEM)")
    p.add_argument(
        "--webhook-client-ca-file",
        default="",
        help="CA bundle (PEM) that signs the API server's webhook client certificate; reviews "
        "whose client certificate it verifies may charge GpuQuotas, every other review is "
        "judged without charging (empty: no review charges; see docs/security.md)",
    )
    p.add_argument(
        "--webhook-client-name",
        action="append",
        default=[],
        metavar="NAME",
        help="a name (subject CN or DNS SAN) the API server's client certificate must carry "
        "(repeatable; none: any certificate the client CA signed)",
    )
    p.add_argument(
        "--device-class",
        action="append",
        default=[],
        metavar="NAME",
        help="DeviceClass of this driver whose requests are checked (repeatable; "
        "classes named like the driver always are)",
    )
    p.add_argument(
        "--metrics-address",
        type=_address,
        default="127.0.0.1:9401",
        help="address of /metrics (empty: off; default %(default)s)",
    )
    p.add_argument(
        "--api-address",
        type=_address,
        default="127.0.0.1:8080",
        help="address of the JSON API and /healthz, /readyz (empty: off; default %(default)s)",
    )
    p.add_argument(
        "--api-auth",
        choices=API_AUTH_MODES,
        default=API_AUTH_KUBERNETES,
        help="who may read the JSON API: kubernetes (a bearer token whose user may list GPU "
        "objects, checked with TokenReview and SubjectAccessReview) or none (anyone who can "
        "connect; for an API bound to 127.0.0.1); the probes never need credentials "
        "(default %(default)s)",
    )
    p.add_argument(
        "--api-token-audience",
        default=DEFAULT_AUDIENCE,
        help="the audience the JSON API's bearer tokens must be bound to (kubectl create token "
        "SA --audience ...; default %(default)s)",
    )
    p.add_argument(
        "--api-tls-cert-file",
        default="",
        help="serve the JSON API over HTTPS with this certificate (PEM; reloaded when it "
        "changes); empty: plain HTTP, for an API bound to 127.0.0.1",
    )
    p.add_argument("--api-tls-key-file", default="", help="private key of --api-tls-cert-file")
    p.add_argument(
        "--probe-address",
        type=_address,
        default="",
        help="address of a plain-HTTP port serving only /healthz and /readyz, off the JSON "
        "API's authenticated path (empty: off; the probes are also on the API port)",
    )
    p.add_argument(
        "--leader-elect",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="elect one writing replica with a Lease (default %(default)s)",
    )
    p.add_argument(
        "--lease-namespace",
        default=env("POD_NAMESPACE", "default"),
        help="namespace of the Lease (env POD_NAMESPACE; default %(default)s)",
    )
    p.add_argument(
        "--lease-name",
        default=CONTROLLER_LEASE_NAME,
        help="name of the Lease (default %(default)s)",
    )
    p.add_argument("--log-format", choices=LOG_FORMATS, default="text")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    p.add_argument("--disable-webhook", action="store_true", help="do not serve the webhook")
    p.add_argument(
        "--disable-tracker",
        action="store_true",
        help="do not track GPUs (no API access needed then)",
    )
    return p


def _closer(server: BoundedHTTPServer) -> Callable[[], None]:
    def close() -> None:
        server.shutdown()
        server.server_close()

    return close


class Controller:
    """The running components; :meth:`stop` tears them down in reverse order."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.telemetry = Telemetry("sharegpu-controller")
        self.metrics = ControllerMetrics(self.telemetry)
        #: Reverse stop order: the tracker (and its writes) stops before the lease is released,
        #: so a standby that takes the lease over never writes beside it; the API client and
        #: the telemetry close last.
        self.lifecycle = Lifecycle()
        self.lifecycle.running("telemetry", self.telemetry.shutdown)
        self.tracker: Tracker | None = None
        self.elector: LeaderElector | None = None
        self.webhook: WebhookServer | None = None
        self.metrics_server: BoundedHTTPServer | None = None
        self.api_server: BoundedHTTPServer | None = None
        self.probe_server: BoundedHTTPServer | None = None
        #: GpuQuota statuses (with the tracker) and the charge basis from the tracker's GPUs.
        self.quotas: QuotaController | None = None
        self.quota_basis: Callable[[], ChargeBasis] = ChargeBasis

    def start(self) -> None:
        """Start every enabled component.

        Raises KubeConfigError, KubeApiError, OSError or ValueError.
        """
        a = self.args
        if not a.disable_webhook and not (a.tls_cert_file and a.tls_key_file):
            raise ValueError(
                "the webhook needs --tls-cert-file and --tls-key-file (or --disable-webhook)"
            )
        if bool(a.api_tls_cert_file) != bool(a.api_tls_key_file):
            raise ValueError("--api-tls-cert-file and --api-tls-key-file go together")
        api_certs = (
            CertificateReloader(a.api_tls_cert_file, a.api_tls_key_file)
            if a.api_tls_cert_file
            else None
        )
        kube: KubeRest | None = None
        if not a.disable_tracker:
            api_client = load_api_client(a.kubeconfig)
            # Closed last: the tracker and the lease still use it while they stop.
            self.lifecycle.running("API client", api_client.close)
            kube = KubeRest(
                api_client, on_error=self.metrics.api_error, timeout_s=REQUEST_TIMEOUT_S
            )
        if not a.disable_tracker and kube is not None:
            is_leader: Callable[[], bool] = lambda: True  # noqa: E731
            if a.leader_elect:
                self.elector = LeaderElector(kube, a.lease_namespace, a.lease_name)
                is_leader = lambda: self.elector is not None and self.elector.is_leader  # noqa: E731
            self.tracker = Tracker(
                kube,
                a.driver_name,
                metrics=self.metrics,
                is_leader=is_leader,
                tracer=self.telemetry.tracer,
            )
            self.metrics.set_gpu_source(self.tracker.gauges)
            tracker_now = self.tracker
            self.quota_basis = lambda: basis_of(
                (g.node, g.memory_capacity, g.min_share_cores) for g in tracker_now.gauges()
            )
            self.quotas = QuotaController(
                kube,
                a.driver_name,
                classes=a.device_class,
                basis=self.quota_basis,
                is_leader=is_leader,
            )
            self.metrics.set_quota_source(self.quotas.gauges)
        if a.metrics_address:
            server = self.metrics_server = serve_metrics(self.telemetry, a.metrics_address)
            self.lifecycle.running("metrics server", _closer(server))
            log.info("metrics on http://%s:%d/metrics", *server.server_address[:2])
        if not a.disable_webhook:
            certs = CertificateReloader(
                a.tls_cert_file, a.tls_key_file, client_ca_file=a.webhook_client_ca_file
            )
            quotas = self.quotas
            admitter = (
                QuotaAdmitter(
                    kube,
                    a.driver_name,
                    a.device_class,
                    self.quota_basis,
                    has_quotas=quotas.namespace_has_quotas if quotas is not None else _unknown,
                    known_classes=quotas.driver_classes if quotas is not None else frozenset,
                )
                if kube is not None
                else None
            )
            if admitter is not None:
                self.metrics.set_quota_crd_source(admitter.crd_served)
                if not a.webhook_client_ca_file:
                    log.warning(
                        "GpuQuotas are NOT enforced at admission: --webhook-client-ca-file is not "
                        "set, so the webhook cannot tell the API server's reviews from forged "
                        "ones and charges none; claims are judged against the quotas and charged "
                        "when they appear, so claims created at the same time can together exceed "
                        "a quota (metric sharegpu_quota_admission_enforced 0; see "
                        "docs/security.md, webhook client authentication)"
                    )
            admission = AdmissionHandler(
                a.driver_name,
                self.metrics,
                a.device_class,
                admitter,
                class_configs=quotas.class_configs if quotas is not None else None,
                largest_gpu_memory=lambda: self.quota_basis().largest_memory or None,
            )
            if admitter is not None:
                verifies = bool(a.webhook_client_ca_file)
                self.metrics.set_quota_admission_source(
                    lambda: verifies and admission.charging is not False
                )
            self.webhook = WebhookServer(
                a.webhook_address, admission, certs, client_names=a.webhook_client_name
            ).start()
            self.lifecycle.running("webhook", self.webhook.stop)
            log.info("webhook on https://%s:%d", *self.webhook.server_address[:2])
        tracker = self.tracker
        if a.api_address:
            ready = tracker.synced if tracker is not None else (lambda: True)
            # Without the tracker the API serves no data (503), so it needs no authorizer.
            authorizer = (
                KubeAuthorizer(kube, audience=a.api_token_audience)
                if kube is not None and a.api_auth == API_AUTH_KUBERNETES
                else None
            )
            api = self.api_server = serve_api(
                a.api_address,
                tracker.manifests if tracker else None,
                ready,
                authorizer=authorizer,
                tls_context=api_certs.context if api_certs is not None else None,
            )
            self.lifecycle.running("JSON API", _closer(api))
            scheme = "https" if api_certs is not None else "http"
            log.info("JSON API on %s://%s:%d/api/v1/gpus", scheme, *api.server_address[:2])
        if a.probe_address:
            probes = self.probe_server = serve_probes(
                a.probe_address, tracker.synced if tracker is not None else (lambda: True)
            )
            self.lifecycle.running("probes", _closer(probes))
            log.info("probes on http://%s:%d/healthz", *probes.server_address[:2])
        if self.elector is not None:
            self.lifecycle.add(self.elector)
        if tracker is not None:
            self.lifecycle.add(tracker)
        if self.quotas is not None:
            self.lifecycle.add(self.quotas)
        self.lifecycle.start()
        if tracker is not None:
            log.info("tracking GPUs of driver %s", a.driver_name)

    def stop(self) -> None:
        """Stop in reverse start order (idempotent, never raises)."""
        self.lifecycle.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the controller until SIGTERM/SIGINT; returns the process exit code."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    controller = Controller(args)
    try:
        controller.lifecycle.run(start=controller.start)
    except (KubeConfigError, KubeApiError, OSError, ValueError, ssl.SSLError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    log.info("stopped")
    return 0
