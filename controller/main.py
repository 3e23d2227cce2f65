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

import logging
import ssl
from collections.abc import Callable

from controller.apiauth import KubeAuthorizer
from controller.config import (
    API_AUTH_KUBERNETES,
    ControllerConfig,
    build_parser,
    config_from_args,
)
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
from sharegpu.kube.logs import configure_logging
from sharegpu.kube.rest import KubeApiError, KubeConfigError, KubeRest, load_api_client
from sharegpu.kube.telemetry import Telemetry, serve_metrics

log = logging.getLogger("controller")

#: Seconds one API request of the tracker or the leader election may take (lists are paged).
REQUEST_TIMEOUT_S = 30.0


def _unknown(_namespace: str) -> bool | None:
    """No quota cache: whether a namespace has GpuQuotas is unknown (ask the API server)."""
    return None


def _closer(server: BoundedHTTPServer) -> Callable[[], None]:
    def close() -> None:
        server.shutdown()
        server.server_close()

    return close


class Controller:
    """The running components; :meth:`stop` tears them down in reverse order.

    :meth:`start` runs its steps in this order: load the JSON API's certificate, connect to the
    API server, build the tracking (leader election, tracker, GpuQuota statuses), serve
    ``/metrics``, the webhook, the JSON API and the probes, then start the tracking components.
    """

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
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

        Raises KubeConfigError, KubeApiError, OSError, ValueError or ssl.SSLError.
        """
        api_certs = self._api_certificates()
        kube = self._connect() if self.config.tracker else None
        if kube is not None:
            self._build_tracking(kube)
        self._serve_metrics()
        if self.config.webhook:
            self._serve_webhook(kube)
        self._serve_api(kube, api_certs)
        self._serve_probes()
        self._start_tracking()

    def _api_certificates(self) -> CertificateReloader | None:
        """The JSON API's certificate (``--api-tls-cert-file``), loaded now; None: plain HTTP."""
        c = self.config
        return (
            CertificateReloader(c.api_tls_cert_file, c.api_tls_key_file)
            if c.api_tls_cert_file
            else None
        )

    def _connect(self) -> KubeRest:
        """The API client of the tracker, the quotas and the lease (closed last: they still use
        it while they stop)."""
        api_client = load_api_client(self.config.kubeconfig)
        self.lifecycle.running("API client", api_client.close)
        return KubeRest(api_client, on_error=self.metrics.api_error, timeout_s=REQUEST_TIMEOUT_S)

    def _build_tracking(self, kube: KubeRest) -> None:
        """The leader election (``--leader-elect``), the tracker of the GPU objects and the
        GpuQuota statuses, with their metrics and the charge basis; started by
        :meth:`_start_tracking`."""
        c = self.config
        is_leader: Callable[[], bool] = lambda: True  # noqa: E731
        if c.leader_elect:
            self.elector = LeaderElector(kube, c.lease_namespace, c.lease_name)
            is_leader = lambda: self.elector is not None and self.elector.is_leader  # noqa: E731
        tracker = self.tracker = Tracker(
            kube,
            c.driver_name,
            metrics=self.metrics,
            is_leader=is_leader,
            tracer=self.telemetry.tracer,
            idle=c.idle_policy,
        )
        self.metrics.set_gpu_source(tracker.gauges)
        self.metrics.set_idle_source(tracker.idle_gauges)
        self.quota_basis = lambda: basis_of(
            (g.node, g.memory_capacity, g.min_share_cores) for g in tracker.gauges()
        )
        self.quotas = QuotaController(
            kube,
            c.driver_name,
            classes=c.device_classes,
            basis=self.quota_basis,
            is_leader=is_leader,
        )
        self.metrics.set_quota_source(self.quotas.gauges)

    def _serve_metrics(self) -> None:
        """``/metrics`` on ``--metrics-address`` (empty: off)."""
        if not self.config.metrics_address:
            return
        server = self.metrics_server = serve_metrics(self.telemetry, self.config.metrics_address)
        self.lifecycle.running("metrics server", _closer(server))
        log.info("metrics on http://%s:%d/metrics", *server.server_address[:2])

    def _quota_admitter(self, kube: KubeRest) -> QuotaAdmitter:
        """What charges GpuQuotas at admission, with the quota controller's caches when it
        runs."""
        c, quotas = self.config, self.quotas
        admitter = QuotaAdmitter(
            kube,
            c.driver_name,
            c.device_classes,
            self.quota_basis,
            has_quotas=quotas.namespace_has_quotas if quotas is not None else _unknown,
            known_classes=quotas.driver_classes if quotas is not None else frozenset,
        )
        self.metrics.set_quota_crd_source(admitter.crd_served)
        if not c.webhook_client_ca_file:
            log.warning(
                "GpuQuotas are NOT enforced at admission: --webhook-client-ca-file is not "
                "set, so the webhook cannot tell the API server's reviews from forged "
                "ones and charges none; claims are judged against the quotas and charged "
                "when they appear, so claims created at the same time can together exceed "
                "a quota (metric sharegpu_quota_admission_enforced 0; see "
                "docs/security.md, webhook client authentication)"
            )
        return admitter

    def _serve_webhook(self, kube: KubeRest | None) -> None:
        """The admission webhook (HTTPS), charging GpuQuotas when the API server is reached."""
        c = self.config
        certs = CertificateReloader(
            c.tls_cert_file, c.tls_key_file, client_ca_file=c.webhook_client_ca_file
        )
        admitter = self._quota_admitter(kube) if kube is not None else None
        quotas = self.quotas
        admission = AdmissionHandler(
            c.driver_name,
            self.metrics,
            c.device_classes,
            admitter,
            class_configs=quotas.class_configs if quotas is not None else None,
            largest_gpu_memory=lambda: self.quota_basis().largest_memory or None,
        )
        if admitter is not None:
            verifies = bool(c.webhook_client_ca_file)
            self.metrics.set_quota_admission_source(
                lambda: verifies and admission.charging is not False
            )
        self.webhook = WebhookServer(
            c.webhook_address, admission, certs, client_names=c.webhook_client_names
        ).start()
        self.lifecycle.running("webhook", self.webhook.stop)
        log.info("webhook on https://%s:%d", *self.webhook.server_address[:2])

    def _ready(self) -> Callable[[], bool]:
        """Readiness: the tracker has synced (always ready without one)."""
        tracker = self.tracker
        return tracker.synced if tracker is not None else (lambda: True)

    def _serve_api(self, kube: KubeRest | None, certs: CertificateReloader | None) -> None:
        """The JSON API and the probes on ``--api-address`` (empty: off)."""
        c, tracker = self.config, self.tracker
        if not c.api_address:
            return
        # Without the tracker the API serves no data (503), so it needs no authorizer.
        authorizer = (
            KubeAuthorizer(kube, audience=c.api_token_audience)
            if kube is not None and c.api_auth == API_AUTH_KUBERNETES
            else None
        )
        api = self.api_server = serve_api(
            c.api_address,
            tracker.manifests if tracker else None,
            self._ready(),
            authorizer=authorizer,
            tls_context=certs.context if certs is not None else None,
        )
        self.lifecycle.running("JSON API", _closer(api))
        scheme = "https" if certs is not None else "http"
        log.info("JSON API on %s://%s:%d/api/v1/gpus", scheme, *api.server_address[:2])

    def _serve_probes(self) -> None:
        """``/healthz`` and ``/readyz`` alone on ``--probe-address`` (empty: off)."""
        if not self.config.probe_address:
            return
        probes = self.probe_server = serve_probes(self.config.probe_address, self._ready())
        self.lifecycle.running("probes", _closer(probes))
        log.info("probes on http://%s:%d/healthz", *probes.server_address[:2])

    def _start_tracking(self) -> None:
        """Start the leader election, the tracker and the quota controller, in this order."""
        for component in (self.elector, self.tracker, self.quotas):
            if component is not None:
                self.lifecycle.add(component)
        self.lifecycle.start()
        if self.tracker is not None:
            log.info("tracking GPUs of driver %s", self.config.driver_name)

    def stop(self) -> None:
        """Stop in reverse start order (idempotent, never raises)."""
        self.lifecycle.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the controller until SIGTERM/SIGINT; returns the process exit code."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    try:
        controller = Controller(config_from_args(args))
        controller.lifecycle.run(start=controller.start)
    except (KubeConfigError, KubeApiError, OSError, ValueError, ssl.SSLError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    log.info("stopped")
    return 0
