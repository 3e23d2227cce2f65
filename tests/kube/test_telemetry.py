"""sharegpu.kube.telemetry: spans only when something exports them; otherwise a no-op tracer and
no tracing SDK at all."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracer

from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.prepare.metrics import StateMetrics
from sharegpu.kube import telemetry as telemetry_module
from sharegpu.kube.telemetry import Telemetry
from tests.paths import REPO_ROOT

CLAIM = ClaimRef(namespace="ns", uid="0b6a3c1e-6f7d-4a86-9a3f-3c2a7a9b1d10", name="c")


def test_without_an_exporter_the_tracer_is_a_no_op_and_the_sdk_is_not_loaded() -> None:
    code = (
        "import json, sys\n"
        "from sharegpu.kube.telemetry import Telemetry\n"
        "t = Telemetry('x', env={})\n"
        "print(json.dumps([t.tracing_enabled, t.tracer_provider is None, "
        "type(t.tracer).__name__, 'opentelemetry.sdk.trace' in sys.modules]))\n"
        "t.shutdown()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == [False, True, "NoOpTracer", False]


def test_console_traces_get_an_exporting_provider() -> None:
    t = Telemetry("x", env={"OTEL_TRACES_EXPORTER": "console"})
    try:
        assert t.tracing_enabled and t.tracer_provider is not None
        assert not isinstance(t.tracer, NoOpTracer)
    finally:
        t.shutdown()


@pytest.mark.parametrize("exported", [True, False])
def test_claim_spans_only_when_exported(monkeypatch: pytest.MonkeyPatch, exported: bool) -> None:
    spans = InMemorySpanExporter()
    monkeypatch.setattr(
        telemetry_module, "span_exporter_from_env", lambda env=None: spans if exported else None
    )
    t = Telemetry("x", env={})
    try:
        metrics = StateMetrics(t, prepared=lambda: 0)
        with metrics.prepare(CLAIM) as done:
            done(None)
        with metrics.unprepare(CLAIM) as finished:
            finished(True)
        if t.tracer_provider is not None:
            t.tracer_provider.force_flush()
        names = [(s.name, dict(s.attributes or {})) for s in spans.get_finished_spans()]
        expected = {"claim.namespace": "ns", "claim.name": "c", "claim.uid": CLAIM.uid}
        want = [("prepare claim", expected), ("unprepare claim", expected)] if exported else []
        assert names == want
        scraped = t.scrape().decode()
        assert 'sharegpu_prepare_duration_seconds_count{result="ok"} 1.0' in scraped
    finally:
        t.shutdown()
