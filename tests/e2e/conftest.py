"""Fixtures of the end-to-end run: a sealed network namespace with a real control plane and a
real node in it, the CRDs, and the chart installed with its defaults (controller Deployment,
webhook, kubelet-plugin DaemonSet).

Everything here is package-scoped: the control plane starts once for tests/e2e/, and every
process it and the fixtures start is stopped by its PID after the last of these tests, also
after a failure; the namespace is removed last. The run skips, naming what is missing, where it
cannot happen (not Linux, not root, no Go toolchain, no ip or nsenter) or where the binaries are
not built yet (``make e2e`` builds them first).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

from tests.e2e import driver, images, node, plugindaemon
from tests.e2e.binaries import bin_dir, missing_binaries, missing_prerequisites
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import (
    BUSYBOX_IMAGE,
    NODE_BINARIES,
    RealNode,
    missing_node_prerequisites,
)
from tests.e2e.netns import missing_network_prerequisites
from tests.e2e.processes import step

#: The node of the kubelet plugin's process (its token is bound to a pod on it).
PLUGIN_NODE = "e2e-plugin-node"

#: Binaries without which nothing runs (the controller manager and scheduler are optional).
REQUIRED = ("etcd", "kube-apiserver", "kubectl")


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that runs on the control plane carries the ``e2e`` marker."""
    for item in items:
        if "control_plane" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="package")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler in the run's sealed
    network namespace, whose seal is proven before anything starts."""
    missing = missing_prerequisites() + missing_network_prerequisites()
    if missing:
        pytest.skip("e2e: " + "; ".join(missing))
    absent = missing_binaries(REQUIRED)
    if absent:
        pytest.skip(
            f"e2e: upstream binaries not built ({', '.join(absent)} under {bin_dir()}); "
            "`make e2e` builds them (tests/e2e/build-binaries.sh)"
        )
    plane = ControlPlane(bin_dir(), tmp_path_factory.mktemp("e2e"))
    # SIGTERM (a CI time-out, a killed run) ends the session like Ctrl-C: every fixture's
    # teardown runs, so no process, mount or namespace outlives the run.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with step("start the control plane"):
            plane.start()
        yield plane
    finally:
        plane.stop()
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="package")
def chart(helm: str) -> list[dict[str, Any]]:
    """The chart rendered with its defaults, as the e2e run applies parts of it."""
    return driver.render_chart(helm)


@pytest.fixture(scope="package")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with the CRDs of deploy/crds established."""
    driver.apply_crds(control_plane)
    return control_plane


@pytest.fixture(scope="package")
def plugin(
    crds: ControlPlane, chart: list[dict[str, Any]], helm: str
) -> Iterator[node.RunningPlugin]:
    """``python -m kubeletplugin`` (mock backend, the chart's arguments) for a Ready Node object,
    with a token bound to a pod on that node and the chart's plugin RBAC and admission policies;
    the chart's DeviceClasses applied. Stopped by its PID after the last test."""
    driver.apply(crds, [d for d in chart if d["kind"] == "DeviceClass"], "apply the DeviceClasses")
    node.create_ready_node(crds, PLUGIN_NODE)
    mock_chart = driver.render_chart(helm, "kubeletPlugin.deviceBackend=mock")
    running = node.start_plugin(crds, chart, mock_chart, PLUGIN_NODE)
    try:
        yield running
    finally:
        node.stop_plugin(crds, running)


@pytest.fixture(scope="package")
def real_node(control_plane: ControlPlane) -> Iterator[RealNode]:
    """containerd and a kubelet registered as a Ready node (skips, naming what is missing, where
    they cannot run). Everything it started, mounted or created is removed after the last test."""
    missing = missing_node_prerequisites() + images.missing_tools()
    absent = missing_binaries(NODE_BINARIES)
    if absent:
        missing.append(
            f"node binaries not built ({', '.join(absent)} under {bin_dir()}); "
            "`make e2e` builds them (tests/e2e/build-binaries.sh kubelet containerd)"
        )
    if missing:
        pytest.skip("e2e node: " + "; ".join(missing))
    real = RealNode(control_plane)
    try:
        with step("start containerd and the kubelet"):
            real.start()
        yield real
    finally:
        real.stop()


@pytest.fixture(scope="package")
def release(
    real_node: RealNode, crds: ControlPlane, chart: list[dict[str, Any]], helm: str
) -> Iterator[plugindaemon.PluginDaemon]:
    """The chart installed with ``helm install`` and its defaults but for
    :data:`plugindaemon.OVERRIDES` (mock GPUs, the driver's image built here): the controller
    Deployment and its webhook Service, and the kubelet-plugin DaemonSet on the real node, whose
    pod registers with the kubelet and writes its CDI specs where containerd reads them.
    Uninstalled after the last test."""
    real_node.import_busybox([BUSYBOX_IMAGE], "import the busybox image")
    daemon = None
    try:
        with step("helm install the chart; its kubelet-plugin DaemonSet runs on the real node"):
            daemon = plugindaemon.install(helm, crds, real_node, chart)
        yield daemon
    finally:
        if daemon is not None:
            plugindaemon.uninstall(daemon)


@pytest.fixture
def node_plugin(release: plugindaemon.PluginDaemon) -> plugindaemon.PluginDaemon:
    """The release's kubelet-plugin DaemonSet (:func:`release`), with the release's plugin RBAC
    and admission policies again for each test (the host-process plugin's steps apply the
    default render's)."""
    plugindaemon.restore_plugin_objects(release)
    return release


@pytest.fixture(scope="package")
def controller(release: plugindaemon.PluginDaemon) -> driver.ControllerDeployment:
    """The release's controller Deployment, rolled out, its webhook called by the API server
    through the webhook Service (kube-proxy)."""
    with step("the chart's controller runs in the cluster"):
        return driver.controller_deployment(release.plane, plugindaemon.release_manifest(release))


@pytest.fixture(scope="package")
def webhook(controller: driver.ControllerDeployment) -> str:
    """The name of the release's ValidatingWebhookConfiguration, once the API server calls it."""
    return controller.webhook_configuration
