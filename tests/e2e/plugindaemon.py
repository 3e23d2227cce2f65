"""The chart installed with ``helm install`` on the real node
(:class:`~tests.e2e.kubelet.RealNode`): the driver's image (:mod:`tests.e2e.driverimage`)
imported into the node's containerd, the release's kubelet-plugin DaemonSet run by the real
kubelet, later ``helm upgrade`` to other values.

The values the run sets are :data:`OVERRIDES`, each with its reason; every other value keeps the
chart's default (the plugin's pod on the pod network, reaching the API server through the
``kubernetes`` Service and kube-proxy, its probes and metrics on its own pod IP). The chart's
objects applied earlier by the control-plane steps (CRDs, DeviceClasses, the plugin's RBAC and
policies) are taken over by the release (``--take-ownership``). The node carries the label the
chart's node selector asks for (``nvidia.com/gpu.present``), as the kind set-up's nodes do. helm
runs inside the sealed network namespace.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from tests.deploy.helpers import load_documents
from tests.e2e import driverimage
from tests.e2e.controlplane import ControlPlane
from tests.e2e.driver import CHART_DIR, NAMESPACE, RELEASE, apply, component
from tests.e2e.kubelet import RealNode
from tests.e2e.node import PLUGIN_COMPONENT, chart_flag, plugin_objects
from tests.e2e.processes import StepFailed, failure, forbidden_lines, wait_until

#: The label the chart's plugin DaemonSet selects nodes by (values.yaml).
GPU_NODE_LABEL: Final = "nvidia.com/gpu.present=true"
#: The mock health file, in the plugin's data directory (a host path the pod mounts at the same
#: path), read by ``--mock-health-file``.
HEALTH_FILE: Final = "mock-health.yaml"
#: The mock GPUs' processes (``--mock-usage-file``), beside it: the usage the plugin measures.
USAGE_FILE: Final = "mock-usage.yaml"
#: The tag the driver's image is also imported under, for an upgrade to another image.
UPGRADE_TAG: Final = "upgrade"
#: The Secret with the CA of the API server's webhook client certificate (``ca.crt``).
CLIENT_CA_SECRET: Final = "e2e-apiserver-client-ca"
#: Every chart value the run sets at install (by its top key path), and why. A test refuses any
#: other: the rest of the chart runs with its defaults.
OVERRIDES: Final = {
    "controller.webhook.clientAuth.existingSecret": "the run's API server presents a client "
    "certificate of the run's CA to webhooks (its AdmissionConfiguration exists before the "
    "chart); the Secret holds that CA, docs/install.md's path for an API server's own CA",
    "image.repository": "the driver's image built here and imported into the node's containerd",
    "image.tag": "the same",
    "kubeletPlugin.deviceBackend": "mock GPUs: the node has no NVIDIA GPU",
    "kubeletPlugin.kubeletDir": "the test node keeps the kubelet's root under its own directory",
    "kubeletPlugin.cdiDir": "the test node's containerd reads CDI specs from its own directory",
    "kubeletPlugin.mps.hostRoot": "the MPS root under the test node's directory",
    "kubeletPlugin.extraArgs": "--mock-health-file and --mock-usage-file: the mock backend's "
    "injected GPU faults and the processes it reports as running on its GPUs",
}


@dataclasses.dataclass(frozen=True)
class PluginDaemon:
    """The installed release's DaemonSet, its node, the host paths of its pod and the image
    (``repository:tag``) it was installed or last upgraded with."""

    plane: ControlPlane
    helm: str
    name: str
    node: RealNode
    data_dir: Path
    image: str

    @property
    def health_file(self) -> Path:
        return self.data_dir / HEALTH_FILE

    @property
    def usage_file(self) -> Path:
        return self.data_dir / USAGE_FILE

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


def install_values(daemon: PluginDaemon) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The values the run sets at install (``key=value`` and ``key=JSON``): exactly the keys of
    :data:`OVERRIDES`."""
    node = daemon.node
    repository, tag = daemon.image.rsplit(":", 1)
    sets = (
        f"controller.webhook.clientAuth.existingSecret={CLIENT_CA_SECRET}",
        f"image.repository={repository}",
        f"image.tag={tag}",
        "kubeletPlugin.deviceBackend=mock",
        f"kubeletPlugin.kubeletDir={node.kubelet_dir}",
        f"kubeletPlugin.cdiDir={node.cdi_dir}",
        f"kubeletPlugin.mps.hostRoot={node.root / 'mps'}",
    )
    json_sets = (
        "kubeletPlugin.extraArgs="
        + json.dumps(
            [
                f"--mock-health-file={daemon.data_dir / HEALTH_FILE}",
                f"--mock-usage-file={daemon.data_dir / USAGE_FILE}",
            ]
        ),
    )
    return sets, json_sets


def values(
    daemon: PluginDaemon, extra: tuple[str, ...] = (), json_values: tuple[str, ...] = ()
) -> list[str]:
    """The ``--set`` and ``--set-json`` arguments of the release: :func:`install_values`, then
    a step's ``extra`` (``key=value``) and ``json_values`` (``key=JSON``)."""
    sets, json_sets = install_values(daemon)
    sets, json_sets = (*sets, *extra), (*json_sets, *json_values)
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
    result = daemon.plane.run([daemon.helm, *argv])
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


def release_manifest(daemon: PluginDaemon) -> list[dict[str, Any]]:
    """The release's objects (``helm get manifest``)."""
    return load_documents(helm_run(daemon, "helm get manifest", "get", "manifest", RELEASE))


def restore_plugin_objects(daemon: PluginDaemon) -> None:
    """The release's plugin RBAC and admission policies applied again over what the
    host-process plugin's steps applied (the default render's: an NVML node's host paths and
    MPS root, which deny the release's daemon pods)."""
    apply(
        daemon.plane,
        plugin_objects(release_manifest(daemon)),
        "apply the release's plugin RBAC and policies again",
        force=True,
    )


def plugin_daemonset_name(daemon: PluginDaemon) -> str:
    """The name of the plugin DaemonSet in the release's manifest (``helm get manifest``)."""
    manifest = release_manifest(daemon)
    (name,) = [
        d["metadata"]["name"]
        for d in manifest
        if d["kind"] == "DaemonSet" and component(d) == PLUGIN_COMPONENT
    ]
    return str(name)


def install(
    helm: str,
    plane: ControlPlane,
    node: RealNode,
    chart: list[dict[str, Any]],
    extra: tuple[str, ...] = (),
) -> PluginDaemon:
    """Import the driver's image (also tagged :data:`UPGRADE_TAG`), ``helm install`` the chart
    (``extra``: more ``key=value`` settings, for a bench; the tests set none) and wait until the
    plugin's pod runs and the node's ResourceSlice is published."""
    archive, name = driverimage.build(node.root, UPGRADE_TAG)
    node.import_image(archive, "import the driver's image")
    archive.unlink()
    plane.kubectl("label", "node", node.name, GPU_NODE_LABEL, "--overwrite")
    plane.kubectl("create", "namespace", NAMESPACE, check=False)
    plane.kubectl(
        "create", "secret", "generic", CLIENT_CA_SECRET, "-n", NAMESPACE,
        f"--from-file=ca.crt={plane.pki.ca_file}",
        step_name="the Secret with the CA of the API server's webhook client certificate",
    )  # fmt: skip
    data_dir = node.plugins_dir / chart_flag(chart, "--driver-name")
    daemon = PluginDaemon(plane, helm, "", node, data_dir, name)
    return _roll_out(
        daemon, "install", ("--create-namespace", "--take-ownership", "--force-conflicts"), extra
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
    return _roll_out(daemon, "upgrade", ("--force-conflicts",), extra, json_values, meanwhile)


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
        result = daemon.plane.run(
            [
                daemon.helm,
                "uninstall",
                RELEASE,
                "--namespace",
                NAMESPACE,
                f"--kubeconfig={daemon.plane.admin_kubeconfig}",
                "--wait",
                "--timeout=100s",
            ]
        )
        uninstalled = result.returncode == 0
    except subprocess.TimeoutExpired:
        uninstalled = False
    if not uninstalled:
        # The DaemonSet itself, so that its pod stops before the kubelet does.
        daemon.plane.kubectl(
            "delete", "daemonset", daemon.name, "-n", NAMESPACE, "--wait=true", check=False
        )
