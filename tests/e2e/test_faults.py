"""Faults of the chart's own pods on the real cluster: the controller's leader deleted while claims
are created, and the node drained.

The release runs with the chart's defaults (two controller replicas, leader election, failure
policy Ignore), so a webhook that does not answer admits a claim unchecked: the leader step proves
that none is, while the leader's pod terminates and leadership moves."""

from __future__ import annotations

import json
import threading
from typing import Any

import yaml

from kubeletplugin.sharing.daemonpods import ANNOTATION_CLAIM
from tests.e2e.claims import busybox_pod, gpu_config, share_claim
from tests.e2e.driver import NAMESPACE, ControllerDeployment
from tests.e2e.kubelet import RealNode
from tests.e2e.plugindaemon import PluginDaemon
from tests.e2e.processes import step, wait_until

FAULTS_NAMESPACE = "e2e-faults"
#: Claims created while the leader's pod terminates (each a good one and a bad one).
ROUNDS = 12
#: Devices the namespace's GpuQuota allows: the good claims past it must be denied.
QUOTA_DEVICES = 4
LEASE = "sharegpu-controller"


def _leader(controller: ControllerDeployment) -> str:
    """The pod that holds the controller's Lease (its identity is ``<pod>_<random>``)."""
    identity = controller.plane.kubectl(
        "get", "lease", LEASE, "-n", NAMESPACE, "-o", "jsonpath={.spec.holderIdentity}",
        step_name="the controller's Lease",
    ).stdout.strip()  # fmt: skip
    return identity.rsplit("_", 1)[0]


def _create(controller: ControllerDeployment, claim: dict[str, Any]) -> tuple[bool, str]:
    """Create ``claim`` through the API server: whether it was admitted, and what kubectl said."""
    result = controller.plane.kubectl("create", "-f", "-", stdin=yaml.safe_dump(claim), check=False)
    return result.returncode == 0, result.stdout + result.stderr


def test_leader_deleted_while_claims_are_created(controller: ControllerDeployment) -> None:
    plane = controller.plane
    plane.create_namespace(FAULTS_NAMESPACE)
    quota = {
        "apiVersion": "resource.sharegpu.dev/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": "faults", "namespace": FAULTS_NAMESPACE},
        "spec": {"hard": {"devices": QUOTA_DEVICES}},
    }
    plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(quota), step_name="a GpuQuota")
    wait_until(lambda: bool(_leader(controller)), "the controller leads", "a Lease holder")
    leader = _leader(controller)
    assert leader in {p["metadata"]["name"] for p in controller.pods()}, leader
    deleted = threading.Thread(
        target=plane.kubectl,
        args=("delete", "pod", leader, "-n", NAMESPACE, "--wait=true", "--timeout=120s"),
        kwargs={"check": False},
    )
    deleted.start()
    admitted_good, admitted_bad, answers = [], [], []
    try:
        for i in range(ROUNDS):
            bad = share_claim(
                f"bad-{i}", FAULTS_NAMESPACE, gpu_config({"sharing": {"strategy": "Mps"}})
            )
            good = share_claim(f"good-{i}", FAULTS_NAMESPACE)
            for claim, admitted in ((bad, admitted_bad), (good, admitted_good)):
                ok, said = _create(controller, claim)
                answers.append(f"{claim['metadata']['name']}: {said.strip()}")
                if ok:
                    admitted.append(claim["metadata"]["name"])
    finally:
        deleted.join(180)
    with step("no claim admitted unchecked while the leader's pod terminated", "kubectl create"):
        assert admitted_bad == [], answers
        assert len(admitted_good) == QUOTA_DEVICES, answers
    with step("the Deployment replaces the deleted pod", "kubectl rollout status"):
        plane.kubectl(
            "rollout", "status", f"deployment/{controller.deployment}", "-n", NAMESPACE,
            "--timeout=300s",
        )  # fmt: skip
    wait_until(
        lambda: _leader(controller) not in ("", leader),
        "leadership moves to another replica",
        f"a Lease holder other than {leader}",
    )
    pods = {p["metadata"]["name"] for p in controller.pods()}
    with step("the new leader is a replica of the Deployment", "kubectl get lease"):
        assert _leader(controller) in pods, (_leader(controller), pods)

    def charged() -> bool:
        out = plane.kubectl("get", "gpuq", "faults", "-n", FAULTS_NAMESPACE, "-o", "json").stdout
        claims = (json.loads(out).get("status") or {}).get("claims") or {}
        return sorted(c.get("name") for c in claims.values()) == sorted(admitted_good)

    wait_until(charged, "the GpuQuota converges", "the admitted claims charged, no other")
    controller.check_no_forbidden("the controller replicas after the leader's deletion")
    plane.kubectl(
        "delete", "namespace", FAULTS_NAMESPACE, "--wait=false", check=False, step_name="cleanup"
    )


def test_drained_node_unprepares_its_claims(
    real_node: RealNode, node_plugin: PluginDaemon, controller: ControllerDeployment
) -> None:
    """``kubectl drain`` of the node (the controller's pods left alone: their PDB would block the
    drain of a one-node cluster, as it should): the pods' claims are unprepared (their CDI specs
    and MPS daemon pods gone), the plugin's DaemonSet pod stays and so do the node's
    ResourceSlices (the devices are still there; a cordon is the scheduler's business)."""
    plane = real_node.plane
    namespace = "e2e-drain"
    plane.create_namespace(namespace)
    claim = share_claim("drained", namespace)
    pod = busybox_pod(
        "drained", namespace, real_node.name, ["sleep", "3600"], claims={"gpu": "drained"}
    )
    plane.kubectl(
        "apply", "-f", "-", stdin=yaml.safe_dump_all([claim, pod]), step_name="a pod with a share"
    )
    plane.kubectl(
        "wait", "--for=condition=Ready", "pod/drained", "-n", namespace, "--timeout=180s",
        step_name="the pod runs with its share",
    )  # fmt: skip
    uid = plane.kubectl(
        "get", "resourceclaim", "drained", "-n", namespace, "-o", "jsonpath={.metadata.uid}"
    ).stdout.strip()

    def specs() -> list[str]:
        return [p.name for p in real_node.cdi_dir.iterdir() if uid in p.name]

    def daemons() -> list[str]:
        out = plane.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json").stdout
        return [
            p["metadata"]["name"]
            for p in json.loads(out)["items"]
            if p["metadata"].get("annotations", {}).get(ANNOTATION_CLAIM) == uid
        ]

    with step("the share is prepared, with its MPS daemon pod", f"ls {real_node.cdi_dir}"):
        assert specs(), sorted(p.name for p in real_node.cdi_dir.iterdir())
        assert daemons()
    slices_before = plane.kubectl(
        "get", "resourceslices", f"--field-selector=spec.nodeName={real_node.name}", "-o", "name"
    ).stdout.split()
    plugin_pod = (node_plugin.pod() or {}).get("metadata", {}).get("uid")
    try:
        plane.kubectl(
            "drain", real_node.name, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
            "--pod-selector=app.kubernetes.io/component!=controller", "--timeout=180s",
            step_name="kubectl drain the node",
        )  # fmt: skip
        wait_until(lambda: not specs(), "the drained pod's claim is unprepared", "no CDI spec")
        wait_until(lambda: not daemons(), "the claim's MPS daemon pod is gone", "no daemon pod")
        slices_after = plane.kubectl(
            "get", "resourceslices", f"--field-selector=spec.nodeName={real_node.name}",
            "-o", "name",
        ).stdout.split()  # fmt: skip
        with step("the plugin's pod and the node's slices stay", "kubectl get resourceslices"):
            assert (node_plugin.pod() or {}).get("metadata", {}).get("uid") == plugin_pod
            assert slices_after == slices_before, (slices_before, slices_after)
    finally:
        plane.kubectl("uncordon", real_node.name, step_name="kubectl uncordon", check=False)
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
