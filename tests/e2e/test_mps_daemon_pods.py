"""Per-claim MPS daemon pods on the real node, with the chart's defaults: the mock backend's
plugin starts each claim's daemon as a pod of the release namespace running the image's
stand-in ``nvidia-cuda-mps-control`` (the same pod template, policy, RBAC, priority and node
binding as on a GPU node). A restarted plugin adopts the running daemon; the chart's policy
denies the plugin's own token every change to the live daemon pod but its deletion, and denies a
token of another node even that; unprepare deletes the pod."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from kubeletplugin.hosts import mpsstandin
from kubeletplugin.sharing.daemonpods import (
    ANNOTATION_CLAIM,
    ANNOTATION_NODE,
    ANNOTATION_UUID,
    DAEMON_CONTAINER,
    LABEL_DAEMON,
    LABEL_NODE,
)
from kubeletplugin.sharing.mps import container_pipe_dir
from kubeletplugin.sharing.mpspaths import short_id
from tests.e2e.claims import busybox_pod, share_claim
from tests.e2e.controlplane import ControlPlane, write_kubeconfig
from tests.e2e.driver import NAMESPACE
from tests.e2e.kubelet import RealNode
from tests.e2e.node import node_bound_token
from tests.e2e.plugindaemon import PluginDaemon
from tests.e2e.processes import StepFailed, step, wait_until

WORKLOADS: Final = "e2e-mps-pods"
OTHER_NODE: Final = "e2e-mps-other-node"
POD_POLICY: Final = "ValidatingAdmissionPolicy 'sharegpu-mps-pods' with binding 'sharegpu-mps-pods'"


def _daemon_pods(plane: ControlPlane, node: str) -> list[dict[str, Any]]:
    out = plane.kubectl(
        "get", "pods", "-n", NAMESPACE, "-l", f"{LABEL_NODE}={short_id(node)}", "-o", "json",
    ).stdout  # fmt: skip
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def _print_state(plane: ControlPlane, plugin: PluginDaemon) -> None:
    """The pods, the release namespace's events and the plugin's log, for a failed step."""
    for args in (
        ("get", "pods", "-A", "-o", "wide"),
        ("get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp"),
        ("get", "events", "-n", WORKLOADS, "--sort-by=.lastTimestamp"),
    ):
        print(plane.kubectl(*args, check=False).stdout)
    print("\n".join(plugin.logs().splitlines()[-60:]))


def _ready(pod: dict[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return any(s["name"] == DAEMON_CONTAINER and s.get("ready") for s in statuses)


def _token_kubeconfig(plane: ControlPlane, name: str, account: str, pod: dict[str, Any]) -> Path:
    """A kubeconfig with a token of ``account`` bound to ``pod`` (so naming its node)."""
    meta = pod["metadata"]
    token = plane.kubectl(
        "create", "token", account, f"--namespace={NAMESPACE}", "--bound-object-kind=Pod",
        f"--bound-object-name={meta['name']}", f"--bound-object-uid={meta['uid']}",
        step_name=f"a token of {account} bound to pod {meta['name']}",
    ).stdout.strip()  # fmt: skip
    return write_kubeconfig(
        plane.work / f"{name}.kubeconfig", plane.server, plane.pki.ca_file, token=token
    )


def _as(plane: ControlPlane, kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    """Run kubectl with ``kubeconfig``; its output, which must be a denial by the daemon pod
    policy."""
    result = plane.kubectl(*args, stdin=stdin, kubeconfig=kubeconfig, check=False)
    out = (result.stdout + result.stderr).strip()
    assert result.returncode != 0, out
    assert f"{POD_POLICY} denied request" in out, out
    return out


def _clone(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as a manifest to create again (no status, server fields or binding)."""
    clone = copy.deepcopy(pod)
    clone.pop("status", None)
    meta = clone["metadata"]
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"):
        meta.pop(key, None)
    clone["spec"].pop("nodeName", None)
    return clone


# A daemon pod's start, a plugin pod's restart and a namespace's deletion, one after another.
@pytest.mark.timeout(600)
def test_mps_daemon_pods_start_adopt_deny_and_go(
    real_node: RealNode, node_plugin: PluginDaemon
) -> None:
    plane = real_node.plane
    plane.create_namespace(WORKLOADS)
    claim = share_claim("mps-share", WORKLOADS)
    pod = busybox_pod(
        "mps-client", WORKLOADS, real_node.name, ["sleep", "3600"], claims={"gpu": "mps-share"}
    )
    plane.kubectl(
        "apply", "-f", "-", stdin=yaml.safe_dump_all([claim, pod]),
        step_name="an MPS share and its pod",
    )  # fmt: skip
    try:
        plane.kubectl(
            "wait", "--for=condition=Ready", "pod/mps-client", "-n", WORKLOADS, "--timeout=240s",
            step_name="the pod runs once its claim's daemon pod is ready",
        )  # fmt: skip
    except StepFailed:
        _print_state(plane, node_plugin)
        raise
    uid = plane.kubectl(
        "get", "resourceclaim", "mps-share", "-n", WORKLOADS, "-o", "jsonpath={.metadata.uid}"
    ).stdout.strip()
    (daemon,) = [
        p for p in _daemon_pods(plane, real_node.name)
        if p["metadata"]["annotations"].get(ANNOTATION_CLAIM) == uid
    ]  # fmt: skip
    meta, spec = daemon["metadata"], daemon["spec"]
    daemon_id = meta["labels"][LABEL_DAEMON]
    daemon_uuid = meta["annotations"][ANNOTATION_UUID]
    pipe = real_node.root / "mps" / daemon_id / "pipe"
    with step("the claim's daemon is a ready pod on the node, pinned to it", "kubectl get pods"):
        assert _ready(daemon), daemon.get("status")
        assert spec["nodeName"] == real_node.name
        assert meta["annotations"][ANNOTATION_NODE] == real_node.name
        assert not spec.get("hostNetwork") and not spec.get("hostPID")
        assert spec["automountServiceAccountToken"] is False
    env = plane.kubectl("exec", "mps-client", "-n", WORKLOADS, "--", "env").stdout
    with step("the stand-in daemon answers with the share's limits", f"ls {pipe}"):
        # The client sees the daemon's pipe directory at its GPU's path in the container.
        assert f"CUDA_MPS_PIPE_DIRECTORY={container_pipe_dir(daemon_uuid)}" in env, env
        answer = mpsstandin.send(pipe, "get_default_active_thread_percentage\n")
        assert (answer.returncode, answer.stdout) == (0, "30.0\n"), answer
        # The pinned memory limit is set by the daemon pod's postStart hook, through the
        # stand-in tool installed where the driver's would be.
        log = (pipe.parent / "log" / "control.log").read_text()
        assert "'set_default_device_pinned_mem_limit" in log and "4096M' -> exit 0" in log, log

    plugin = node_plugin.pod()
    assert plugin is not None
    account = plugin["spec"]["serviceAccountName"]
    own = _token_kubeconfig(plane, "mps-plugin", account, plugin)
    # Copies under the live pod's name: admission judges them before the name is found taken.
    changed = _clone(daemon)
    image = changed["spec"]["containers"][0]["image"]
    changed["spec"]["containers"][0]["image"] = "attacker/tool:1"
    out = _as(plane, own, "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(changed))
    with step("the plugin may not run another image in a daemon pod", "kubectl create"):
        assert f"an MPS daemon pod may only run the image {image}" in out, out
    elsewhere = _clone(daemon)
    elsewhere["metadata"]["annotations"][ANNOTATION_NODE] = OTHER_NODE
    terms = elsewhere["spec"]["affinity"]["nodeAffinity"]
    terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"][
        0
    ]["values"] = [OTHER_NODE]
    out = _as(plane, own, "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(elsewhere))
    with step("the plugin may not pin a daemon pod to another node", "kubectl create"):
        assert f"the sharegpu kubelet plugin on node {real_node.name} may only" in out, out
    # Another node's plugin token (a Node object without a kubelet, cordoned and tainted, and a
    # pod of the plugin's account bound to it) may not delete this node's daemon.
    plane.kubectl(
        "apply", "-f", "-", stdin=yaml.safe_dump({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": OTHER_NODE},
            "spec": {"unschedulable": True, "taints": [
                {"key": "e2e/no-kubelet", "effect": "NoExecute"}]},
        }), step_name="a Node object of another node",
    )  # fmt: skip
    try:
        token = node_bound_token(plane, account, OTHER_NODE)
        other = write_kubeconfig(
            plane.work / "mps-other.kubeconfig", plane.server, plane.pki.ca_file, token=token
        )
        out = _as(plane, other, "delete", "pod", meta["name"], "-n", NAMESPACE, "--dry-run=server")
        with step("another node's plugin may not delete this node's daemon pod", "kubectl delete"):
            assert f"the sharegpu kubelet plugin on node {OTHER_NODE} may only" in out, out
    finally:
        plane.kubectl(
            "delete", "pod", f"{account}-{OTHER_NODE}", "-n", NAMESPACE, "--force",
            "--grace-period=0", "--wait=false", check=False,
        )  # fmt: skip
        plane.kubectl("delete", "node", OTHER_NODE, "--wait=false", check=False)

    plane.kubectl(
        "delete", "pod", plugin["metadata"]["name"], "-n", NAMESPACE, "--wait=true",
        step_name="delete the plugin's pod",
    )  # fmt: skip

    def adopted() -> bool:
        new = node_plugin.pod()
        return (
            new is not None
            and new["metadata"]["uid"] != plugin["metadata"]["uid"]
            and (f"adopted the running MPS control daemon of claim {uid}" in node_plugin.logs())
        )

    # The new plugin adopts the daemon at its start (restore of the checkpointed claims).
    wait_until(adopted, "the restarted plugin adopts the daemon pod", "its log line")
    (after,) = [
        p for p in _daemon_pods(plane, real_node.name) if p["metadata"]["name"] == meta["name"]
    ]
    with step("the daemon pod was neither replaced nor restarted", "kubectl get pods"):
        assert after["metadata"]["uid"] == meta["uid"]
        assert all(s.get("restartCount", 0) == 0 for s in after["status"]["containerStatuses"])

    plane.kubectl(
        "delete", "namespace", WORKLOADS, "--wait=true", "--timeout=180s",
        step_name="delete the pod and its claim",
    )  # fmt: skip
    wait_until(
        lambda: (
            not any(
                p["metadata"]["name"] == meta["name"] for p in _daemon_pods(plane, real_node.name)
            )
        ),
        "unprepare deletes the daemon pod",
        f"no pod {meta['name']}",
    )
    with step("the daemon's host directory is gone", f"ls {pipe.parent}"):
        assert not pipe.parent.exists()
    node_plugin.check_no_forbidden("the plugin with daemon pods and the chart's RBAC")
