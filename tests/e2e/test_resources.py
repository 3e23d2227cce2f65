"""The project's resources as a real API server and a real kubectl show them: the CRDs' short
names, category, printer columns and schema docs, and the GPU objects the controller keeps from a
ResourceSlice, with the chart's RBAC (a 403 in the controller's log fails the run)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from tests.controller.helpers import MODEL, node_slice
from tests.e2e.controlplane import ControlPlane
from tests.e2e.driver import CHART_DIR, ControllerDeployment
from tests.e2e.processes import step, wait_until

NODE = "e2e-node-1"
GPUS = 2
#: The JSON API Service's port (the chart's default).
API_PORT = int(yaml.safe_load((CHART_DIR / "values.yaml").read_text())["controller"]["api"]["port"])


def _header(table: str) -> list[str]:
    return table.splitlines()[0].split()


def _gpus_of(plane: ControlPlane, node: str) -> list[dict[str, Any]]:
    """The GPU objects of ``node``."""
    out = plane.kubectl("get", "gpus", "-o", "json", step_name="kubectl get gpus -o json").stdout
    return [g for g in json.loads(out)["items"] if g.get("spec", {}).get("node") == node]


def test_short_names_and_category_resolve(crds: ControlPlane) -> None:
    resources = crds.kubectl(
        "api-resources",
        "--api-group=resource.sharegpu.dev",
        "-o",
        "wide",
        step_name="api-resources",
    ).stdout
    with step("short names and category in discovery", "kubectl api-resources -o wide"):
        rows = {line.split()[0]: line for line in resources.splitlines()[1:]}
        assert re.search(r"\bsgpu\b", rows["gpus"]), resources
        assert re.search(r"\bgpuq\b", rows["gpuquotas"]), resources
        assert "sharegpu" in rows["gpus"] and "sharegpu" in rows["gpuquotas"], resources
    for args in (("get", "sgpu"), ("get", "gpuq", "-A"), ("get", "sharegpu", "-A")):
        crds.kubectl(*args, step_name=f"kubectl {' '.join(args)}")


def test_explain_documents_the_gpu_spec(crds: ControlPlane) -> None:
    out = crds.kubectl("explain", "gpus.spec", step_name="kubectl explain gpus.spec").stdout
    with step("kubectl explain gpus.spec", "kubectl explain gpus.spec"):
        assert "KIND:       GPU" in out or re.search(r"KIND:\s+GPU", out), out
        assert "Name of the node the GPU is attached to." in out, out
        assert re.search(r"^\s+index\s+<integer>", out, re.M), out


@pytest.fixture(scope="module")
def published(crds: ControlPlane, controller: ControllerDeployment) -> ControlPlane:
    """One node's ResourceSlice with two consumable GPUs, as the kubelet plugin publishes it."""
    crds.kubectl(
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump(node_slice(NODE, GPUS)),
        step_name="publish a ResourceSlice",
    )

    def gpus_tracked() -> bool:
        return len(_gpus_of(crds, NODE)) == GPUS

    wait_until(gpus_tracked, "controller creates GPU objects", "2 GPU objects")
    return crds


def test_gpus_show_the_printer_columns(published: ControlPlane) -> None:
    table = published.kubectl("get", "gpus", step_name="kubectl get gpus").stdout
    with step("printer columns of kubectl get gpus", "kubectl get gpus"):
        assert _header(table) == [
            "NAME",
            "NODE",
            "MODEL",
            "HEALTH",
            "CORES",
            "MEMORY",
            "CLAIMS",
            "LIMITS",
            "OVERCOMMIT",
            "AGE",
        ]
        rows = [row for row in table.splitlines()[1:] if NODE in row]
        assert len(rows) == GPUS, table
        for row in rows:
            assert NODE in row and MODEL in row, table
    names = {g["metadata"]["name"] for g in _gpus_of(published, NODE)}
    short = published.kubectl("get", "sgpu", "-o", "name", step_name="kubectl get sgpu").stdout
    assert names <= {n.split("/", 1)[1] for n in short.split()}, short


def test_controller_log_has_no_forbidden_answer(
    published: ControlPlane, controller: ControllerDeployment
) -> None:
    controller.check_no_forbidden("controller with the chart's RBAC")


def test_json_api_through_its_service_with_a_token_of_its_audience(
    published: ControlPlane, controller: ControllerDeployment
) -> None:
    """The chart's JSON API Service, reached through kube-proxy: a ServiceAccount token bound to
    the API's audience, of an account allowed to list GPUs, reads the GPU objects; no token, or a
    token for the Kubernetes API's own audience, is refused."""
    plane = published
    reader = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "gpu-reader", "namespace": "default"},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "e2e-gpu-reader"},
                "rules": [
                    {
                        "apiGroups": ["resource.sharegpu.dev"],
                        "resources": ["gpus"],
                        "verbs": ["list"],
                    }
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "e2e-gpu-reader"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "e2e-gpu-reader",
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": "gpu-reader", "namespace": "default"}
                ],
            },
        ],
    }
    plane.kubectl("apply", "-f", "-", stdin=json.dumps(reader), step_name="a GPU reader")

    def token(*audience: str) -> str:
        return plane.kubectl(
            "create", "token", "gpu-reader", "-n", "default", *audience,
            step_name="a token of the GPU reader",
        ).stdout.strip()  # fmt: skip

    service = f"{controller.deployment}-api"
    port = API_PORT

    def get(bearer: str | None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        return controller.service_request(service, port, "GET", "/api/v1/gpus", headers=headers)

    good = token("--audience=sharegpu.dev")

    def answered() -> bool:
        return get(good)[0] == 200

    wait_until(answered, "the JSON API through its Service", "200 for a reader's token")
    code, body = get(good)
    with step("the JSON API lists the GPU objects", f"GET {service}:{port}/api/v1/gpus"):
        assert code == 200, body
        assert json.dumps(body).count(NODE) >= GPUS, body
        assert get(None)[0] == 401
        assert get(token())[0] == 401
