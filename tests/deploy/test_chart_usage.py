"""The chart's measured-usage wiring: ``kubeletPlugin.usage`` values become the plugin's usage
flags (checked by the plugin's own parser), the plugin pod joins the host PID namespace only
while usage is sampled (NVML lists no process of another PID namespace) and then reads the
host's processes at /proc (no hostPath of /proc, no other host namespace), tini stays their
reaper as a subreaper, and the plugin may write claim status (``resourceclaims/status`` and,
for granular status authorization, its driver's ``resourceclaims/driver``) only while usage is
written to claims."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.config import PluginConfig, parse_config
from kubeletplugin.usage.flags import DEFAULT_USAGE_OPTIONS
from tests.deploy.helpers import (
    CHART_DIR,
    KUBERNETES_VERSIONS,
    render_chart,
    run_helm,
    validation_errors,
)

pytestmark = pytest.mark.helm

NAMESPACE = "gpu-operators"
RELEASE = "sharegpu"
DRIVER = "gpu.sharegpu.dev"
PROC_ROOT = Path("/proc")


def render(helm: str, usage: dict[str, Any] | None = None, *set_args: str) -> list[dict[str, Any]]:
    """The chart's documents with ``kubeletPlugin.usage`` merged from ``usage`` (given as JSON,
    so numbers keep their type, as in a values file)."""
    args: list[str] = []
    if usage is not None:
        args += ["--set-json", f"kubeletPlugin.usage={json.dumps(usage)}"]
    for item in set_args:
        args += ["--set", item]
    return render_chart(helm, *args, release=RELEASE, namespace=NAMESPACE)


def daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    return ds


def plugin_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [plugin] = daemonset(docs)["spec"]["template"]["spec"]["containers"]
    assert plugin["name"] == "plugin"
    return dict(plugin)


def usage_args(docs: list[dict[str, Any]]) -> list[str]:
    return [a for a in plugin_container(docs)["args"] if a.startswith(("--usage", "--disable-us"))]


def plugin_config(docs: list[dict[str, Any]]) -> PluginConfig:
    """The configuration the plugin builds from the rendered arguments."""
    args = [a for a in plugin_container(docs)["args"] if not a.startswith("--metrics-address")]
    return parse_config(args, environ={"NODE_NAME": "gpu-node-1", "POD_NAMESPACE": NAMESPACE})


def proc_mounts(docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumeMounts of the plugin under a proc path, hostPath volumes of /proc)."""
    spec = daemonset(docs)["spec"]["template"]["spec"]
    mounts = [m for m in plugin_container(docs)["volumeMounts"] if "proc" in m["mountPath"]]
    volumes = [v for v in spec["volumes"] if v.get("hostPath", {}).get("path") == "/proc"]
    return mounts, volumes


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(daemonset(docs)["spec"]["template"]["spec"])


def plugin_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    [role] = [
        d
        for d in docs
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("kubelet-plugin")
    ]
    return list(role["rules"])


def claim_status_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in plugin_rules(docs) if any("/" in res for res in r["resources"])]


@pytest.fixture(scope="module")
def default(helm: str) -> list[dict[str, Any]]:
    return render(helm)


def test_default_values_give_the_plugins_default_usage_options(
    default: list[dict[str, Any]],
) -> None:
    assert usage_args(default) == [
        "--usage-interval=10",
        "--usage-write-interval=30",
        "--usage-compute-margin=10",
    ]
    # The chart's defaults are the plugin's (the host's /proc is /proc in the host PID namespace).
    assert plugin_config(default).usage == replace(DEFAULT_USAGE_OPTIONS, proc_root=PROC_ROOT)
    assert plugin_config(default).usage == DEFAULT_USAGE_OPTIONS


@pytest.mark.parametrize(
    ("usage", "interval", "write_interval", "margin", "taint", "escape_taint"),
    [
        ({"interval": 2.5, "writeInterval": 0}, 2.5, 0.0, 10, False, False),
        ({"computeMargin": 0, "taintOvercommitted": True}, 10.0, 30.0, 0, True, False),
        ({"taintEscapes": True}, 10.0, 30.0, 10, False, True),
        (
            {"interval": 60, "writeInterval": 120.5, "computeMargin": 100},
            60.0,
            120.5,
            100,
            False,
            False,
        ),
    ],
)
def test_the_flags_follow_the_values(
    helm: str,
    usage: dict[str, Any],
    interval: float,
    write_interval: float,
    margin: int,
    taint: bool,
    escape_taint: bool,
) -> None:
    docs = render(helm, usage)
    options = plugin_config(docs).usage
    assert options.enabled is True
    assert (options.interval_s, options.write_interval_s) == (interval, write_interval)
    assert (options.compute_margin, options.taint) == (margin, taint)
    assert options.escape_taint is escape_taint
    assert options.proc_root == PROC_ROOT
    assert ("--usage-taint" in usage_args(docs)) is taint
    assert ("--usage-escape-taint" in usage_args(docs)) is escape_taint


def test_usage_joins_the_host_pid_namespace_and_nothing_more(
    default: list[dict[str, Any]],
) -> None:
    pod = pod_spec(default)
    assert pod["hostPID"] is True
    # No other host namespace, no hostPath of /proc: /proc is the host's in its PID namespace.
    assert not pod.get("hostIPC") and not pod.get("hostNetwork")
    assert proc_mounts(default) == ([], [])
    # Not PID 1 there: tini reaps the plugin's orphans as the container's child subreaper.
    assert plugin_container(default)["command"] == ["tini", "-s", "--", "sharegpu-kubeletplugin"]


def test_disabled_usage_has_no_flags_no_host_pid_and_no_claim_status_rbac(helm: str) -> None:
    docs = render(helm, {"enabled": False, "taintOvercommitted": True, "taintEscapes": True})
    assert usage_args(docs) == ["--disable-usage"]
    assert plugin_config(docs).usage.enabled is False
    assert proc_mounts(docs) == ([], [])
    assert claim_status_rules(docs) == []
    assert not pod_spec(docs).get("hostPID")


def test_the_plugin_may_update_claim_status_of_its_own_driver_on_its_node(
    default: list[dict[str, Any]],
) -> None:
    assert claim_status_rules(default) == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/status"],
            "verbs": ["update"],
        },
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/driver"],
            "resourceNames": [DRIVER],
            "verbs": ["associated-node:update"],
        },
    ]


def test_the_driver_rule_names_the_configured_driver(helm: str) -> None:
    docs = render(helm, None, "driverName=gpu.example.com")
    [driver_rule] = [
        r for r in claim_status_rules(docs) if "resourceclaims/driver" in r["resources"]
    ]
    assert driver_rule["resourceNames"] == ["gpu.example.com"]


def test_usage_never_written_means_no_claim_status_rbac(helm: str) -> None:
    """writeInterval 0: the plugin samples (and may taint) but never writes claims."""
    docs = render(helm, {"writeInterval": 0})
    assert plugin_config(docs).usage.write_interval_s == 0
    assert pod_spec(docs)["hostPID"] is True
    assert claim_status_rules(docs) == []


@pytest.mark.parametrize(
    ("usage", "problem"),
    [
        ({"interval": 0}, "interval"),
        ({"writeInterval": -1}, "writeInterval"),
        ({"computeMargin": 101}, "computeMargin"),
        ({"computeMargin": 2.5}, "computeMargin"),
        ({"taintOvercommitted": "yes"}, "taintOvercommitted"),
        ({"taintEscapes": 1}, "taintEscapes"),
        ({"procRoot": "/proc"}, "procRoot"),
    ],
)
def test_bad_usage_values_are_refused_by_the_schema(
    helm: str, usage: dict[str, Any], problem: str
) -> None:
    result = run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART_DIR),
        "--set-json",
        f"kubeletPlugin.usage={json.dumps(usage)}",
    )
    assert result.returncode != 0
    assert problem in result.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("enabled", [True, False])
def test_the_plugin_objects_validate_strictly(helm: str, version: str, enabled: bool) -> None:
    docs = render(helm, {"enabled": enabled, "taintOvercommitted": True, "taintEscapes": True})
    plugin_docs = [d for d in docs if d["kind"] in ("DaemonSet", "ClusterRole")]
    assert len(plugin_docs) >= 2
    assert [e for d in plugin_docs for e in validation_errors(d, version)] == []


def test_the_kubelets_cgroup_root_reaches_the_plugin(helm: str) -> None:
    docs = render(helm, {"kubeletCgroupRoot": "/kubelet"})
    assert "--usage-kubelet-cgroup-root=/kubelet" in usage_args(docs)
    assert plugin_config(docs).usage.kubelet_cgroup_root == ("kubelet",)
