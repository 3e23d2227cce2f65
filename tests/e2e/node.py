"""The driver's node side on a :class:`~tests.e2e.controlplane.ControlPlane` without a kubelet:
a Node object, a pod of the plugin's ServiceAccount bound to it, a token of that account bound to
that pod (so it carries the node name, KEP-4193), the chart's plugin RBAC and admission policies,
and ``python -m kubeletplugin`` with the mock backend and the arguments the chart gives it.

The kubelet's part (registration, NodePrepareResources, NodeUnprepareResources) is played by
:class:`sharegpuctl.local.kubelet.KubeletSim` over the plugin's unix sockets.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

import yaml

from kubeletplugin.sharing.daemonpods import daemon_pod
from kubeletplugin.sharing.daemons import DaemonSpec
from kubeletplugin.sharing.mpspaths import MpsPaths
from tests.e2e.controlplane import ControlPlane, write_kubeconfig
from tests.e2e.driver import NAMESPACE, RBAC_KINDS, apply, component
from tests.e2e.processes import Process, wait_until
from tests.paths import REPO_ROOT

#: Label value of the chart's kubelet-plugin objects (app.kubernetes.io/component).
PLUGIN_COMPONENT: Final = "kubelet-plugin"
POLICY_KINDS: Final = frozenset({"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"})
#: The user extra the API server adds for a token bound to a pod on a node (KEP-4193).
NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
NOT_READY_TAINT: Final = "node.kubernetes.io/not-ready"
#: Flags of the chart's plugin container replaced for a process on this machine: the host
#: directories (under a short temporary directory) and the metrics address (off).
_REPLACED_FLAGS: Final = (
    "--plugin-registry-dir",
    "--plugin-data-dir",
    "--cdi-dir",
    "--mps-root",
    "--metrics-address",
    # The chart's daemon pod template is a file of the plugin's pod: the host-process plugin
    # simulates its MPS daemons in itself.
    "--mps-daemon-pod-template",
)


def create_ready_node(plane: ControlPlane, name: str) -> None:
    """A Node object marked Ready with room for pods, without the not-ready taint (no kubelet
    reports here)."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
    }
    apply(plane, [node], f"create the node {name}")
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "E2E"}],
        }
    }
    plane.kubectl(
        "patch",
        "node",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
        step_name=f"mark the node {name} Ready",
    )
    plane.kubectl("taint", "node", name, f"{NOT_READY_TAINT}:NoSchedule-", check=False)


def plugin_objects(chart: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chart's RBAC and ValidatingAdmissionPolicies (with bindings) of the kubelet plugin."""
    kinds = RBAC_KINDS | POLICY_KINDS
    return [d for d in chart if component(d) == PLUGIN_COMPONENT and d["kind"] in kinds]


def plugin_account(chart: list[dict[str, Any]]) -> str:
    """Name of the plugin's ServiceAccount in the chart."""
    return next(
        str(d["metadata"]["name"]) for d in plugin_objects(chart) if d["kind"] == "ServiceAccount"
    )


def chart_args(chart: list[dict[str, Any]]) -> list[str]:
    """The arguments of the plugin container of the chart's DaemonSet."""
    daemonset = next(
        d for d in chart if d["kind"] == "DaemonSet" and component(d) == PLUGIN_COMPONENT
    )
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return [str(a) for a in container["args"]]


def chart_flag(chart: list[dict[str, Any]], flag: str) -> str:
    """The value of ``flag`` (``--name=value``) among :func:`chart_args`."""
    return next(a.split("=", 1)[1] for a in chart_args(chart) if a.startswith(flag + "="))


def plugin_args(mock_chart: list[dict[str, Any]]) -> list[str]:
    """:func:`chart_args` of the chart rendered with the mock backend, without the flags
    :data:`_REPLACED_FLAGS` (set per run)."""
    return [a for a in chart_args(mock_chart) if a.split("=", 1)[0] not in _REPLACED_FLAGS]


def node_bound_token(plane: ControlPlane, account: str, node: str) -> str:
    """A token of ``account`` bound to a pod of that account on ``node`` (the pod is created
    here, as the DaemonSet controller would; no kubelet runs it)."""
    pod_name = f"{account}-{node}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": NAMESPACE},
        "spec": {
            "serviceAccountName": account,
            "nodeName": node,
            "containers": [{"name": "plugin", "image": "sharegpu:e2e"}],
        },
    }
    apply(plane, [pod], "create the plugin's pod on the node")
    uid = plane.kubectl(
        "get", "pod", pod_name, f"--namespace={NAMESPACE}", "-o", "jsonpath={.metadata.uid}"
    ).stdout.strip()
    return plane.kubectl(
        "create",
        "token",
        account,
        f"--namespace={NAMESPACE}",
        "--bound-object-kind=Pod",
        f"--bound-object-name={pod_name}",
        f"--bound-object-uid={uid}",
        "--duration=24h",
        step_name="issue the plugin's token bound to its pod",
    ).stdout.strip()


def token_user(plane: ControlPlane, kubeconfig: Path) -> dict[str, Any]:
    """The user the API server sees for ``kubeconfig`` (``kubectl auth whoami``)."""
    out = plane.kubectl(
        "auth",
        "whoami",
        "-o",
        "json",
        kubeconfig=kubeconfig,
        step_name="kubectl auth whoami with the plugin's token",
    ).stdout
    return dict(json.loads(out)["status"]["userInfo"])


@dataclasses.dataclass(frozen=True)
class RunningPlugin:
    """The plugin process, its node, the kubeconfig of its token and its host directories."""

    process: Process
    node: str
    kubeconfig: Path
    root: Path

    @property
    def registry(self) -> Path:
        return self.root / "registry"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def usage_file(self) -> Path:
        """The mock GPUs' processes (``--mock-usage-file``), read at each usage sample."""
        return self.root / "usage.yaml"


def start_plugin(
    plane: ControlPlane, chart: list[dict[str, Any]], mock_chart: list[dict[str, Any]], node: str
) -> RunningPlugin:
    """The chart's plugin RBAC and policies applied, ``python -m kubeletplugin`` started with a
    token bound to a pod on ``node`` and the chart's mock-backend arguments; returns once the API
    server has its ResourceSlice."""
    plane.kubectl("create", "namespace", NAMESPACE, step_name="create the namespace", check=False)
    # The release (mock backend) has most of these already; the default render's MPS rules
    # widen its policies, which the release takes back at its next upgrade.
    apply(
        plane,
        plugin_objects(chart),
        "apply the plugin's RBAC and policies from the chart",
        force=True,
    )
    token = node_bound_token(plane, plugin_account(chart), node)
    kubeconfig = write_kubeconfig(
        plane.work / "plugin.kubeconfig", plane.server, plane.pki.ca_file, token=token
    )
    # Unix socket paths hold at most 107 bytes: a short directory under /tmp.
    root = Path(tempfile.mkdtemp(prefix="sg-e2e-", dir="/tmp"))
    driver_name = chart_flag(mock_chart, "--driver-name")
    argv = [
        sys.executable,
        "-m",
        "kubeletplugin",
        *plugin_args(mock_chart),
        f"--node-name={node}",
        f"--kubeconfig={kubeconfig}",
        f"--plugin-registry-dir={root / 'registry'}",
        f"--plugin-data-dir={root / 'plugins' / driver_name}",
        f"--cdi-dir={root / 'cdi'}",
        f"--mps-root={root / 'mps'}",
        # What the mock GPUs' processes are (the mock backend's usage source; none until the
        # file exists).
        f"--mock-usage-file={root / 'usage.yaml'}",
    ]
    process = plane.processes.start(
        "kubeletplugin",
        argv,
        env={"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT), "POD_NAMESPACE": NAMESPACE},
    )
    plugin = RunningPlugin(process, node, kubeconfig, root)

    def published() -> bool:
        return bool(node_slices(plane, node))

    wait_until(published, "start the kubelet plugin", "its ResourceSlice", process=process)
    return plugin


def stop_plugin(plane: ControlPlane, plugin: RunningPlugin) -> None:
    """Stop the plugin by its PID and remove its host directories."""
    plane.processes.stop(plugin.process)
    shutil.rmtree(plugin.root, ignore_errors=True)


def node_slices(plane: ControlPlane, node: str) -> list[dict[str, Any]]:
    """The ResourceSlices of ``node`` as the API server stores them."""
    out = plane.kubectl(
        "get",
        "resourceslices",
        f"--field-selector=spec.nodeName={node}",
        "-o",
        "json",
        step_name="kubectl get resourceslices",
    ).stdout
    return list(json.loads(out)["items"])


def daemon_pod_of(chart: list[dict[str, Any]], node: str, uuid: str) -> dict[str, Any]:
    """The MPS daemon pod the plugin on ``node`` makes for GPU ``uuid`` from the chart's template
    (the chart's MPS root)."""
    config_map = next(
        d
        for d in chart
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-mps-template")
    )
    template = yaml.safe_load(config_map["data"]["daemon-pod.yaml"])
    paths = MpsPaths.of(Path(chart_flag(chart, "--mps-root")), "e2e-claim", uuid)
    spec = DaemonSpec(paths, {"CUDA_VISIBLE_DEVICES": uuid}, uuid, "e2e-claim")
    return daemon_pod(template, spec, namespace=NAMESPACE, node_name=node)
