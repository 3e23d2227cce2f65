"""The chart's Prometheus Operator monitors (``metrics.serviceMonitor`` / ``metrics.podMonitor``).

Off by default. When on, each enabled component (controller, kubelet plugin) gets one monitor
whose selector picks exactly that component's metrics Service (ServiceMonitor) or pods
(PodMonitor) and whose endpoint names a port those objects really expose; the plugin's targets
get a ``node`` label. The monitors' kinds have no Kubernetes schema; every other rendered
document is still validated strictly.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.helpers import (
    CHART_DIR,
    KUBERNETES_VERSIONS,
    OWN_GROUPS,
    load_documents,
    run_helm,
    validation_errors,
)

pytestmark = pytest.mark.helm

NAMESPACE = "sharegpu-system"
MONITORING_GROUP = "monitoring.coreos.com"
MONITOR_KINDS = ("ServiceMonitor", "PodMonitor")


def template(helm: str, *set_args: str) -> Any:
    args = ["template", "sharegpu", str(CHART_DIR), "--namespace", NAMESPACE]
    for item in set_args:
        args += ["--set", item]
    return run_helm(helm, *args)


def render(helm: str, *set_args: str) -> list[dict[str, Any]]:
    result = template(helm, *set_args)
    assert result.returncode == 0, result.stderr
    return load_documents(result.stdout)


def monitors(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["apiVersion"].startswith(f"{MONITORING_GROUP}/")]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_no_monitors_by_default(helm: str) -> None:
    assert monitors(render(helm)) == []


@pytest.mark.parametrize("kind", MONITOR_KINDS)
def test_monitors_render_only_for_enabled_components(helm: str, kind: str) -> None:
    key = "serviceMonitor" if kind == "ServiceMonitor" else "podMonitor"
    both = monitors(render(helm, f"metrics.{key}.enabled=true"))
    assert [m["kind"] for m in both] == [kind, kind]
    assert {m["metadata"]["labels"]["app.kubernetes.io/component"] for m in both} == {
        "controller",
        "kubelet-plugin",
    }
    plugin_only = monitors(render(helm, f"metrics.{key}.enabled=true", "controller.enabled=false"))
    assert [m["metadata"]["name"] for m in plugin_only] == ["sharegpu-kubelet-plugin"]


def test_service_monitors_select_the_metrics_services(helm: str) -> None:
    docs = render(
        helm,
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=prometheus",
        "metrics.serviceMonitor.interval=15s",
        "metrics.serviceMonitor.scrapeTimeout=10s",
    )
    services = [d for d in docs if d["kind"] == "Service"]
    for monitor in monitors(docs):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["namespace"] == NAMESPACE
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["interval"] == "15s" and endpoint["scrapeTimeout"] == "10s"
        assert endpoint["path"] == "/metrics"
        scraped = [
            s["metadata"]["name"]
            for s in services
            if selects(monitor["spec"]["selector"], s["metadata"]["labels"])
            and endpoint["port"] in {p["name"] for p in s["spec"]["ports"]}
        ]
        assert scraped == [monitor["metadata"]["name"] + "-metrics"]


def test_pod_monitors_select_the_pods_with_a_metrics_port(helm: str) -> None:
    docs = render(helm, "metrics.podMonitor.enabled=true")
    workloads = [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]
    for monitor in monitors(docs):
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["interval"] == "30s" and "scrapeTimeout" not in endpoint
        matched = [
            w
            for w in workloads
            if selects(monitor["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])
        ]
        assert [w["metadata"]["name"] for w in matched] == [monitor["metadata"]["name"]]
        ports = {
            p["name"]
            for c in matched[0]["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        assert endpoint["port"] in ports


@pytest.mark.parametrize("kind", MONITOR_KINDS)
def test_only_the_plugin_targets_get_a_node_label(helm: str, kind: str) -> None:
    """The plugin's series carry no node; the controller's per-GPU series carry their own."""
    key = "serviceMonitor" if kind == "ServiceMonitor" else "podMonitor"
    endpoints_key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
    for monitor in monitors(render(helm, f"metrics.{key}.enabled=true")):
        (endpoint,) = monitor["spec"][endpoints_key]
        component = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
        if component == "kubelet-plugin":
            assert endpoint["relabelings"] == [
                {
                    "action": "replace",
                    "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                    "targetLabel": "node",
                }
            ]
        else:
            assert "relabelings" not in endpoint


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("kind", MONITOR_KINDS)
def test_other_documents_still_validate_strictly(helm: str, kind: str, version: str) -> None:
    key = "serviceMonitor" if kind == "ServiceMonitor" else "podMonitor"
    docs = render(helm, f"metrics.{key}.enabled=true")
    problems = [
        p for d in docs for p in validation_errors(d, version, OWN_GROUPS | {MONITORING_GROUP})
    ]
    assert problems == []


@pytest.mark.parametrize(
    ("set_args", "message"),
    [
        (
            ("metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true"),
            "enable one of them",
        ),
        (
            ("metrics.serviceMonitor.enabled=true", "metricsService.enabled=false"),
            "needs metricsService.enabled=true",
        ),
        (("metrics.podMonitor.interval=thirty",), "/metrics/podMonitor/interval"),
        (("metrics.serviceMonitor.scrapeTimeout=10",), "/metrics/serviceMonitor/scrapeTimeout"),
        (("metrics.serviceMonitor.enable=true",), "enable"),
        (("metrics.podMonitor.labels.team=1",), "/metrics/podMonitor/labels/team"),
    ],
)
def test_bad_monitor_values_fail(helm: str, set_args: tuple[str, ...], message: str) -> None:
    result = template(helm, *set_args)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize("variant", [(), ("metrics.serviceMonitor.enabled=true",)])
def test_helm_lint_passes_with_monitors(helm: str, variant: tuple[str, ...]) -> None:
    args = ["lint", "--strict", str(CHART_DIR), "--namespace", NAMESPACE]
    for item in variant:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stdout + result.stderr
