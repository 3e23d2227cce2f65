"""The install documentation run as written: each command of the shell blocks README.md and
docs/install.md mark to run (:mod:`tests.docs.runnable`), in order, through the ``kubectl``,
``helm`` and ``ctr`` wrappers ``make local-cluster`` writes, against the run's cluster (the same
control plane, node and release as ``make local-cluster``); and the documented installation
where the CRDs were applied earlier."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.docs.runnable import Command, all_commands
from tests.e2e.cluster import write_wrappers
from tests.e2e.driver import ControllerDeployment
from tests.e2e.plugindaemon import PluginDaemon
from tests.e2e.processes import step
from tests.paths import REPO_ROOT

#: Commands the pages say fail, and the words their output must hold.
EXPECTED_FAILURES = {
    "kubectl apply -f examples/gpu-quota/quota-claims.yaml": ("share-a", "team-gpus"),
}


def _wrappers(release: PluginDaemon) -> dict[str, str]:
    wrappers = write_wrappers(
        release.plane, release.helm, release.node, release.plane.work / "local-cluster-bin"
    )
    return {**os.environ, "PATH": f"{wrappers}:{os.environ.get('PATH', '')}"}


def test_the_pages_mark_the_commands_they_promise() -> None:
    commands = {c.bare for c in all_commands()}
    for promised in (
        "make demo",
        "make image",
        "podman load -i dist/sharegpu-image.tar",
        "ctr -n k8s.io images import dist/sharegpu-image.tar",
        "kubectl get gpus",
        *EXPECTED_FAILURES,
    ):
        assert promised in commands, promised


@pytest.mark.parametrize("command", all_commands(), ids=lambda c: f"{c.page}:{c.line}")
def test_documented_command(
    controller: ControllerDeployment, release: PluginDaemon, command: Command
) -> None:
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command.text],
        cwd=REPO_ROOT,
        env=_wrappers(release),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = result.stdout + result.stderr
    with step(f"{command.page}:{command.line}: {command.text}", command.text):
        if command.bare in EXPECTED_FAILURES:
            assert result.returncode == 1, output
            assert all(word in output for word in EXPECTED_FAILURES[command.bare]), output
        else:
            assert result.returncode == 0, output
        if command.bare == "kubectl get gpus":
            rows = [line for line in output.splitlines() if " e2e-node " in f" {line} "]
            assert len(rows) >= 8, output
        if command.bare in (
            "kubectl get pods -n sharegpu-system",
            "kubectl -n sharegpu-system get pods",
        ):
            assert output.count("Running") >= 3, output
        if command.bare.startswith("podman load"):
            loaded = f"docker.io/library/{release.image}"
            # the host's podman storage keeps nothing of the run
            subprocess.run(["podman", "rmi", loaded], capture_output=True, timeout=120)
            assert f"Loaded image: {loaded}" in output, output
        if command.bare.startswith("ctr ") and "import" in command.bare:
            listed = release.node.ctr("images", "ls", "-q").stdout.split()
            assert f"docker.io/library/{release.image}" in listed, listed


def test_wrappers_run_inside_the_namespace(release: PluginDaemon) -> None:
    plane = release.plane
    wrappers = Path(_wrappers(release)["PATH"].split(":", 1)[0])
    script = (wrappers / "kubectl").read_text()
    assert f"--net={plane.network.path}" in script and str(plane.admin_kubeconfig) in script
    assert f"--address={release.node.socket}" in (wrappers / "ctr").read_text()


def _gitops_install(release: PluginDaemon, *extra: str) -> subprocess.CompletedProcess[str]:
    """The documented ``helm install`` (as a dry run against the API server, under a release
    and namespace of its own) with ``extra`` flags."""
    argv = [
        release.helm, "install", "gitops-check", str(REPO_ROOT / "deploy/helm/sharegpu"),
        "--namespace", "gitops-check", "--create-namespace", "--dry-run=server",
        f"--kubeconfig={release.plane.admin_kubeconfig}", *extra,
    ]  # fmt: skip
    return release.plane.run(argv)


def test_helm_install_where_the_crds_were_applied_earlier(release: PluginDaemon) -> None:
    """docs/install.md's GitOps path: ``kubectl apply -f deploy/crds/`` then ``helm install``
    with ``crds.install=false`` raises no conflict on a CRD, where the plain install does."""
    plane = release.plane
    with step("kubectl apply -f deploy/crds/", "kubectl apply -f deploy/crds/"):
        plane.kubectl("apply", "-f", str(REPO_ROOT / "deploy" / "crds"))
    plain = _gitops_install(release)
    assert plain.returncode != 0 and "CustomResourceDefinition" in plain.stderr, plain.stderr
    gitops = _gitops_install(release, "--set", "crds.install=false")
    assert "CustomResourceDefinition" not in gitops.stderr + gitops.stdout, gitops.stderr
