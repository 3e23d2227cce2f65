"""The in-cluster controller's ``MPSClientsQueued`` Event on the real node: two pods share one MPS
claim as different UIDs, so MPS would queue the later one's clients; the claim and the later pod
get the Warning naming both UIDs and the GPU the claim was allocated. Then the share's measured
usage (the mock usage source, read by the plugin's pod) reaches the claim's GPU object."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.e2e.claims import busybox_pod, gpu_config, share_claim
from tests.e2e.driver import ControllerDeployment
from tests.e2e.kubelet import RealNode
from tests.e2e.plugindaemon import PluginDaemon
from tests.e2e.processes import step, wait_until

NAMESPACE = "e2e-mps-users"
UIDS = (1000, 2000)


def _pod(name: str, node: str, uid: int) -> dict[str, Any]:
    return busybox_pod(
        name, NAMESPACE, node, ["sleep", "3600"], claims={"gpu": "shared"}, run_as_user=uid
    )


def _events(plane: Any, kind: str, name: str) -> list[dict[str, Any]]:
    out = plane.kubectl(
        "get", "events", "-n", NAMESPACE,
        f"--field-selector=reason=MPSClientsQueued,involvedObject.kind={kind},"
        f"involvedObject.name={name}", "-o", "json",
    ).stdout  # fmt: skip
    return list(json.loads(out)["items"])


def _check_usage_reaches_the_gpu_object(plane: Any, daemon: PluginDaemon) -> None:
    """A process of the claim on its GPU (the mock usage source, read by the plugin's pod)
    reaches the GPU object's allocation through the claim's status and the in-cluster
    controller."""
    claim = json.loads(
        plane.kubectl("get", "resourceclaim", "shared", "-n", NAMESPACE, "-o", "json").stdout
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    index = int(result["device"].rsplit("-", 1)[1])
    uid = claim["metadata"]["uid"]
    daemon.usage_file.write_text(f"{index}: [{{claim: {uid}, mpsClient: true, memory: 2Gi}}]\n")
    seen: list[Any] = []

    def measured() -> bool:
        gpus = json.loads(plane.kubectl("get", "gpus", "-o", "json").stdout)["items"]
        seen[:] = [
            a.get("usage")
            for g in gpus
            for a in (g.get("status") or {}).get("allocations") or []
            if a.get("claim", {}).get("name") == "shared" or a.get("claimName") == "shared"
        ]
        return any((u or {}).get("usedMemory") == "2Gi" for u in seen)

    try:
        wait_until(
            measured,
            "the share's usage reaches its GPU object",
            "status.allocations[].usage.usedMemory 2Gi on the claim's GPU",
        )
    except AssertionError as exc:
        status = plane.kubectl("get", "resourceclaim", "shared", "-n", NAMESPACE, "-o", "json")
        devices = json.loads(status.stdout).get("status", {}).get("devices")
        raise AssertionError(
            f"{exc}\n  GPU objects' usage of the claim: {seen}\n  the claim's status.devices: "
            f"{devices}\n  plugin log:\n{daemon.logs()[-3000:]}"
        ) from exc
    finally:
        daemon.usage_file.unlink(missing_ok=True)


def test_mps_claim_shared_by_two_uids_gets_the_queued_event(
    real_node: RealNode, node_plugin: PluginDaemon, controller: ControllerDeployment
) -> None:
    plane = real_node.plane
    plane.create_namespace(NAMESPACE)
    claim = share_claim("shared", NAMESPACE, gpu_config({"sharing": {"strategy": "MPS"}}))
    pods = [_pod(f"uid-{uid}", real_node.name, uid) for uid in UIDS]
    try:
        plane.kubectl(
            "apply", "-f", "-", stdin=yaml.safe_dump_all([claim, *pods]),
            step_name="an MPS claim and two pods of different UIDs",
        )  # fmt: skip
        plane.kubectl(
            "wait", "--for=condition=Ready", "pod", "--all", "-n", NAMESPACE, "--timeout=180s",
            step_name="both pods run with the share",
        )  # fmt: skip
        wait_until(
            lambda: bool(_events(plane, "ResourceClaim", "shared")),
            "the controller warns about the claim",
            "a MPSClientsQueued Event on the claim",
        )
        wait_until(
            lambda: bool(_events(plane, "Pod", f"uid-{UIDS[1]}")),
            "the controller warns the later pod",
            "a MPSClientsQueued Event on the pod of the second UID",
        )
        (event, *_) = _events(plane, "ResourceClaim", "shared")
        with step("the Event names the UIDs, the GPU and the rule", "kubectl get events"):
            message = event["message"]
            assert event["type"] == "Warning", event
            assert "1000, 2000" in message and "one runAsUser" in message, message
            assert f"{real_node.name}-gpu-" in message, message
            assert _events(plane, "Pod", f"uid-{UIDS[0]}") == []
        _check_usage_reaches_the_gpu_object(plane, node_plugin)
    finally:
        plane.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
