"""The plugin pod in the node's network namespace: ``kubeletPlugin.hostNetwork`` puts the pod
there (with the DNS policy that keeps cluster DNS), and ``kubeletPlugin.metrics.address`` moves
/metrics and /healthz off the pod IP to one address, where the liveness probe then asks; in the
node's network namespace that address is loopback unless ``metrics.exposeOnNodeNetwork`` opts
out. Off by default; the daemon's own parser accepts the rendered address."""

from __future__ import annotations

from typing import Any

import pytest

from kubeletplugin.config import parse_config
from tests.deploy.helpers import (
    CHART_DIR,
    KUBERNETES_VERSIONS,
    render_chart,
    run_helm,
    validation_errors,
)

pytestmark = pytest.mark.helm

RELEASE = "sharegpu"
NAMESPACE = "gpu-operators"
PORT = 19400


def render(helm: str, *set_args: str) -> list[dict[str, Any]]:
    args = [a for item in set_args for a in ("--set", item)]
    return render_chart(helm, *args, release=RELEASE, namespace=NAMESPACE)


def daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    return ds


def plugin_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [plugin] = daemonset(docs)["spec"]["template"]["spec"]["containers"]
    return dict(plugin)


def metrics_flags(docs: list[dict[str, Any]]) -> list[str]:
    return [a for a in plugin_container(docs)["args"] if a.startswith("--metrics-address")]


def test_by_default_the_pod_has_its_own_network_and_metrics_on_its_ip(helm: str) -> None:
    docs = render(helm)
    pod = daemonset(docs)["spec"]["template"]["spec"]
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod
    assert metrics_flags(docs) == ["--metrics-address=$(POD_IP):9400"]
    assert "host" not in plugin_container(docs)["livenessProbe"]["httpGet"]


def test_host_network_with_a_metrics_address(helm: str) -> None:
    docs = render(
        helm,
        "kubeletPlugin.hostNetwork=true",
        "kubeletPlugin.metrics.address=127.0.0.1",
        f"kubeletPlugin.metrics.port={PORT}",
        "kubeletPlugin.deviceBackend=mock",
    )
    pod = daemonset(docs)["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert metrics_flags(docs) == [f"--metrics-address=127.0.0.1:{PORT}"]
    probe = plugin_container(docs)["livenessProbe"]["httpGet"]
    assert probe == {"host": "127.0.0.1", "path": "/healthz", "port": "metrics"}
    config = parse_config(
        plugin_container(docs)["args"], environ={"NODE_NAME": "node-1", "POD_NAMESPACE": NAMESPACE}
    )
    assert config.metrics_address == f"127.0.0.1:{PORT}"


def test_host_network_keeps_metrics_on_loopback_by_default(helm: str) -> None:
    """In the node's network namespace the pod IP is the node's, outside every NetworkPolicy:
    /metrics (which names every tenant's claims) and /healthz stay on 127.0.0.1."""
    docs = render(helm, "kubeletPlugin.hostNetwork=true")
    assert metrics_flags(docs) == ["--metrics-address=127.0.0.1:9400"]
    probe = plugin_container(docs)["livenessProbe"]["httpGet"]
    assert probe["host"] == "127.0.0.1"


@pytest.mark.parametrize("address", ["0.0.0.0", "10.0.0.7", "192.168.1.20"])
def test_host_network_refuses_a_node_address_without_the_opt_in(helm: str, address: str) -> None:
    sets = ["kubeletPlugin.hostNetwork=true", f"kubeletPlugin.metrics.address={address}"]
    args = [a for item in sets for a in ("--set", item)]
    result = run_helm(helm, "template", RELEASE, str(CHART_DIR), *args)
    assert result.returncode != 0
    assert "/kubeletPlugin/metrics/address" in result.stderr
    opted_in = render(helm, *sets, "kubeletPlugin.metrics.exposeOnNodeNetwork=true")
    assert metrics_flags(opted_in) == [f"--metrics-address={address}:9400"]


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.1.1"])
def test_host_network_accepts_any_loopback_address(helm: str, address: str) -> None:
    docs = render(
        helm, "kubeletPlugin.hostNetwork=true", f"kubeletPlugin.metrics.address={address}"
    )
    assert metrics_flags(docs) == [f"--metrics-address={address}:9400"]


def test_without_host_network_the_opt_in_changes_nothing(helm: str) -> None:
    docs = render(helm, "kubeletPlugin.metrics.exposeOnNodeNetwork=true")
    assert metrics_flags(docs) == ["--metrics-address=$(POD_IP):9400"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_host_network_daemonset_validates_strictly(helm: str, version: str) -> None:
    docs = render(
        helm,
        "kubeletPlugin.hostNetwork=true",
        "kubeletPlugin.metrics.address=10.0.0.7",
        "kubeletPlugin.metrics.exposeOnNodeNetwork=true",
    )
    assert validation_errors(daemonset(docs), version) == []


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("kubeletPlugin.metrics.address=localhost", "address"),
        ("kubeletPlugin.metrics.address=10.0.0.256", "address"),
        ("kubeletPlugin.metrics.address=10.0.0.1:80", "address"),
        ("kubeletPlugin.hostNetwork=yes", "hostNetwork"),
    ],
)
def test_bad_values_are_refused_by_the_schema(helm: str, value: str, problem: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART_DIR), "--set", value)
    assert result.returncode != 0
    assert problem in result.stderr
