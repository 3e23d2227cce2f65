"""The Grafana dashboard ``deploy/grafana/sharegpu-dashboard.json``.

Metric names are checked against what the code really exports: the test creates the
controller's and the kubelet plugin's metrics objects on their own :class:`Telemetry`, records one
value of every instrument, scrapes both registries and collects the sample names (so counters
appear with ``_total`` and histograms with ``_bucket``/``_sum``/``_count``, as Prometheus stores
them). A name in an expression is any identifier, outside quoted strings, that starts with
``sharegpu_`` (ours, must be exported) or ``DCGM_`` (NVIDIA's DCGM exporter, must be one of
:data:`DCGM_METRICS`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from controller.idle import IdleShareGauge
from controller.metrics import ControllerMetrics
from controller.reconcile import reconcile
from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.prepare.metrics import StateMetrics
from sharegpu.kube.telemetry import Telemetry
from tests.controller import helpers as h
from tests.paths import DOCS_DIR, REPO_ROOT

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "sharegpu-dashboard.json"
OBSERVABILITY = DOCS_DIR / "observability.md"
#: The DCGM exporter fields the dashboard and the docs join with.
DCGM_METRICS = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"})
#: The dashboard's node filter, removed before comparing with the documented queries.
NODE_FILTER = 'node=~"$node"'

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NAME = re.compile(r"\b(?:sharegpu_|DCGM_)[A-Za-z0-9_:]*")
_SELECTOR = re.compile(r"\b(sharegpu_[A-Za-z0-9_:]*)(\{[^}]*\})?")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s", re.MULTILINE)


def sample_names(telemetry: Telemetry) -> dict[str, set[str]]:
    """Sample name -> label names, from one scrape of ``telemetry``."""
    found: dict[str, set[str]] = {}
    for name, labels in _SAMPLE.findall(telemetry.scrape().decode()):
        keys = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", labels))
        found.setdefault(name, set()).update(keys)
    return found


@pytest.fixture(scope="module")
def exported() -> Iterator[tuple[dict[str, set[str]], dict[str, set[str]]]]:
    """(controller samples, plugin samples) with every instrument recorded once."""
    gpus = reconcile([h.node_slice("n1", 1)], [], [], h.DRIVER)
    controller_telemetry = Telemetry("sharegpu-controller", env={})
    metrics = ControllerMetrics(controller_telemetry, lambda: gpus.values())
    metrics.review("ResourceClaim", "allowed")
    metrics.api_error("get", "resourceclaims", 500)
    metrics.reconcile_duration.record(0.01)
    metrics.set_idle_source(lambda: [IdleShareGauge("ml", "c1", "p1", "n1-gpu-0", 3600.0)])
    plugin_telemetry = Telemetry("sharegpu-kubeletplugin", env={})
    state = StateMetrics(plugin_telemetry, lambda: 1)
    ref = ClaimRef(namespace="default", uid="u1", name="c1")
    with state.prepare(ref) as done:
        done("conflict")
    with state.unprepare(ref) as finished:
        finished(True)
    yield sample_names(controller_telemetry), sample_names(plugin_telemetry)
    controller_telemetry.shutdown()
    plugin_telemetry.shutdown()


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def expressions() -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and variable queries."""
    exprs = [t["expr"] for p in panels() for t in p["targets"]]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["definition"])
    return exprs


def metric_names(expr: str) -> set[str]:
    return set(_NAME.findall(_STRING.sub('""', expr)))


def normalized(expr: str) -> str:
    """``expr`` without the dashboard's node filter, with whitespace collapsed."""
    text = expr.replace("{" + NODE_FILTER + "}", "").replace(NODE_FILTER, "")
    return " ".join(text.split())


def test_exported_names_look_like_prometheus_names(
    exported: tuple[dict[str, set[str]], dict[str, set[str]]],
) -> None:
    controller, plugin = exported
    assert "sharegpu_webhook_reviews_total" in controller
    assert "sharegpu_gpu_memory_allocated_bytes" in controller
    assert "sharegpu_prepare_duration_seconds_bucket" in plugin
    assert "sharegpu_prepare_errors_total" in plugin


def test_every_metric_in_the_dashboard_is_exported(
    exported: tuple[dict[str, set[str]], dict[str, set[str]]],
) -> None:
    known = set(exported[0]) | set(exported[1]) | DCGM_METRICS
    problems = [(name, e) for e in expressions() for name in metric_names(e) if name not in known]
    assert problems == []
    assert all(any(n.startswith("sharegpu_") for n in metric_names(e)) for e in expressions())


def test_the_dashboard_covers_every_exported_metric(
    exported: tuple[dict[str, set[str]], dict[str, set[str]]],
) -> None:
    """Each metric family (histograms by their buckets or counts) appears in some panel."""
    used = {n for e in expressions() for n in metric_names(e)}
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in set(exported[0]) | set(exported[1])}
    missing = [f for f in families if not any(u.startswith(f) for u in used)]
    assert missing == []


def test_node_filtered_series_use_the_node_variable(
    exported: tuple[dict[str, set[str]], dict[str, set[str]]],
) -> None:
    """Series that have a ``node`` label (the controller's per-GPU gauges, and the plugin's, which
    the chart's monitors label with the pod's node) are filtered by ``$node`` in panels."""
    controller, plugin = exported
    with_node = {n for n, labels in controller.items() if "node" in labels} | set(plugin)
    problems = [
        (name, p["title"])
        for p in panels()
        for t in p["targets"]
        for name, matchers in _SELECTOR.findall(t["expr"])
        if name in with_node and NODE_FILTER not in matchers
    ]
    assert problems == []


def test_the_idle_share_panel_keeps_the_metric_labels(
    exported: tuple[dict[str, set[str]], dict[str, set[str]]],
) -> None:
    """The idle shares are shown by namespace, claim and pod: labels the metric carries."""
    (panel,) = [p for p in panels() if "sharegpu_share_idle_seconds" in p["targets"][0]["expr"]]
    (target,) = panel["targets"]
    grouped = re.search(r"by \(([^)]*)\)", target["expr"])
    assert grouped is not None
    labels = {label.strip() for label in grouped.group(1).split(",")}
    assert {"namespace", "claim", "pod"} <= labels <= exported[0]["sharegpu_share_idle_seconds"]


def test_dashboard_has_grafana_shape() -> None:
    data = dashboard()
    assert data["title"] and data["uid"] and isinstance(data["schemaVersion"], int)
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["node"]["type"] == "query"
    assert variables["node"]["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    for panel in data["panels"]:
        grid = panel["gridPos"]
        assert set(grid) == {"x", "y", "w", "h"} and grid["x"] + grid["w"] <= 24
    for panel in panels():
        assert panel["title"] and panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["datasource"]["uid"] == "${datasource}"


def test_expressions_have_balanced_brackets() -> None:
    pairs = {")": "(", "]": "[", "}": "{"}
    for expr in expressions():
        stack: list[str] = []
        for char in _STRING.sub('""', expr):
            if char in "([{":
                stack.append(char)
            elif char in pairs:
                assert stack and stack.pop() == pairs[char], expr
        assert stack == [], expr


def documented_dcgm_queries() -> list[str]:
    """The queries of the ``promql`` block that mentions DCGM in docs/observability.md, split
    at blank lines, comments dropped."""
    blocks = re.findall(r"```promql\n(.*?)```", OBSERVABILITY.read_text(), re.DOTALL)
    (block,) = [b for b in blocks if "DCGM_" in b]
    queries = []
    for chunk in re.split(r"\n\s*\n", block):
        lines = [ln for ln in chunk.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if lines:
            queries.append(" ".join(" ".join(lines).split()))
    return queries


def test_documented_dcgm_join_equals_the_dashboards() -> None:
    dashboard_joins = sorted(
        normalized(t["expr"]) for p in panels() for t in p["targets"] if "DCGM_" in t["expr"]
    )
    documented = sorted(documented_dcgm_queries())
    assert len(documented) == 2
    assert dashboard_joins == documented
    for query in documented:
        assert "label_replace(DCGM_FI_DEV_" in query and '"uuid", "$1", "UUID"' in query
        assert "on (uuid) group_left (node, gpu)" in query
