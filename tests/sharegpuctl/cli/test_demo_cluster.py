"""The live demo cluster driven in-process through its API server (no kubectl needed): claims
from templates, Scheduled and FailedScheduling, Running pods and their logs, refused workloads,
unprepare and deallocation on delete. ``test_demo_keep_running`` drives the same with kubectl."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from api import names
from sharegpu.kube.rest import KubeApiError
from sharegpuctl.cli.demo import Node, live_cluster, remove_template_claims, run_demo
from sharegpuctl.cli.demo_cluster import MAX_GENERATE_BASE, POD_CLAIM_NAME, generate_name
from tests.helpers import eventually
from tests.paths import EXAMPLES_DIR

RESOURCE_API = f"/apis/{names.RESOURCE_GROUP_VERSION}"
#: A GpuConfig the webhook's checks refuse (no such strategy).
BAD_CONFIG = {
    "apiVersion": names.GROUP_VERSION,
    "kind": "GpuConfig",
    "sharing": {"strategy": "Bogus"},
}
WAIT_S = 120.0


def _template(name: str, **exactly: Any) -> dict[str, Any]:
    request = {"deviceClassName": names.DEFAULT_DRIVER_NAME, **exactly}
    return {
        "apiVersion": names.RESOURCE_GROUP_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    }


def _pod(name: str, **claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [
                {"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", **claim}],
        },
    }


def _events(node: Node, pod: str, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in node.server.store.list("events", "default")
        if e["involvedObject"]["name"] == pod and e["reason"] == reason
    ]


def _counted(node: Node) -> set[str]:
    gpus = node.server.store.list(names.GPU_PLURAL)
    return {a["claimName"] for g in gpus for a in (g.get("status") or {}).get("allocations") or []}


def _phase(node: Node, pod: str) -> str:
    obj = node.server.store.get("pods", pod, "default")
    return str(((obj or {}).get("status") or {}).get("phase", ""))


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    """What the drive saw, checked by the tests below (the demo runs once)."""
    found: dict[str, Any] = {}

    def drive(node: Node, data: dict[str, Any]) -> int:
        rest = node.rest
        with live_cluster(node, data) as cluster:
            found["kept"] = remove_template_claims(node, data)
            eventually(
                lambda: "whole-gpu" not in _counted(node),
                "template claims removed",
                timeout_s=WAIT_S,
            )
            post: Callable[[str, dict[str, Any]], Any] = lambda path, body: rest.request(  # noqa: E731
                "POST", path, body=body
            )
            post(
                f"{RESOURCE_API}/namespaces/default/resourceclaimtemplates",
                _template("half", capacity={"requests": {"cores": "50", "memory": "10Gi"}}),
            )
            post(
                f"{RESOURCE_API}/namespaces/default/resourceclaimtemplates",
                _template("nine", allocationMode="ExactCount", count=9),
            )
            post("/api/v1/namespaces/default/pods", _pod("runs", resourceClaimTemplateName="half"))
            post("/api/v1/namespaces/default/pods", _pod("shares", resourceClaimName="small-share"))
            post(
                "/api/v1/namespaces/default/pods", _pod("too-big", resourceClaimTemplateName="nine")
            )
            post(
                "/api/v1/namespaces/default/pods", _pod("orphan", resourceClaimTemplateName="none")
            )
            plugin_style = _pod("plugin-style")
            plugin_style["spec"].pop("resourceClaims")
            plugin_style["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
            post("/api/v1/namespaces/default/pods", plugin_style)
            for pod in ("runs", "shares"):
                eventually(
                    lambda pod=pod: _phase(node, pod) == "Running",
                    f"{pod} Running",
                    timeout_s=WAIT_S,
                )
            found["pod"] = node.server.store.get("pods", "runs", "default")
            generated = found["pod"]["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            found["claim"] = node.server.store.get("resourceclaims", generated, "default")
            found["logs"] = cluster.pod_logs("default", "runs", None)
            found["shared logs"] = cluster.pod_logs("default", "shares", "main")
            found["scheduled"] = _events(node, "runs", "Scheduled")
            found["counted"] = eventually(
                lambda: generated in _counted(node) and _counted(node),
                "the GPU objects count the generated claim",
                timeout_s=WAIT_S,
            )
            found["failed"] = eventually(
                lambda: _events(node, "too-big", "FailedScheduling"),
                "FailedScheduling",
                timeout_s=WAIT_S,
            )
            found["plugin-style"] = eventually(
                lambda: _events(node, "plugin-style", "FailedScheduling"),
                "FailedScheduling for nvidia.com/gpu",
                timeout_s=WAIT_S,
            )
            found["orphan"] = eventually(
                lambda: _events(node, "orphan", "FailedResourceClaimCreation"),
                "FailedResourceClaimCreation",
                timeout_s=WAIT_S,
            )
            try:
                post(
                    "/apis/apps/v1/namespaces/default/deployments",
                    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}},
                )
            except KubeApiError as exc:
                found["deployment"] = exc
            bad = _template("bad")
            bad["kind"] = "ResourceClaim"
            bad["spec"] = dict(bad["spec"]["spec"])
            bad["spec"]["devices"]["config"] = [
                {"opaque": {"driver": names.DEFAULT_DRIVER_NAME, "parameters": BAD_CONFIG}}
            ]
            try:
                post(f"{RESOURCE_API}/namespaces/default/resourceclaims", bad)
            except KubeApiError as exc:
                found["denied"] = exc
            found["bad stored"] = node.server.store.get("resourceclaims", "bad", "default")
            rest.request("DELETE", "/api/v1/namespaces/default/pods/runs")
            eventually(
                lambda: generated not in _counted(node),
                "generated claim not counted",
                timeout_s=WAIT_S,
            )
            found["generated after delete"] = node.server.store.get(
                "resourceclaims", generated, "default"
            )
            rest.request("DELETE", f"{RESOURCE_API}/namespaces/default/resourceclaims/small-share")
            eventually(
                lambda: "small-share" not in _counted(node),
                "small-share not counted",
                timeout_s=WAIT_S,
            )
            eventually(
                lambda: _phase(node, "shares") == "Failed", "shares Failed", timeout_s=WAIT_S
            )
        cluster.unprepare_all()
        data["pods"] = cluster.pod_shares()
        return cluster.unprepared

    found["report"] = run_demo(EXAMPLES_DIR, hold=drive)
    return found


def test_only_the_claims_that_are_no_templates_stay(seen: dict[str, Any]) -> None:
    assert sorted(seen["kept"]) == ["large-share", "small-share"]


def test_a_template_claim_is_made_owned_and_reserved_like_kube_controller_manager(
    seen: dict[str, Any],
) -> None:
    pod, claim = seen["pod"], seen["claim"]
    assert claim["metadata"]["name"].startswith("runs-gpu-")
    assert claim["metadata"]["annotations"][POD_CLAIM_NAME] == "gpu"
    (owner,) = claim["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "runs",
        "uid": pod["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "runs", "uid": pod["metadata"]["uid"]}
    ]
    assert (
        claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["cores"] == "50"
    )
    assert pod["spec"]["nodeName"] == "demo-node"
    assert claim["metadata"]["name"] in seen["counted"]


def test_running_pods_show_their_devices_in_their_logs(seen: dict[str, Any]) -> None:
    lines = seen["logs"].splitlines()
    assert "SHAREGPU_CORES=50" in lines and "SHAREGPU_MEMORY=10737418240" in lines
    assert any(line.startswith("NVIDIA_VISIBLE_DEVICES=GPU-") for line in lines)
    assert "SHAREGPU_CORES=30" in seen["shared logs"].splitlines()  # small-share's share
    (event,) = seen["scheduled"]
    assert event["message"] == "Successfully assigned default/runs to demo-node"


def test_a_pod_that_does_not_fit_gets_the_allocators_reason(seen: dict[str, Any]) -> None:
    (event,) = seen["failed"]
    assert event["type"] == "Warning"
    assert event["message"].startswith("0/1 nodes are available: ")
    assert "needs 9 device(s)" in event["message"]
    assert event["message"].count("claim default/too-big-gpu-") == 1


def test_a_missing_template_is_an_event(seen: dict[str, Any]) -> None:
    (event,) = seen["orphan"]
    assert 'resourceclaimtemplate.resource.k8s.io "none" not found' in event["message"]


def test_workloads_are_refused_and_not_stored(seen: dict[str, Any]) -> None:
    exc = seen["deployment"]
    assert exc.status == 405 and "make local-cluster" in str(exc)


def test_deletes_unprepare_and_deallocate(seen: dict[str, Any]) -> None:
    assert seen["generated after delete"] is None  # garbage-collected with its pod
    report = seen["report"]
    assert report["cleanup"]["cdiSpecsLeft"] == 0 and report["cleanup"]["tempDirRemoved"]
    pods = {p["pod"]: p for p in report["pods"]}
    assert pods["default/shares"]["claim"] == "small-share"


def test_generated_names_keep_both_parts_when_long() -> None:
    assert generate_name("web", "gpu") == "web-gpu-"
    long = generate_name("p" * 40, "c" * 40)
    assert long == "p" * 28 + "-" + "c" * 28 and len(long) <= MAX_GENERATE_BASE


def test_the_webhooks_checks_judge_claims_at_admission(seen: dict[str, Any]) -> None:
    exc = seen["denied"]
    assert 400 <= exc.status < 500
    assert 'admission webhook "resourceclaim.gpu.sharegpu.dev" denied the request' in str(exc)
    assert "Bogus" in str(exc)
    assert seen["bad stored"] is None


def test_an_extended_resource_is_insufficient_on_the_demo_node(seen: dict[str, Any]) -> None:
    (event,) = seen["plugin-style"]
    assert "Insufficient nvidia.com/gpu" in event["message"]
    assert "make local-cluster" in event["message"]
