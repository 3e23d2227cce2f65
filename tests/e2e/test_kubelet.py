"""A real kubelet and containerd against the real control plane: the node registers and turns
Ready, a pod of an image imported without a registry runs, and the API server reaches the kubelet
for ``kubectl logs`` and ``kubectl exec``."""

from __future__ import annotations

import json

from tests.e2e.claims import busybox_pod
from tests.e2e.kubelet import BUSYBOX_IMAGE, RealNode
from tests.e2e.netns import NODE_IP
from tests.e2e.processes import step

NAMESPACE = "e2e-kubelet"
IMAGE = BUSYBOX_IMAGE


def test_node_registers_ready_with_its_node_address(real_node: RealNode) -> None:
    code, node = real_node.plane.request("GET", f"/api/v1/nodes/{real_node.name}")
    with step("the kubelet's Node object", f"GET /api/v1/nodes/{real_node.name}"):
        assert code == 200, node
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addresses == {"Hostname": real_node.name, "InternalIP": NODE_IP}, addresses
        assert real_node.ready()
        taints = [t["key"] for t in node["spec"].get("taints", [])]
        assert "node.kubernetes.io/not-ready" not in taints, taints


def test_pod_runs_and_kubectl_reaches_the_kubelet(real_node: RealNode) -> None:
    plane = real_node.plane
    real_node.import_busybox([IMAGE], "import the busybox image")
    plane.create_namespace(NAMESPACE)
    pod = busybox_pod(
        "hello",
        NAMESPACE,
        real_node.name,
        ["sh", "-c", "echo hello from the node; exec sleep 3600"],
    )
    plane.kubectl("apply", "-f", "-", stdin=json.dumps(pod), step_name="create a pod")
    plane.kubectl(
        "wait",
        "--for=condition=Ready",
        "pod/hello",
        "-n",
        NAMESPACE,
        "--timeout=180s",
        step_name="the pod runs on the real kubelet",
    )
    logs = plane.kubectl("logs", "hello", "-n", NAMESPACE, step_name="kubectl logs").stdout
    with step("kubectl logs through the kubelet", "kubectl logs hello"):
        assert logs.strip() == "hello from the node", logs
    out = plane.kubectl(
        "exec", "hello", "-n", NAMESPACE, "--", "cat", "/etc/hostname", step_name="kubectl exec"
    ).stdout
    with step("kubectl exec through the kubelet", "kubectl exec hello -- cat /etc/hostname"):
        assert out.strip() == "hello", out
    plane.kubectl(
        "delete",
        "pod",
        "hello",
        "-n",
        NAMESPACE,
        "--wait=true",
        "--timeout=120s",
        step_name="delete the pod",
    )
