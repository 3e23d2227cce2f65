"""OpenTelemetry set-up shared by the controller and the kubelet plugin.

:class:`Telemetry` owns one ``MeterProvider`` whose metrics are exported for Prometheus through a
private ``prometheus_client`` registry (so several instances in one process never clash), and,
only when the standard ``OTEL_*`` variables ask for spans, one ``TracerProvider`` that exports
them (otherwise ``tracer`` is OpenTelemetry's no-op tracer, ``tracing_enabled`` is false, and
the tracing SDK is not even imported; callers on hot paths skip their spans then):

- ``OTEL_TRACES_EXPORTER``: ``otlp`` (default when an OTLP endpoint is set), ``console`` or
  ``none``;
- ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``: where OTLP goes
  (the exporter package reads these and the other ``OTEL_EXPORTER_OTLP_*`` variables itself).

If OTLP is asked for but ``opentelemetry-exporter-otlp`` is not installed, one warning is logged
and spans are dropped. :func:`serve_metrics` serves ``/metrics`` for a :class:`Telemetry`.

Usage::

    telemetry = Telemetry("sharegpu-kubeletplugin")
    prepare_seconds = telemetry.meter.create_histogram("sharegpu_prepare_duration", unit="s")
    with telemetry.tracer.start_as_current_span("prepare"):
        ...
    server = serve_metrics(telemetry, "127.0.0.1:8080")
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NoOpTracer, Tracer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sharegpu.kube.httpserve import BoundedHTTPServer, BoundedRequestHandler, ServerLimits

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger(__name__)

#: Histogram bucket boundaries for durations in seconds (1 ms to 10 s).
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_warned_missing_otlp = False
_warn_lock = threading.Lock()


def _warn_once(message: str) -> None:
    global _warned_missing_otlp
    with _warn_lock:
        if not _warned_missing_otlp:
            _warned_missing_otlp = True
            log.warning(message)


def span_exporter_from_env(env: Mapping[str, str] | None = None) -> SpanExporter | None:
    """The span exporter the ``OTEL_*`` variables ask for, or None when tracing is off."""
    env = os.environ if env is None else env
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    choice = env.get("OTEL_TRACES_EXPORTER", "otlp" if endpoint else "none").strip().lower()
    if choice in ("", "none"):
        return None
    if choice == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if choice != "otlp":
        _warn_once(f"OTEL_TRACES_EXPORTER={choice!r} is not supported (use otlp, console or none)")
        return None
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    module = (
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"
        if protocol == "grpc"
        else "opentelemetry.exporter.otlp.proto.http.trace_exporter"
    )
    try:
        exporter_module = __import__(module, fromlist=["OTLPSpanExporter"])
    except ImportError:
        _warn_once(
            "traces requested through OTEL_* variables but the OTLP exporter is not installed "
            "(pip install opentelemetry-exporter-otlp); spans are dropped"
        )
        return None
    exporter: SpanExporter = exporter_module.OTLPSpanExporter()
    return exporter


class Telemetry:
    """Meter and tracer of one component, with its own Prometheus registry."""

    def __init__(self, service_name: str, env: Mapping[str, str] | None = None) -> None:
        resource = Resource.create({"service.name": service_name})
        self.registry = CollectorRegistry()
        self._reader = PrometheusMetricReader(
            registry=self.registry, disable_target_info=True, scope_info_enabled=False
        )
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[self._reader])
        self.meter: Meter = self.meter_provider.get_meter(service_name)
        exporter = span_exporter_from_env(env)
        #: True when spans are exported; without it ``tracer`` is a no-op tracer.
        self.tracing_enabled = exporter is not None
        self.tracer_provider: TracerProvider | None = None
        self.tracer: Tracer = NoOpTracer()
        if exporter is not None:
            self.tracer_provider = _exporting_provider(resource, exporter)
            self.tracer = self.tracer_provider.get_tracer(service_name)

    def scrape(self) -> bytes:
        """The current metrics in Prometheus text format."""
        return generate_latest(self.registry)

    def shutdown(self) -> None:
        """Flush spans and release the registry."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def _exporting_provider(resource: Resource, exporter: SpanExporter) -> TracerProvider:
    """A TracerProvider that sends every span to ``exporter`` (the console one span by span,
    the others in batches)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    provider = TracerProvider(resource=resource)
    provider.add_span_processor(
        SimpleSpanProcessor(exporter)
        if isinstance(exporter, ConsoleSpanExporter)
        else BatchSpanProcessor(exporter)
    )
    return provider


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` (``:8080`` means all interfaces) -> ``(host, port)``.

    Raises ValueError naming the address when it is malformed.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"invalid address {address!r}: expected HOST:PORT, e.g. 0.0.0.0:8080")
    return (host.strip("[]") or "0.0.0.0", int(port))


class _MetricsHandler(BoundedRequestHandler):
    telemetry: Telemetry
    healthy: Callable[[], bool]

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == "/metrics":
            body = self.telemetry.scrape()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        elif self.path == "/healthz":
            ok = self.healthy()
            body = b"ok\n" if ok else b"unhealthy: the daemon does not answer its own check\n"
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "text/plain")
        else:
            body = b"not found\n"
            self.send_response(404)
            self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("metrics %s", format % args)


def serve_metrics(
    telemetry: Telemetry,
    address: str,
    limits: ServerLimits | None = None,
    healthy: Callable[[], bool] | None = None,
) -> BoundedHTTPServer:
    """Serve ``/metrics`` on ``address`` in a daemon thread; stop it with ``shutdown()`` and
    ``server_close()`` (or ``stop()``). ``/healthz`` answers 200 while ``healthy()`` (default:
    always) is true, else 503: a liveness probe for the daemon.

    The server is a :class:`~sharegpu.kube.httpserve.BoundedHTTPServer` (``limits``, default
    ``httpserve.DEFAULT_LIMITS``): a bounded number of connections, each cut when its request
    is not read within the deadline. The bound port is ``server.port`` (useful with port 0).
    """
    handler = type(
        "MetricsHandler",
        (_MetricsHandler,),
        {"telemetry": telemetry, "healthy": staticmethod(healthy or (lambda: True))},
    )
    return BoundedHTTPServer(parse_address(address), handler, limits, name="metrics-http").start()
