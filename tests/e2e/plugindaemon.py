"""The chart's kubelet-plugin DaemonSet on the real node (:class:`~tests.e2e.kubelet.RealNode`):
the driver's image (:mod:`tests.e2e.driverimage`) imported into the node's containerd, the
chart rendered with the mock backend and the node's host directories, the DaemonSet applied, and
its pod run by the real kubelet.

Values set besides ``kubeletPlugin.deviceBackend=mock``: the kubelet and CDI directories and the
MPS root (the node keeps them under its temporary directory), the metrics port (a free one), two
extra environment variables and two extra flags (``--metrics-address`` on 127.0.0.1, and
``--mock-health-file`` for injected GPU faults). Changed in the rendered DaemonSet:
``hostNetwork`` (there is no kube-proxy, so the pod reaches the API server on 127.0.0.1, which
``KUBERNETES_SERVICE_HOST`` and ``_PORT`` name) and the liveness probe's host (127.0.0.1, where
``--metrics-address`` then listens). The node carries the label the chart's node selector asks
for (``nvidia.com/gpu.present``), as the kind set-up's nodes do.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Final

from tests.e2e import driverimage
from tests.e2e.controlplane import ControlPlane, free_port
from tests.e2e.driver import NAMESPACE, apply, component, render_chart
from tests.e2e.kubelet import RealNode
from tests.e2e.node import PLUGIN_COMPONENT, chart_flag, plugin_objects
from tests.e2e.processes import StepFailed, failure, forbidden_lines, wait_until

#: The label the chart's plugin DaemonSet selects nodes by (values.yaml).
GPU_NODE_LABEL: Final = "nvidia.com/gpu.present=true"
#: The mock health file, in the plugin's data directory (a host path the pod mounts at the same
#: path), read by ``--mock-health-file``.
HEALTH_FILE: Final = "mock-health.yaml"


@dataclasses.dataclass(frozen=True)
class PluginDaemon:
    """The applied DaemonSet, its node and the host paths of its pod."""

    plane: ControlPlane
    name: str
    node: RealNode
    data_dir: Path
    metrics_port: int

    @property
    def health_file(self) -> Path:
        return self.data_dir / HEALTH_FILE

    def pod(self) -> dict[str, Any] | None:
        """The DaemonSet's pod on the node (None before the controller creates it)."""
        out = self.plane.kubectl(
            "get",
            "pods",
            "-n",
            NAMESPACE,
            f"--field-selector=spec.nodeName={self.node.name}",
            "-o",
            "json",
        ).stdout
        pods = [
            p
            for p in json.loads(out)["items"]
            if any(o.get("name") == self.name for o in p["metadata"].get("ownerReferences", []))
        ]
        return pods[0] if pods else None

    def logs(self) -> str:
        """The plugin container's log (empty when there is no pod yet)."""
        pod = self.pod()
        if pod is None:
            return ""
        name = pod["metadata"]["name"]
        result = self.plane.kubectl("logs", name, "-n", NAMESPACE, "-c", "plugin", check=False)
        return result.stdout

    def check_no_forbidden(self, step_name: str) -> None:
        """Fail the step when the plugin's log shows a 403 (Forbidden) answer."""
        forbidden = forbidden_lines(self.logs())
        if forbidden:
            raise StepFailed(failure(step_name, "kubectl logs", forbidden[0]))


def daemonset(
    helm: str,
    plane: ControlPlane,
    node: RealNode,
    metrics_port: int,
    data_dir: Path,
    *values: str,
    json_values: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """The chart's plugin DaemonSet for ``node`` (see the module docstring for what changes),
    with ``values`` (``key=value``) and ``json_values`` (``key=JSON``) set as well; preceded by
    the chart's mock GPU ConfigMap where ``kubeletPlugin.mock.config`` renders one."""
    env = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(plane.api_port)},
    ]
    chart = render_chart(
        helm,
        "kubeletPlugin.deviceBackend=mock",
        f"kubeletPlugin.kubeletDir={node.kubelet_dir}",
        f"kubeletPlugin.cdiDir={node.cdi_dir}",
        f"kubeletPlugin.mps.hostRoot={node.root / 'mps'}",
        f"kubeletPlugin.metrics.port={metrics_port}",
        *values,
        json_values=(
            f"kubeletPlugin.extraEnv={json.dumps(env)}",
            "kubeletPlugin.extraArgs="
            + json.dumps(
                [
                    f"--metrics-address=127.0.0.1:{metrics_port}",
                    f"--mock-health-file={data_dir / HEALTH_FILE}",
                ]
            ),
            *json_values,
        ),
    )
    mock_config = [
        d
        for d in chart
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-kubelet-plugin-mock")
    ]
    (ds,) = [d for d in chart if d["kind"] == "DaemonSet" and component(d) == PLUGIN_COMPONENT]
    spec = ds["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    (container,) = spec["containers"]
    container["livenessProbe"]["httpGet"]["host"] = "127.0.0.1"
    return [*mock_config, ds]


def start(
    helm: str, plane: ControlPlane, node: RealNode, chart: list[dict[str, Any]]
) -> PluginDaemon:
    """Import the driver's image, apply the chart's plugin RBAC, policies and DaemonSet, and wait
    until its pod runs and the node's ResourceSlice is published."""
    archive, _name = driverimage.build(node.root)
    node.import_image(archive, "import the driver's image")
    archive.unlink()
    plane.kubectl("create", "namespace", NAMESPACE, check=False)
    apply(plane, plugin_objects(chart), "apply the plugin's RBAC and policies from the chart")
    plane.kubectl("label", "node", node.name, GPU_NODE_LABEL, "--overwrite")
    data_dir = node.plugins_dir / chart_flag(chart, "--driver-name")
    daemon = PluginDaemon(plane, "", node, data_dir, free_port())
    return _roll_out(daemon, helm)


def reconfigure(
    daemon: PluginDaemon, helm: str, *values: str, json_values: tuple[str, ...] = ()
) -> PluginDaemon:
    """Apply the DaemonSet rendered with ``values`` as well (as ``helm upgrade --set`` would) and
    wait until a new pod runs; what it publishes is for the caller to wait for."""
    return _roll_out(daemon, helm, *values, json_values=json_values)


def _roll_out(
    daemon: PluginDaemon, helm: str, *values: str, json_values: tuple[str, ...] = ()
) -> PluginDaemon:
    """Apply the DaemonSet and wait until a pod other than the current one is ready and the node
    has ResourceSlices."""
    plane, node = daemon.plane, daemon.node
    before = daemon.pod() if daemon.name else None
    old_uid = (before or {}).get("metadata", {}).get("uid")
    docs = daemonset(
        helm, plane, node, daemon.metrics_port, daemon.data_dir, *values, json_values=json_values
    )
    apply(plane, docs, "apply the chart's kubelet-plugin DaemonSet")
    ds = docs[-1]
    daemon = dataclasses.replace(daemon, name=ds["metadata"]["name"])

    def running() -> bool:
        pod = daemon.pod()
        if pod is None or pod["metadata"]["uid"] == old_uid:
            return False
        return any(s.get("ready") for s in pod["status"].get("containerStatuses", []))

    def published() -> bool:
        out = plane.kubectl(
            "get", "resourceslices", f"--field-selector=spec.nodeName={node.name}", "-o", "name"
        ).stdout
        return bool(out.strip())

    try:
        wait_until(
            running, "the plugin's DaemonSet pod runs", "a new pod ready", process=node.kubelet
        )
        wait_until(published, "the plugin pod publishes", "the node's ResourceSlices")
    except StepFailed as exc:
        raise StepFailed(f"{exc}\n  plugin pod log:\n{daemon.logs()[-4000:]}") from exc
    return daemon


def stop(daemon: PluginDaemon) -> None:
    """Delete the DaemonSet and wait until its pod is gone."""
    daemon.plane.kubectl(
        "delete",
        "daemonset",
        daemon.name,
        "-n",
        NAMESPACE,
        "--cascade=foreground",
        "--wait=true",
        "--timeout=120s",
        check=False,
    )
