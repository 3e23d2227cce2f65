"""A local cluster to try sharegpu with kubectl, no docker needed: ``python -m tests.e2e.cluster``
(``make local-cluster``).

It starts what ``make e2e`` tests, in a sealed network namespace of its own: etcd, the control
plane, a real node (containerd, the kubelet, kube-proxy) from the cached upstream binaries, the
CRDs, and the chart installed with ``helm install`` and its defaults (the controller Deployment
and its webhook, the kubelet-plugin DaemonSet on 8 mock GPUs, the driver's image of
``make image`` imported into the node's containerd). It writes ``kubectl`` and ``helm`` wrappers
that run inside the namespace with the admin kubeconfig and a ``ctr`` wrapper for the node's
containerd, prints the ``PATH`` to use and runs until Ctrl-C or SIGTERM; then it uninstalls the
release and stops every process it started by its PID, and removes the namespace.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from tests.deploy.helpers import helm_binary
from tests.e2e import driver, images, plugindaemon
from tests.e2e.binaries import (
    CONTROL_PLANE,
    NODE,
    bin_dir,
    missing_binaries,
    missing_prerequisites,
)
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import BUSYBOX_IMAGE, RealNode, missing_node_prerequisites
from tests.e2e.netns import missing_network_prerequisites
from tests.e2e.processes import StepFailed, interrupt_on_signals

#: What the wrappers run: kubectl and helm inside the cluster's network namespace, ctr against
#: the node's containerd.
WRAPPED: Final = ("kubectl", "helm", "ctr")


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``python -m tests.e2e.cluster``."""
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.cluster", description=__doc__)
    parser.add_argument("--work", type=Path, help="work directory (default: a new temporary one)")
    return parser


def _wrapper(name: str, argv: list[str], exports: str) -> str:
    return (
        "#!/bin/sh\n"
        f"# {name} of the sharegpu local cluster.\n"
        f"{exports}"
        f'exec {shlex.join(argv)} "$@"\n'
    )


def write_wrappers(plane: ControlPlane, helm: str, node: RealNode, directory: Path) -> Path:
    """``kubectl`` and ``helm`` scripts in ``directory`` that run the run's binaries inside the
    cluster's network namespace with the admin kubeconfig, and ``ctr`` against the node's
    containerd (``ctr -n k8s.io images import`` as on any containerd node); returns
    ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    kubeconfig = f"export KUBECONFIG={shlex.quote(str(plane.admin_kubeconfig))}\n"
    scripts = {
        "kubectl": _wrapper(
            "kubectl", plane.network.argv([str(plane.bin / "kubectl")]), kubeconfig
        ),
        "helm": _wrapper("helm", plane.network.argv([helm]), kubeconfig),
        "ctr": _wrapper("ctr", [str(plane.bin / "ctr"), f"--address={node.socket}"], ""),
    }
    for name in WRAPPED:
        script = directory / name
        script.write_text(scripts[name])
        script.chmod(0o755)
    return directory


def missing() -> list[str]:
    """What the local cluster needs and this machine lacks."""
    problems = [*missing_prerequisites(), *missing_network_prerequisites()]
    problems += missing_node_prerequisites() + images.missing_tools()
    absent = missing_binaries((*CONTROL_PLANE, *NODE))
    if absent:
        problems.append(f"binaries not built: {', '.join(absent)} (make local-cluster builds them)")
    if helm_binary() is None:
        problems.append("helm not found (bash tests/install-helm.sh installs it)")
    return problems


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A running local cluster: the control plane, the node and the chart's release."""

    plane: ControlPlane
    node: RealNode
    daemon: plugindaemon.PluginDaemon


@contextmanager
def running_cluster(work: Path, helm: str, values: Sequence[str] = ()) -> Iterator[Cluster]:
    """The control plane, a real node with the busybox image, the CRDs and the chart installed
    with ``values`` (``--set`` overrides) and its controller Deployment up. On exit, or when a
    step fails, the release is uninstalled and every process stopped by its PID, the namespace
    removed, whatever of it had started."""
    plane = ControlPlane(bin_dir(), work)
    node: RealNode | None = None
    daemon: plugindaemon.PluginDaemon | None = None
    try:
        plane.start()
        driver.apply_crds(plane)
        chart = driver.render_chart(helm)
        node = RealNode(plane)
        node.start()
        node.import_busybox([BUSYBOX_IMAGE], "import the busybox image")
        daemon = plugindaemon.install(helm, plane, node, chart, tuple(values))
        driver.controller_deployment(plane, plugindaemon.release_manifest(daemon))
        yield Cluster(plane, node, daemon)
    finally:
        if daemon is not None:
            plugindaemon.uninstall(daemon)
        if node is not None:
            node.stop()
        plane.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the local cluster until interrupted; returns the exit code."""
    args = build_parser().parse_args(argv)
    problems = missing()
    helm = helm_binary()
    if problems or helm is None:
        print("local cluster cannot start: " + "; ".join(problems), file=sys.stderr)
        return 1
    work = args.work or Path(tempfile.mkdtemp(prefix="sharegpu-cluster-"))
    work.mkdir(parents=True, exist_ok=True)
    interrupt_on_signals()
    print("starting the control plane, a node and the chart (a few minutes) ...", flush=True)
    try:
        with running_cluster(work, helm) as cluster:
            wrappers = write_wrappers(cluster.plane, helm, cluster.node, work / "bin")
            print(
                f"local cluster running in the network namespace {cluster.plane.network.name} "
                f"(logs in {work / 'logs'}); in another shell, as root, from the checkout:\n"
                f"  export PATH={wrappers}:$PATH\n"
                "  kubectl get gpus; kubectl get pods -n sharegpu-system\n"
                "  ctr -n k8s.io images import dist/sharegpu-image.tar   # after `make image`\n"
                "Ctrl-C stops it and removes the namespace.",
                flush=True,
            )
            while True:
                cluster.plane.check_running("local cluster")
                time.sleep(2)
    except KeyboardInterrupt:
        return 0
    except StepFailed as exc:
        print(exc, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
