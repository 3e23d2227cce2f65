"""The run's sealed network namespace with the node running: nothing inside reaches out, every
process of the run is inside, and kube-proxy's Services work for pods and for the node's own
processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.e2e.claims import busybox_pod
from tests.e2e.kubelet import BUSYBOX_IMAGE, RealNode
from tests.e2e.netns import KUBERNETES_SERVICE_IP, SEAL_PROBES, SealedNetwork
from tests.e2e.processes import step, wait_until

NAMESPACE = "e2e-network"


def test_the_namespace_stays_sealed_with_kube_proxy_and_pods(real_node: RealNode) -> None:
    """The probes of the first step again, now that kube-proxy programs Services and the pod
    bridge exists: each still fails at once (refused or unreachable), none answers or times
    out."""
    network = real_node.plane.network
    with step("the seal was proven before anything started", "ControlPlane.start"):
        assert len(real_node.plane.seal) == len(SEAL_PROBES), real_node.plane.seal
    with step("prove the seal with the node running", f"connect from {network.name}"):
        lines = network.prove_sealed(SEAL_PROBES)
        assert len(lines) == len(SEAL_PROBES), lines


def _processes_naming(directories: tuple[Path, ...]) -> dict[int, str]:
    """PID -> command line of every process on the machine whose command line names one of
    ``directories`` (what the run started), this test process excepted."""
    found = {}
    marks = tuple(str(d).encode() for d in directories)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if any(mark in cmdline for mark in marks):
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def _parent(pid: int) -> int:
    """The parent of ``pid`` (0 when it is gone or has none)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))


def _inside(network: SealedNetwork, pid: int) -> bool:
    """Whether ``pid`` runs in the sealed namespace, or in a pod's namespace: one other than the
    machine's, entered by a process of the sealed namespace (its shim) among its ancestors."""
    if network.holds(pid):
        return True
    try:
        if os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino:
            return False
    except OSError:
        return True  # gone meanwhile
    ancestor = _parent(pid)
    while ancestor > 1:
        if network.holds(ancestor):
            return True
        ancestor = _parent(ancestor)
    return False


def test_every_process_of_the_run_is_inside_the_namespace(real_node: RealNode) -> None:
    """etcd, the control plane, containerd and its shims, the kubelet, kube-proxy, any daemon the
    run started and the pods' processes: every process whose command line names the run's
    directories runs in the sealed namespace or in a pod's namespace inside it, never in the
    machine's, so none of them can dial the cluster's addresses from outside."""
    plane = real_node.plane
    started = {p.pid: " ".join(p.argv) for p in plane.processes.started if p.running()}
    named = _processes_naming((plane.work, real_node.root))
    with step("every process of the run is in the sealed namespace", "/proc/<pid>/ns/net"):
        assert {"etcd", "kube-apiserver", "kubelet", "kube-proxy", "containerd"} <= {
            p.name for p in plane.processes.started
        }
        outside = {
            pid: cmd
            for pid, cmd in {**started, **named}.items()
            if Path(f"/proc/{pid}").exists() and not _inside(plane.network, pid)
        }
        assert outside == {}, outside


def test_a_pod_reaches_the_api_server_through_the_kubernetes_service(real_node: RealNode) -> None:
    """A pod on the pod network connects to the ``kubernetes`` Service's ClusterIP (the address
    its ``KUBERNETES_SERVICE_HOST`` names); kube-proxy forwards it to the API server."""
    plane = real_node.plane
    real_node.import_busybox([BUSYBOX_IMAGE], "import the busybox image")
    plane.create_namespace(NAMESPACE)
    script = (
        'echo "service $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"; '
        "nc -w 10 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT </dev/null "
        "&& echo reached || echo unreachable; exec sleep 3600"
    )
    pod = busybox_pod("reach-api", NAMESPACE, real_node.name, ["sh", "-c", script])
    plane.kubectl("apply", "-f", "-", stdin=json.dumps(pod), step_name="create a pod")
    try:
        plane.kubectl(
            "wait",
            "--for=condition=Ready",
            "pod/reach-api",
            "-n",
            NAMESPACE,
            "--timeout=180s",
            step_name="the pod runs",
        )

        def logged() -> str:
            return plane.kubectl("logs", "reach-api", "-n", NAMESPACE).stdout

        wait_until(lambda: "reach" in logged(), "the pod's probe", "its result in the log")
        with step("the pod reaches kubernetes.default", "kubectl logs reach-api"):
            out = logged()
            assert f"service {KUBERNETES_SERVICE_IP}:443" in out, out
            assert "reached" in out.splitlines(), out
    finally:
        plane.kubectl(
            "delete", "namespace", NAMESPACE, "--wait=false", step_name="cleanup", check=False
        )
