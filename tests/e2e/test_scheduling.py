"""The real kube-scheduler allocates from the driver's ResourceSlice: the two pods of
examples/two-pods-fractional-share get their 30- and 50-core shares of the one consumable GPU of
a node (no kubelet runs, so the pods stay Pending on it, bound), and the controller's GPU object
counts both claims."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.controller.helpers import node_slice
from tests.e2e.binaries import missing_binaries
from tests.e2e.controlplane import ControlPlane
from tests.e2e.driver import ControllerDeployment, apply
from tests.e2e.node import create_ready_node
from tests.e2e.processes import step, wait_until
from tests.paths import EXAMPLES_DIR

NODE = "e2e-sched-node"
NAMESPACE = "e2e-examples"
EXAMPLE = EXAMPLES_DIR / "two-pods-fractional-share" / "two-pods-fractional-share.yaml"


@pytest.fixture(scope="module")
def node(crds: ControlPlane, chart: list[dict[str, Any]], webhook: str) -> ControlPlane:
    """A Ready Node with one consumable GPU in its ResourceSlice, and the chart's DeviceClasses."""
    plane = crds
    if missing_binaries(("kube-scheduler",)):
        pytest.skip("e2e: kube-scheduler not built (tests/e2e/build-binaries.sh kube-scheduler)")
    apply(plane, [d for d in chart if d["kind"] == "DeviceClass"], "apply the DeviceClasses")
    create_ready_node(plane, NODE)
    apply(plane, [node_slice(NODE, 1)], "publish the node's ResourceSlice")
    plane.kubectl("create", "namespace", NAMESPACE, check=False)
    return plane


def test_two_fractional_shares_land_on_one_gpu(
    node: ControlPlane, controller: ControllerDeployment
) -> None:
    plane = node
    plane.kubectl("apply", "-n", NAMESPACE, "-f", str(EXAMPLE), step_name="apply the example")

    def bound() -> bool:
        pods = json.loads(
            plane.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json", step_name="get pods").stdout
        )["items"]
        return len(pods) == 2 and all(p["spec"].get("nodeName") == NODE for p in pods)

    wait_until(bound, "kube-scheduler binds the example's pods", "both pods bound to the node")
    claims = yaml.safe_load(
        plane.kubectl("get", "resourceclaims", "-n", NAMESPACE, "-o", "yaml").stdout
    )["items"]
    with step("claims allocated with their shares", "kubectl get resourceclaims -o yaml"):
        consumed = {}
        for claim in claims:
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert result["pool"] == NODE and result["device"] == "gpu-0", result
            consumed[claim["metadata"]["name"]] = result["consumedCapacity"]
        assert consumed == {
            "small-share": {"cores": "30", "memory": "10Gi"},
            "large-share": {"cores": "50", "memory": "20Gi"},
        }, consumed

    def counted() -> bool:
        gpus = json.loads(plane.kubectl("get", "gpus", "-o", "json").stdout)["items"]
        mine = [g for g in gpus if g.get("spec", {}).get("node") == NODE]
        return len(mine) == 1 and mine[0].get("status", {}).get("claimCount") == 2

    wait_until(counted, "the GPU object counts both claims", "claimCount 2")
    gpu = json.loads(plane.kubectl("get", "gpus", "-o", "json").stdout)["items"]
    (mine,) = [g for g in gpu if g.get("spec", {}).get("node") == NODE]
    with step("the GPU object shows the allocation", "kubectl get gpus -o json"):
        assert mine["status"]["coresSummary"].startswith("80/100"), mine["status"]
