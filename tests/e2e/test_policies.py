"""The chart's ValidatingAdmissionPolicies evaluated by a real kube-apiserver on requests made
with the kubelet plugin's token of node A (bound to a pod on that node): it may not write a
ResourceSlice of node B, nor create an MPS daemon pod with another image, a host path outside
the MPS root or a host namespace; the daemon pod it makes for its own node is admitted. A token of
the same ServiceAccount bound to no pod (so naming no node) may write no slice at all."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.controller.helpers import gpu_uuid, node_slice
from tests.e2e.controlplane import ControlPlane, write_kubeconfig
from tests.e2e.driver import NAMESPACE, apply
from tests.e2e.node import RunningPlugin, daemon_pod_of, plugin_account, plugin_objects
from tests.e2e.processes import step, wait_until

OTHER_NODE = "e2e-other-node"


def _as_plugin(
    plane: ControlPlane, plugin: RunningPlugin, doc: dict[str, Any], *args: str
) -> tuple[bool, str]:
    """``kubectl create`` ``doc`` with the plugin's token; (admitted, kubectl's output)."""
    result = plane.kubectl(
        "create",
        *args,
        "-f",
        "-",
        stdin=yaml.safe_dump(doc),
        kubeconfig=plugin.kubeconfig,
        check=False,
    )
    return result.returncode == 0, (result.stdout + result.stderr).strip()


def test_plugin_cannot_write_another_nodes_slice(crds: ControlPlane, plugin: RunningPlugin) -> None:
    answer: list[str] = []

    def denied() -> bool:
        admitted, out = _as_plugin(crds, plugin, node_slice(OTHER_NODE, 1), "--dry-run=server")
        answer[:] = [out]
        return not admitted and "ValidatingAdmissionPolicy" in out

    # Polled: the policies may take a moment to become effective after they are applied.
    wait_until(denied, "a slice of node B is denied", "the policy's denial")
    with step("the denial names both nodes", "kubectl create -f slice-of-node-b.yaml"):
        assert (
            "ValidatingAdmissionPolicy 'sharegpu-kubelet-plugin-resourceslices' with binding "
            "'sharegpu-kubelet-plugin-resourceslices' denied request: "
            f"the sharegpu kubelet plugin on node {plugin.node} may only write ResourceSlices "
            f'with spec.nodeName {plugin.node}, not "{OTHER_NODE}"'
        ) in answer[0], answer[0]
    own = node_slice(plugin.node, 1)
    own["metadata"]["name"] = f"{plugin.node}-extra"
    admitted, out = _as_plugin(crds, plugin, own, "--dry-run=server")
    with step("a slice of its own node is admitted", "kubectl create --dry-run=server"):
        assert admitted, out


def _host_path(pod: dict[str, Any], path: str) -> None:
    pod["spec"]["volumes"].append({"name": "extra", "hostPath": {"path": path}})


HOST_NAMESPACES = (
    "an MPS daemon pod runs as the default ServiceAccount with automountServiceAccountToken "
    "false, and in no host network, PID or IPC namespace"
)
#: The chart's MPS daemon pod policy, as the API server names it in a denial.
POD_POLICY = "ValidatingAdmissionPolicy 'sharegpu-mps-pods' with binding 'sharegpu-mps-pods'"
#: A change to the well-formed daemon pod, and the policy's message that denies it.
BAD_PODS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "another image": (
        lambda p: p["spec"]["containers"][0].update(image="attacker/tool:1"),
        "an MPS daemon pod may only run the image {image}",
    ),
    "a hostPath outside the MPS root": (
        lambda p: _host_path(p, "/etc/kubernetes"),
        "an MPS daemon pod may only mount emptyDir volumes and the host paths /dev, ",
    ),
    "a Secret in its environment": (
        lambda p: (
            p["spec"]["containers"][0]
            .setdefault("env", [])
            .append({"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}})
        ),
        "an MPS daemon pod may not read Secrets or ConfigMaps",
    ),
    "envFrom a Secret": (
        lambda p: p["spec"]["containers"][0].update(envFrom=[{"secretRef": {"name": "s"}}]),
        "an MPS daemon pod may not read Secrets or ConfigMaps",
    ),
    "hostPID": (
        lambda p: p["spec"].update(hostPID=True),
        HOST_NAMESPACES,
    ),
    "hostNetwork": (
        lambda p: p["spec"].update(hostNetwork=True),
        HOST_NAMESPACES,
    ),
}


@pytest.fixture(scope="module")
def daemon_pod(
    crds: ControlPlane, plugin: RunningPlugin, chart: list[dict[str, Any]]
) -> dict[str, Any]:
    """The MPS daemon pod the plugin would create for its node, once the API server admits it
    (dry run; the policies and the namespace's default ServiceAccount in place). The default
    render's policies (an NVML node's) are applied first: the release's steps put the release's
    (mock backend) back."""
    apply(crds, plugin_objects(chart), "apply the default render's plugin policies", force=True)
    pod = daemon_pod_of(chart, plugin.node, gpu_uuid(plugin.node, 0))
    answer: list[str] = []

    def admitted() -> bool:
        ok, out = _as_plugin(crds, plugin, pod, "--dry-run=server")
        answer[:] = [out]
        return ok

    wait_until(admitted, "the well-formed daemon pod is admitted", "an admitted dry run")
    assert f"pod/{pod['metadata']['name']} created (server dry run)" in answer[0], answer[0]
    return pod


@pytest.mark.parametrize("change", sorted(BAD_PODS))
def test_plugin_cannot_create_a_bad_daemon_pod(
    crds: ControlPlane, plugin: RunningPlugin, daemon_pod: dict[str, Any], change: str
) -> None:
    pod = copy.deepcopy(daemon_pod)
    mutate, message = BAD_PODS[change]
    mutate(pod)
    admitted, out = _as_plugin(crds, plugin, pod, "--dry-run=server")
    image = daemon_pod["spec"]["containers"][0]["image"]
    with step(f"a daemon pod with {change} is denied", "kubectl create --dry-run=server"):
        assert not admitted, out
        assert f"{POD_POLICY} denied request: {message.format(image=image)}" in out, out


def test_plugin_cannot_create_a_daemon_pod_for_another_node(
    crds: ControlPlane, plugin: RunningPlugin, chart: list[dict[str, Any]]
) -> None:
    pod = daemon_pod_of(chart, OTHER_NODE, gpu_uuid(OTHER_NODE, 0))
    admitted, out = _as_plugin(crds, plugin, pod, "--dry-run=server")
    with step("a daemon pod for node B is denied", "kubectl create --dry-run=server"):
        assert not admitted, out
        assert (
            f"{POD_POLICY} denied request: the sharegpu kubelet plugin on node {plugin.node} "
            "may only create or delete MPS daemon pods"
        ) in out, out


def test_plugin_cannot_take_another_nodes_daemon_pod_name(
    crds: ControlPlane, plugin: RunningPlugin, daemon_pod: dict[str, Any]
) -> None:
    """Pinned to its own node, but named as node B's daemon: B could then never start it."""
    pod = copy.deepcopy(daemon_pod)
    name = pod["metadata"]["name"]
    pod["metadata"]["name"] = name.replace(f"-{plugin.node}-", f"-{OTHER_NODE}-")
    assert pod["metadata"]["name"] != name
    admitted, out = _as_plugin(crds, plugin, pod, "--dry-run=server")
    with step("a daemon pod named for node B is denied", "kubectl create --dry-run=server"):
        assert not admitted, out
        assert (
            f"{POD_POLICY} denied request: the sharegpu kubelet plugin on node {plugin.node} "
            "may only create MPS daemon pods named"
        ) in out, out


def test_a_token_without_a_node_cannot_write_slices(
    crds: ControlPlane, plugin: RunningPlugin, chart: list[dict[str, Any]]
) -> None:
    token = crds.kubectl(
        "create",
        "token",
        plugin_account(chart),
        f"--namespace={NAMESPACE}",
        step_name="issue a token of the plugin's ServiceAccount bound to no pod",
    ).stdout.strip()
    kubeconfig = write_kubeconfig(
        crds.work / "unbound-plugin.kubeconfig", crds.server, crds.pki.ca_file, token=token
    )
    own = node_slice(plugin.node, 1)
    own["metadata"]["name"] = f"{plugin.node}-unbound"
    answer: list[str] = []

    def denied() -> bool:
        result = crds.kubectl(
            "create",
            "--dry-run=server",
            "-f",
            "-",
            stdin=yaml.safe_dump(own),
            kubeconfig=kubeconfig,
            check=False,
        )
        answer[:] = [result.stdout + result.stderr]
        return result.returncode != 0 and "ValidatingAdmissionPolicy" in result.stderr

    # Polled: the policies may take a moment to become effective after they are applied.
    wait_until(denied, "a token naming no node is denied", "the policy's denial")
    with step("the denial says why", "kubectl create --dry-run=server"):
        assert (
            "denied request: the sharegpu kubelet plugin must authenticate with its pod's "
            "ServiceAccount token, which names the node"
        ) in answer[0], answer[0]


#: A namespace of its own: no GpuQuota of another test applies to its claims.
CLAIMS_NAMESPACE = "claim-status"


def _allocated_claim(crds: ControlPlane, name: str, node: str) -> dict[str, Any]:
    """A claim of the driver, allocated (by the admin, as the scheduler would) on ``node``."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": CLAIMS_NAMESPACE},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.sharegpu.dev"}}]
            }
        },
    }
    crds.kubectl("create", "namespace", CLAIMS_NAMESPACE, step_name="namespace", check=False)
    crds.kubectl("create", "-f", "-", stdin=yaml.safe_dump(claim), step_name=f"create {name}")
    got = crds.kubectl(
        "get", "resourceclaim", name, "-n", CLAIMS_NAMESPACE, "-o", "yaml", step_name=f"get {name}"
    )
    stored = yaml.safe_load(got.stdout)
    stored["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": "gpu.sharegpu.dev",
                        "pool": node,
                        "device": "gpu-0",
                    }
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    updated = crds.kubectl(
        "replace",
        "--subresource=status",
        "-f",
        "-",
        "-o",
        "yaml",
        stdin=yaml.safe_dump(stored),
        step_name=f"allocate {name} on {node}",
    ).stdout
    allocated: dict[str, Any] = yaml.safe_load(updated)
    return allocated


def _usage_written(claim: dict[str, Any], node: str) -> dict[str, Any]:
    written = copy.deepcopy(claim)
    written["status"]["devices"] = [
        {
            "driver": "gpu.sharegpu.dev",
            "pool": node,
            "device": "gpu-0",
            "data": {"usedMemory": "1Gi"},
        }
    ]
    return written


def test_plugin_writes_usage_only_into_its_own_nodes_claims(
    crds: ControlPlane, plugin: RunningPlugin
) -> None:
    """The plugin's usage write (update resourceclaims/status, which RBAC grants cluster-wide) is
    admitted for a claim allocated on its node and refused for one on another node (by the
    chart's claim-status policy on 1.34/1.35, also by the granular status authorization where it
    is on)."""
    own = _allocated_claim(crds, "usage-own", plugin.node)
    other = _allocated_claim(crds, "usage-other", OTHER_NODE)
    try:
        answer: list[str] = []

        def admitted() -> bool:
            ok, out = _replace_status_as_plugin(crds, plugin, _usage_written(own, plugin.node))
            answer[:] = [out]
            return ok

        wait_until(admitted, "usage into a claim of its node is admitted", "an admitted dry run")
        ok, out = _replace_status_as_plugin(crds, plugin, _usage_written(other, OTHER_NODE))
        with step(
            "usage into another node's claim is denied", "kubectl replace --subresource=status"
        ):
            assert not ok, out
            assert "forbidden" in out.lower() or "denied request" in out, out
    finally:
        crds.kubectl(
            "delete",
            "resourceclaim",
            "usage-own",
            "usage-other",
            "-n",
            CLAIMS_NAMESPACE,
            "--ignore-not-found",
            step_name="cleanup",
        )


def _replace_status_as_plugin(
    plane: ControlPlane, plugin: RunningPlugin, claim: dict[str, Any]
) -> tuple[bool, str]:
    result = plane.kubectl(
        "replace",
        "--subresource=status",
        "--dry-run=server",
        "-f",
        "-",
        stdin=yaml.safe_dump(claim),
        kubeconfig=plugin.kubeconfig,
        check=False,
    )
    return result.returncode == 0, (result.stdout + result.stderr).strip()
