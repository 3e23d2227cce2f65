"""The chart installed with ``helm install`` on the real node
(:class:`~tests.e2e.kubelet.RealNode`): the driver's image (:mod:`tests.e2e.driverimage`)
imported into the node's containerd, the release's kubelet-plugin DaemonSet run by the real
kubelet, later ``helm upgrade`` to other values.

Values set besides the image and the mock GPUs (``kubeletPlugin.deviceBackend=mock``,
``kubeletPlugin.mock.config``): ``controller.enabled=false`` (the controller runs as a host
process, :mod:`tests.e2e.driver`: a pod could not reach the API server on 127.0.0.1, nor could
the API server reach a webhook Service without kube-proxy), the kubelet and CDI directories and
the MPS root (the node keeps them under its temporary directory), ``kubeletPlugin.hostNetwork``
(the pod reaches the API server on 127.0.0.1, which ``extraEnv`` ``KUBERNETES_SERVICE_HOST`` and
``_PORT`` name), ``kubeletPlugin.metrics.address=127.0.0.1`` and a free metrics port (so the pod
listens on loopback only), and ``--mock-health-file`` in ``extraArgs`` (injected GPU faults). The
chart's objects applied earlier by the control-plane steps (CRDs, DeviceClasses, the plugin's RBAC
and policies) are taken over by the release (``--take-ownership``). The node carries the label
the chart's node selector asks for (``nvidia.com/gpu.present``), as the kind set-up's nodes do.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from tests.deploy.helpers import load_documents, run_helm
from tests.e2e import driverimage
from tests.e2e.controlplane import ControlPlane, free_port
from tests.e2e.driver import CHART_DIR, NAMESPACE, RELEASE, component
from tests.e2e.kubelet import RealNode
from tests.e2e.node import PLUGIN_COMPONENT, chart_flag
from tests.e2e.processes import StepFailed, failure, forbidden_lines, wait_until

#: The label the chart's plugin DaemonSet selects nodes by (values.yaml).
GPU_NODE_LABEL: Final = "nvidia.com/gpu.present=true"
#: The mock health file, in the plugin's data directory (a host path the pod mounts at the same
#: path), read by ``--mock-health-file``.
HEALTH_FILE: Final = "mock-health.yaml"
#: The tag the driver's image is also imported under, for an upgrade to another image.
UPGRADE_TAG: Final = "upgrade"


@dataclasses.dataclass(frozen=True)
class PluginDaemon:
    """The installed release's DaemonSet, its node, the host paths of its pod and the image
    (``repository:tag``) it was installed or last upgraded with."""

    plane: ControlPlane
    helm: str
    name: str
    node: RealNode
    data_dir: Path
    metrics_port: int
    image: str

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


def values(
    daemon: PluginDaemon, extra: tuple[str, ...] = (), json_values: tuple[str, ...] = ()
) -> list[str]:
    """The ``--set`` and ``--set-json`` arguments of the release (see the module docstring),
    with ``extra`` (``key=value``) and ``json_values`` (``key=JSON``) set as well."""
    plane, node = daemon.plane, daemon.node
    repository, tag = daemon.image.rsplit(":", 1)
    env = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(plane.api_port)},
    ]
    sets = (
        "controller.enabled=false",
        f"image.repository={repository}",
        f"image.tag={tag}",
        "kubeletPlugin.deviceBackend=mock",
        f"kubeletPlugin.kubeletDir={node.kubelet_dir}",
        f"kubeletPlugin.cdiDir={node.cdi_dir}",
        f"kubeletPlugin.mps.hostRoot={node.root / 'mps'}",
        "kubeletPlugin.hostNetwork=true",
        "kubeletPlugin.metrics.address=127.0.0.1",
        f"kubeletPlugin.metrics.port={daemon.metrics_port}",
        *extra,
    )
    json_sets = (
        f"kubeletPlugin.extraEnv={json.dumps(env)}",
        "kubeletPlugin.extraArgs="
        + json.dumps([f"--mock-health-file={daemon.data_dir / HEALTH_FILE}"]),
        *json_values,
    )
    return [a for v in sets for a in ("--set", v)] + [
        a for v in json_sets for a in ("--set-json", v)
    ]


def helm_run(daemon: PluginDaemon, step_name: str, *args: str) -> str:
    """Run helm against the control plane (the release's namespace); returns its output."""
    argv = [
        *args,
        "--namespace",
        NAMESPACE,
        f"--kubeconfig={daemon.plane.admin_kubeconfig}",
    ]
    result = run_helm(daemon.helm, *argv)
    if result.returncode != 0:
        raise StepFailed(
            failure(
                step_name,
                ["helm", *argv],
                f"exit code {result.returncode}: {result.stderr}",
                daemon.plane.apiserver.log if daemon.plane.apiserver else None,
            )
        )
    return result.stdout


def plugin_daemonset_name(daemon: PluginDaemon) -> str:
    """The name of the plugin DaemonSet in the release's manifest (``helm get manifest``)."""
    manifest = load_documents(helm_run(daemon, "helm get manifest", "get", "manifest", RELEASE))
    (name,) = [
        d["metadata"]["name"]
        for d in manifest
        if d["kind"] == "DaemonSet" and component(d) == PLUGIN_COMPONENT
    ]
    return str(name)


def install(
    helm: str, plane: ControlPlane, node: RealNode, chart: list[dict[str, Any]]
) -> PluginDaemon:
    """Import the driver's image (also tagged :data:`UPGRADE_TAG`), ``helm install`` the chart
    and wait until the plugin's pod runs and the node's ResourceSlice is published."""
    archive, name = driverimage.build(node.root, UPGRADE_TAG)
    node.import_image(archive, "import the driver's image")
    archive.unlink()
    plane.kubectl("label", "node", node.name, GPU_NODE_LABEL, "--overwrite")
    data_dir = node.plugins_dir / chart_flag(chart, "--driver-name")
    daemon = PluginDaemon(plane, helm, "", node, data_dir, free_port(), name)
    return _roll_out(
        daemon, "install", ("--create-namespace", "--take-ownership", "--force-conflicts")
    )


def upgrade(
    daemon: PluginDaemon,
    *extra: str,
    json_values: tuple[str, ...] = (),
    image: str | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> PluginDaemon:
    """``helm upgrade`` the release with ``extra`` (``key=value``) and ``json_values``
    (``key=JSON``) set besides the release's own (and the image ``image`` when given), run
    ``meanwhile`` as soon as helm returns, and wait until a new pod runs; what it publishes is for
    the caller to wait for."""
    if image is not None:
        daemon = dataclasses.replace(daemon, image=image)
    return _roll_out(daemon, "upgrade", (), extra, json_values, meanwhile)


def _roll_out(
    daemon: PluginDaemon,
    verb: str,
    flags: tuple[str, ...],
    extra: tuple[str, ...] = (),
    json_values: tuple[str, ...] = (),
    meanwhile: Callable[[], None] | None = None,
) -> PluginDaemon:
    """``helm install`` or ``upgrade``, run ``meanwhile``, and wait until a pod other than the
    current one is ready and the node has ResourceSlices."""
    plane, node = daemon.plane, daemon.node
    before = daemon.pod() if daemon.name else None
    old_uid = (before or {}).get("metadata", {}).get("uid")
    helm_run(
        daemon,
        f"helm {verb} the chart",
        verb,
        RELEASE,
        str(CHART_DIR),
        *flags,
        *values(daemon, extra, json_values),
    )
    daemon = dataclasses.replace(daemon, name=plugin_daemonset_name(daemon))
    if meanwhile is not None:
        meanwhile()

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


def uninstall(daemon: PluginDaemon) -> None:
    """``helm uninstall`` the release and wait until its pod is gone (the CRDs stay:
    ``crds.keep``)."""
    try:
        result = run_helm(
            daemon.helm,
            "uninstall",
            RELEASE,
            "--namespace",
            NAMESPACE,
            f"--kubeconfig={daemon.plane.admin_kubeconfig}",
            "--wait",
            "--timeout=100s",
        )
        uninstalled = result.returncode == 0
    except subprocess.TimeoutExpired:
        uninstalled = False
    if not uninstalled:
        # The DaemonSet itself, so that its pod stops before the kubelet does.
        daemon.plane.kubectl(
            "delete", "daemonset", daemon.name, "-n", NAMESPACE, "--wait=true", check=False
        )
