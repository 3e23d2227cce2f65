"""The chart's ValidatingAdmissionPolicies evaluated on requests (tests/deploy/admissionpolicy.py,
sharegpu's Kubernetes CEL): what the plugin of one node may do with ResourceSlices and MPS daemon
pods, and what a compromised plugin pod may not."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeletplugin.sharing.daemonpods import daemon_pod
from kubeletplugin.sharing.daemons import DaemonSpec
from kubeletplugin.sharing.mpspaths import MpsPaths
from sharegpu.cel.environment import compile_expression
from tests.deploy.admissionpolicy import denials, user
from tests.deploy.helpers import render_chart

pytestmark = pytest.mark.helm

NAMESPACE = "gpu-operators"
PLUGIN = f"system:serviceaccount:{NAMESPACE}:sharegpu-kubelet-plugin"
NODE = "gpu-node-1"
UUID = "GPU-33c27bfa-6498-554f-8335-0c2ead16ec2f"


@pytest.fixture(scope="module")
def docs(helm: str) -> list[dict[str, Any]]:
    return render_chart(helm, namespace=NAMESPACE)


def policy(docs: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    [found] = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith(suffix)
    ]
    return found


def test_the_plugin_service_account_is_the_one_the_policies_match(
    docs: list[dict[str, Any]],
) -> None:
    [sa] = [
        d
        for d in docs
        if d["kind"] == "ServiceAccount" and d["metadata"]["name"].endswith("kubelet-plugin")
    ]
    assert f"system:serviceaccount:{NAMESPACE}:{sa['metadata']['name']}" == PLUGIN


def test_every_policy_is_bound_with_deny_and_matches_what_the_plugin_writes(
    docs: list[dict[str, Any]],
) -> None:
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(policies)
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    rules = {
        name: [
            (r["resources"], sorted(r["operations"]))
            for r in p["spec"]["matchConstraints"]["resourceRules"]
        ]
        for name, p in policies.items()
    }
    assert sorted(rules.values()) == [
        [(["pods"], ["CREATE", "DELETE", "UPDATE"])],
        [(["resourceclaims/status"], ["UPDATE"])],
        [(["resourceslices"], ["CREATE", "DELETE", "UPDATE"])],
    ]
    assert all(p["spec"]["failurePolicy"] == "Fail" for p in policies.values())


# --- ResourceSlices ------------------------------------------------------------------------------


def slice_of(
    node: str, pool: str | None = None, driver: str = "gpu.sharegpu.dev"
) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-gpu"},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": pool or node}},
    }


def slice_request(operation: str, node: str | None = NODE, name: str = PLUGIN) -> dict[str, Any]:
    return {"operation": operation, "userInfo": user(name, node)}


def test_the_plugin_may_write_its_own_nodes_slices(docs: list[dict[str, Any]]) -> None:
    p = policy(docs, "-resourceslices")
    own = slice_of(NODE)
    assert denials(p, slice_request("CREATE"), own) == []
    assert denials(p, slice_request("UPDATE"), own, own) == []
    assert denials(p, slice_request("DELETE"), None, own) == []


@pytest.mark.parametrize(
    ("operation", "obj", "old", "expected"),
    [
        ("CREATE", slice_of("other-node"), None, 'spec.nodeName gpu-node-1, not "other-node"'),
        ("CREATE", slice_of(NODE, pool="other-node"), None, 'of pool gpu-node-1, not "other-node"'),
        ("CREATE", slice_of(NODE, driver="gpu.nvidia.com"), None, 'not "gpu.nvidia.com"'),
        ("DELETE", None, slice_of("other-node"), 'not "other-node"'),
        # Taking over another node's slice by rewriting it is refused too.
        (
            "UPDATE",
            slice_of(NODE),
            slice_of("other-node"),
            "may only update ResourceSlices it owns",
        ),
    ],
)
def test_the_plugin_may_not_touch_other_nodes_slices(
    docs: list[dict[str, Any]],
    operation: str,
    obj: dict[str, Any] | None,
    old: dict[str, Any] | None,
    expected: str,
) -> None:
    found = denials(policy(docs, "-resourceslices"), slice_request(operation), obj, old)
    assert found and any(expected in m for m in found), found


def test_a_token_without_a_node_is_refused_and_other_users_are_out_of_scope(
    docs: list[dict[str, Any]],
) -> None:
    p = policy(docs, "-resourceslices")
    found = denials(p, slice_request("CREATE", node=None), slice_of(NODE))
    assert found and "must authenticate with its pod's ServiceAccount token" in found[0]
    assert denials(p, slice_request("CREATE", name="system:admin"), slice_of("x")) is None


# --- MPS daemon pods ---------------------------------------------------------------------------


def daemon_pod_for(docs: list[dict[str, Any]], node: str = NODE) -> dict[str, Any]:
    [cm] = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-mps-template")
    ]
    template = yaml.safe_load(cm["data"]["daemon-pod.yaml"])
    spec = DaemonSpec(
        MpsPaths.of(Path("/run/sharegpu/mps"), "claim-uid", UUID),
        {"CUDA_VISIBLE_DEVICES": UUID},
        uuid=UUID,
        claim_uid="claim-uid",
    )
    return daemon_pod(template, spec, namespace=NAMESPACE, node_name=node)


def pod_request(operation: str, node: str | None = NODE) -> dict[str, Any]:
    return {"operation": operation, "userInfo": user(PLUGIN, node)}


def test_the_daemon_pod_the_plugin_makes_is_allowed(docs: list[dict[str, Any]]) -> None:
    p = policy(docs, "-mps-pods")
    pod = daemon_pod_for(docs)
    assert denials(p, pod_request("CREATE"), pod) == []
    scheduled = copy.deepcopy(pod)
    scheduled["spec"]["nodeName"] = NODE
    assert denials(p, pod_request("DELETE"), None, scheduled) == []


def _host_path(pod: dict[str, Any], path: str) -> None:
    pod["spec"]["volumes"].append({"name": "x", "hostPath": {"path": path}})


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda p: p["spec"]["containers"][0].update(image="attacker/tool:1"),
            "may only run the image",
        ),
        (
            lambda p: p["spec"]["initContainers"][0].update(image="busybox"),
            "may only run the image",
        ),
        (
            lambda p: p["spec"].update(serviceAccountName="sharegpu-controller"),
            "default ServiceAccount",
        ),
        (lambda p: p["spec"].update(automountServiceAccountToken=True), "default ServiceAccount"),
        (lambda p: p["spec"].update(hostPID=True), "host network, PID or IPC"),
        (
            lambda p: p["spec"].update(priorityClassName="system-node-critical"),
            "runs at the priority class",
        ),
        (lambda p: p["spec"].pop("priorityClassName"), "runs at the priority class"),
        (lambda p: p["spec"].update(hostNetwork=True), "host network, PID or IPC"),
        (lambda p: _host_path(p, "/"), "may only mount"),
        (lambda p: _host_path(p, "/etc/kubernetes"), "may only mount"),
        (lambda p: _host_path(p, "/run/sharegpu/mps/../../../etc"), "may only mount"),
        (
            lambda p: p["spec"]["volumes"].append({"name": "s", "secret": {"secretName": "x"}}),
            "may only mount",
        ),
        (
            lambda p: p["spec"]["containers"][0]["env"].append(
                {"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
            ),
            "may not read Secrets or ConfigMaps",
        ),
        (
            lambda p: p["spec"]["containers"][0]["env"].append(
                {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}
            ),
            "may not read Secrets or ConfigMaps",
        ),
        (
            lambda p: p["spec"]["containers"][0].update(envFrom=[{"secretRef": {"name": "s"}}]),
            "may not read Secrets or ConfigMaps",
        ),
        (
            lambda p: p["spec"]["initContainers"][0].update(
                envFrom=[{"configMapRef": {"name": "c"}}]
            ),
            "may not read Secrets or ConfigMaps",
        ),
        (
            lambda p: p["metadata"]["labels"].pop("app.kubernetes.io/component"),
            "may only create or delete MPS daemon pods",
        ),
        (lambda p: p["spec"].update(nodeName="other-node"), "pinned to that node"),
        (
            lambda p: p["metadata"]["annotations"].update(
                {"mps.sharegpu.dev/node-name": "other-node"}
            ),
            "annotated mps.sharegpu.dev/node-name",
        ),
        (
            lambda p: p["metadata"]["annotations"].pop("mps.sharegpu.dev/node-name"),
            "annotated mps.sharegpu.dev/node-name",
        ),
        (
            lambda p: p["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"].append({"matchFields": []}),
            "pinned to that node",
        ),
    ],
)
def test_a_compromised_plugin_cannot_create_other_pods(
    docs: list[dict[str, Any]], change: Any, expected: str
) -> None:
    pod = daemon_pod_for(docs)
    change(pod)
    found = denials(policy(docs, "-mps-pods"), pod_request("CREATE"), pod)
    assert found and any(expected in m for m in found), found


def test_daemon_pods_of_other_nodes_can_be_neither_created_nor_deleted(
    docs: list[dict[str, Any]],
) -> None:
    p = policy(docs, "-mps-pods")
    other = daemon_pod_for(docs, node="other-node")
    for operation, obj, old in (("CREATE", other, None), ("DELETE", None, other)):
        found = denials(p, pod_request(operation), obj, old)
        assert found and "pinned to that node" in found[0], found
    # Nor can any other pod of the namespace be deleted, or a pod be updated.
    workload = {"metadata": {"labels": {}}, "spec": {"containers": [{"image": "x"}]}}
    assert denials(p, pod_request("DELETE"), None, workload)
    pod = daemon_pod_for(docs)
    assert any("not update pods" in m for m in denials(p, pod_request("UPDATE"), pod, pod) or [])


def _named_for(pod: dict[str, Any], name: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["metadata"]["name"] = name
    return pod


@pytest.mark.parametrize("node", [NODE, "n", "gpu-7.rack-3.example.com", "x" * 198])
def test_every_name_the_plugin_gives_its_daemon_pods_is_allowed(
    docs: list[dict[str, Any]], node: str
) -> None:
    """The plugin's naming (kubeletplugin.sharing.daemonpods.pod_name) and the policy's agree,
    for short, dotted and the longest node names a pod name has room for."""
    pod = daemon_pod_for(docs, node=node)
    assert denials(policy(docs, "-mps-pods"), pod_request("CREATE", node=node), pod) == []


def test_a_node_cannot_squat_another_nodes_daemon_pod_name(docs: list[dict[str, Any]]) -> None:
    """Node A's plugin creating, pinned to node A, the pod name of node B's daemon would keep B
    from ever starting that daemon (B never adopts a pod that is not its own)."""
    p = policy(docs, "-mps-pods")
    own = daemon_pod_for(docs)
    daemon = own["metadata"]["name"].rsplit("-", 1)[1]
    names = [
        daemon_pod_for(docs, node="other-node")["metadata"]["name"],
        # a node whose name ends with this node's name: the length check tells them apart
        daemon_pod_for(docs, node=f"rack-{NODE}")["metadata"]["name"],
        f"sharegpu-mps-{NODE}-{daemon}-x",
        f"sharegpu-mps-{NODE}-{daemon[:-1]}",
        f"sharegpu-mps-{NODE}-{daemon[:-1]}G",
        f"sharegpu-mps-{NODE}x{daemon}",
        f"other-mps-{NODE}-{daemon}",
        "",
    ]
    for name in names:
        found = denials(p, pod_request("CREATE"), _named_for(own, name))
        assert found and any("may only create MPS daemon pods named" in m for m in found), name


def test_the_daemon_pod_name_follows_the_release_name(helm: str) -> None:
    docs = render_chart(helm, release="gpus", namespace=NAMESPACE)
    p = policy(docs, "-mps-pods")
    pod = daemon_pod_for(docs)
    assert pod["metadata"]["name"].startswith(f"gpus-sharegpu-mps-{NODE}-")
    plugin = f"system:serviceaccount:{NAMESPACE}:gpus-sharegpu-kubelet-plugin"
    request = {"operation": "CREATE", "userInfo": user(plugin, NODE)}
    assert denials(p, request, pod) == []
    found = denials(p, request, _named_for(pod, pod["metadata"]["name"].removeprefix("gpus-")))
    assert found and "may only create MPS daemon pods named gpus-sharegpu-mps-" in found[0]


def test_the_pod_policy_follows_the_mps_root_and_the_driver_root(helm: str) -> None:
    docs = render_chart(
        helm,
        "--set",
        "kubeletPlugin.mps.hostRoot=/run/gpu-mps",
        "--set",
        "kubeletPlugin.driverRoot=/run/nvidia/driver",
        namespace=NAMESPACE,
    )
    p = policy(docs, "-mps-pods")
    pod = daemon_pod_for(docs)
    for volume in pod["spec"]["volumes"]:
        path = volume.get("hostPath", {}).get("path", "")
        if path.startswith("/run/sharegpu/mps/"):
            volume["hostPath"]["path"] = path.replace("/run/sharegpu/mps/", "/run/gpu-mps/")
    assert denials(p, pod_request("CREATE"), pod) == []
    _host_path(pod, "/run/sharegpu/mps/x")
    assert denials(p, pod_request("CREATE"), pod)


@pytest.mark.parametrize("suffix", ["-resourceslices", "-mps-pods", "-claim-status"])
def test_every_expression_type_checks_with_the_node_name_a_string(
    docs: list[dict[str, Any]], suffix: str
) -> None:
    """kube-apiserver types ``variables.userNodeName`` as a string (from ``request.userInfo``)
    and refuses a policy whose literal mixes it, inside a list, with strings (a map literal
    ``{'key': 'metadata.name', 'values': [variables.userNodeName]}``: "expected type 'string'
    but found 'list(string)'"). Here it is ``dyn`` unless replaced by a string literal."""
    p = policy(docs, suffix)
    spec = p["spec"]
    expressions = [v["expression"] for v in spec["variables"]]
    expressions += [v["expression"] for v in spec["validations"]]
    expressions += [v["messageExpression"] for v in spec["validations"] if "messageExpression" in v]
    for expression in expressions:
        typed = expression.replace("variables.userNodeName", "'gpu-node-1'")
        compile_expression(
            typed, {"request": "dyn", "object": "dyn", "oldObject": "dyn", "variables": "dyn"}
        )


# --- claim status ------------------------------------------------------------------------------

DRIVER = "gpu.sharegpu.dev"


def claim_on(node: str, devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A claim allocated on ``node`` (the node selector the scheduler writes for node-local
    devices), with ``status.devices``."""
    return {
        "metadata": {"name": "c", "namespace": "team-a"},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node}]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
            "devices": devices or [],
        },
    }


def usage_written(claim: dict[str, Any], driver: str = DRIVER) -> dict[str, Any]:
    """``claim`` with a usage entry of ``driver`` added to ``status.devices``."""
    updated = copy.deepcopy(claim)
    updated["status"]["devices"].append(
        {"driver": driver, "pool": "p", "device": "gpu-0", "data": {"usedMemory": "1Gi"}}
    )
    return updated


def test_the_plugin_may_write_usage_into_its_own_nodes_claims(docs: list[dict[str, Any]]) -> None:
    p = policy(docs, "-claim-status")
    old = claim_on(NODE)
    assert denials(p, pod_request("UPDATE"), usage_written(old), old) == []


def test_the_plugin_may_not_rewrite_other_nodes_claims(docs: list[dict[str, Any]]) -> None:
    """The plugin's RBAC allows ``update resourceclaims/status`` everywhere (only Kubernetes
    1.36's beta gate narrows it); this policy holds it to claims allocated on its node."""
    p = policy(docs, "-claim-status")
    other = claim_on("other-node")
    found = denials(p, pod_request("UPDATE"), usage_written(other), other)
    assert found and "may only update the status of claims allocated on that node" in found[0]
    unallocated = {"metadata": {"name": "c"}, "status": {}}
    assert denials(p, pod_request("UPDATE"), unallocated, unallocated)
    found = denials(
        p, pod_request("UPDATE", node=None), usage_written(claim_on(NODE)), claim_on(NODE)
    )
    assert found and "must authenticate" in found[0]


def test_the_plugin_may_change_neither_allocations_nor_other_drivers_entries(
    docs: list[dict[str, Any]],
) -> None:
    p = policy(docs, "-claim-status")
    old = claim_on(NODE, devices=[{"driver": "nic.example.com", "pool": "p", "device": "n0"}])
    moved = usage_written(old)
    moved["status"]["allocation"]["devices"]["results"][0]["pool"] = "elsewhere"
    found = denials(p, pod_request("UPDATE"), moved, old)
    assert found and any("allocation or reservations" in m for m in found), found
    unreserved = usage_written(old)
    unreserved["status"]["reservedFor"] = []
    assert any(
        "allocation or reservations" in m
        for m in denials(p, pod_request("UPDATE"), unreserved, old) or []
    )
    foreign = usage_written(old, driver="nic.example.com")
    found = denials(p, pod_request("UPDATE"), foreign, old)
    assert found and any("only change status.devices entries of driver" in m for m in found), found
    # Other users are out of the policy's scope.
    other_user = {"operation": "UPDATE", "userInfo": user("system:admin", None)}
    assert denials(p, other_user, foreign, old) is None


def test_without_usage_writes_there_is_no_claim_status_grant_nor_policy(helm: str) -> None:
    docs = render_chart(helm, "--set", "kubeletPlugin.usage.enabled=false", namespace=NAMESPACE)
    assert not [d for d in docs if d["metadata"]["name"].endswith("-claim-status")]
