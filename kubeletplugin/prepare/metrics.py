"""Metrics and traces of claim preparation (OpenTelemetry, exported for Prometheus).

Prometheus names (after export):

- ``sharegpu_prepare_duration_seconds{result}``: one claim's prepare, ``result`` ``ok`` or
  ``error`` (a repeated call answered from the checkpoint counts too);
- ``sharegpu_unprepare_duration_seconds{result}``: one claim's unprepare;
- ``sharegpu_prepare_errors_total{reason}``: failed prepares by reason, one of the ``REASON_*``
  names of :mod:`kubeletplugin.prepare.claims` (``not_found``, ``replaced``, ``unallocated``,
  ``conflict``, ``enforcement``, ``io``, ...);
- ``sharegpu_prepared_claims``: claims prepared on the node, observed at scrape time.

Each claim's prepare and unprepare runs in a span (``prepare claim`` / ``unprepare claim``,
attributes ``claim.namespace``, ``claim.name``, ``claim.uid``) when the ``OTEL_*`` variables ask
for spans (see :mod:`sharegpu.kube.telemetry`); otherwise no span is started at all.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from opentelemetry.metrics import CallbackOptions, Histogram, Observation

from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.prepare.claims import REASON_INTERNAL
from sharegpu.kube.telemetry import SECONDS_BUCKETS, Telemetry


class StateMetrics:
    """Instruments of the state module; ``prepared`` is read at each scrape. Without a
    ``telemetry`` nothing is recorded (tests, tools)."""

    def __init__(self, telemetry: Telemetry | None, prepared: Callable[[], int]) -> None:
        self._telemetry = telemetry
        self._prepared = prepared
        if telemetry is None:
            return
        meter = telemetry.meter
        self._prepare = meter.create_histogram(
            "sharegpu_prepare_duration_seconds",
            description="Time to prepare one claim",
            unit="s",
            explicit_bucket_boundaries_advisory=list(SECONDS_BUCKETS),
        )
        self._unprepare = meter.create_histogram(
            "sharegpu_unprepare_duration_seconds",
            description="Time to unprepare one claim",
            unit="s",
            explicit_bucket_boundaries_advisory=list(SECONDS_BUCKETS),
        )
        self._errors = meter.create_counter(
            "sharegpu_prepare_errors", description="Claims that could not be prepared, by reason"
        )
        meter.create_observable_gauge(
            "sharegpu_prepared_claims",
            callbacks=[self._observe_prepared],
            description="Claims prepared on this node",
        )

    def _observe_prepared(self, _: CallbackOptions) -> Iterator[Observation]:
        yield Observation(self._prepared())

    @contextlib.contextmanager
    def prepare(self, ref: ClaimRef) -> Iterator[Callable[[str | None], None]]:
        """Time and trace one claim's prepare; call the yielded function with the failure
        reason (None on success) before leaving."""
        outcome: dict[str, str | None] = {"reason": REASON_INTERNAL}

        def done(reason: str | None) -> None:
            outcome["reason"] = reason

        if self._telemetry is None:
            yield done
            return
        with self._timed(self._prepare, "prepare claim", ref, lambda: outcome["reason"] is None):
            yield done
        if outcome["reason"] is not None:
            self._errors.add(1, {"reason": outcome["reason"]})

    @contextlib.contextmanager
    def unprepare(self, ref: ClaimRef) -> Iterator[Callable[[bool], None]]:
        """Time and trace one claim's unprepare; call the yielded function with success."""
        outcome = {"ok": False}

        def done(ok: bool) -> None:
            outcome["ok"] = ok

        if self._telemetry is None:
            yield done
            return
        with self._timed(self._unprepare, "unprepare claim", ref, lambda: outcome["ok"]):
            yield done

    def _span(self, name: str, ref: ClaimRef) -> contextlib.AbstractContextManager[object]:
        """The claim's span when spans are exported, else nothing (no tracer work at all)."""
        telemetry = self._telemetry
        if telemetry is None or not telemetry.tracing_enabled:
            return contextlib.nullcontext()
        attributes = {
            "claim.namespace": ref.namespace,
            "claim.name": ref.name,
            "claim.uid": ref.uid,
        }
        return telemetry.tracer.start_as_current_span(name, attributes=attributes)

    @contextlib.contextmanager
    def _timed(
        self, histogram: Histogram, span: str, ref: ClaimRef, ok: Callable[[], bool]
    ) -> Iterator[None]:
        assert self._telemetry is not None
        start = time.perf_counter()
        with self._span(span, ref):
            try:
                yield
            finally:
                result = "ok" if ok() else "error"
                histogram.record(time.perf_counter() - start, {"result": result})
