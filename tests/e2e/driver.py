"""The driver's control-plane side on a :class:`~tests.e2e.controlplane.ControlPlane`: the chart
rendered, the CRDs, and the release's controller Deployment with the webhook and JSON API
Services that reach it. Shared by the test fixtures and ``tests/e2e/cluster.py``.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import socket
import ssl
from pathlib import Path
from typing import Any, Final

import yaml

from tests.deploy.helpers import load_documents, run_helm
from tests.e2e.controlplane import ControlPlane
from tests.e2e.processes import StepFailed, failure, forbidden_lines, wait_until
from tests.paths import REPO_ROOT

#: Namespace and release name of the chart objects applied (RBAC, webhook registration).
NAMESPACE: Final = "sharegpu-system"
RELEASE: Final = "sharegpu"
CHART_DIR: Final = REPO_ROOT / "deploy" / "helm" / "sharegpu"
CRD_DIR: Final = REPO_ROOT / "deploy" / "crds"
CRDS: Final = ("gpus.resource.sharegpu.dev", "gpuquotas.resource.sharegpu.dev")
RBAC_KINDS: Final = frozenset(
    {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)
#: A claim the webhook denies (cores above 100): the probe that the API server calls it.
PROBE_CLAIM: Final[dict[str, Any]] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "webhook-probe", "namespace": "default"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.sharegpu.dev",
                        "capacity": {"requests": {"cores": "500", "memory": "1Gi"}},
                    },
                }
            ]
        }
    },
}


def render_chart(
    helm: str, *values: str, json_values: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """The chart as ``helm template`` renders it, with each ``values`` entry (``key=value``) set
    and each ``json_values`` entry (``key=JSON``) set with ``--set-json``."""
    argv = ("template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE)
    sets = [a for v in values for a in ("--set", v)]
    sets += [a for v in json_values for a in ("--set-json", v)]
    result = run_helm(helm, *argv, *sets)
    if result.returncode != 0:
        raise StepFailed(failure("render the chart", ["helm", *argv], result.stderr))
    return load_documents(result.stdout)


def apply(
    plane: ControlPlane, docs: list[dict[str, Any]], step_name: str, *, force: bool = False
) -> None:
    """``kubectl apply --server-side`` the documents; with ``force``, taking over the fields
    another manager (the release) set to other values."""
    plane.kubectl(
        "apply",
        "--server-side",
        "--field-manager=e2e",
        *(["--force-conflicts"] if force else []),
        "-f",
        "-",
        stdin=yaml.safe_dump_all(docs),
        step_name=step_name,
    )


def apply_crds(plane: ControlPlane) -> None:
    """Apply deploy/crds and wait until the API server serves them."""
    plane.kubectl("apply", "-f", str(CRD_DIR), step_name="apply the CRDs")
    plane.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=120s",
        *(f"crd/{name}" for name in CRDS),
        step_name="wait for the CRDs",
    )


def component(doc: dict[str, Any]) -> str:
    """The chart object's ``app.kubernetes.io/component`` label (empty when it has none)."""
    return str(doc.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component", ""))


@dataclasses.dataclass(frozen=True)
class ControllerDeployment:
    """The release's controller Deployment: its pods, the webhook registration and Service that
    reach it, and the CA of its serving certificate (the chart's generated one)."""

    plane: ControlPlane
    deployment: str
    webhook_configuration: str
    webhook_service: str
    ca_file: Path

    def pods(self) -> list[dict[str, Any]]:
        """The Deployment's pods."""
        out = self.plane.kubectl(
            "get", "pods", "-n", NAMESPACE, "-l", CONTROLLER_SELECTOR, "-o", "json"
        ).stdout
        return list(json.loads(out)["items"])

    def logs(self) -> str:
        """The log of every replica, each line prefixed with its pod."""
        return self.plane.kubectl(
            "logs", "-n", NAMESPACE, "-l", CONTROLLER_SELECTOR, "--prefix", "--tail=-1",
            check=False,
        ).stdout  # fmt: skip

    def check_no_forbidden(self, step_name: str) -> None:
        """Fail the step when a replica's log shows a 403 (Forbidden) answer."""
        forbidden = forbidden_lines(self.logs())
        if forbidden:
            raise StepFailed(
                failure(step_name, "kubectl logs -l " + CONTROLLER_SELECTOR, forbidden[0])
            )

    def service_request(
        self,
        service: str,
        port: int,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One HTTPS request to ``service`` (of the release's namespace) on its ClusterIP, from
        inside the sealed namespace, checking the server's certificate against :attr:`ca_file`
        for the Service's DNS name; returns the status and the decoded JSON body."""
        ip = self.plane.kubectl(
            "get", "service", service, "-n", NAMESPACE, "-o", "jsonpath={.spec.clusterIP}",
            step_name=f"the ClusterIP of the Service {service}",
        ).stdout.strip()  # fmt: skip
        context = ssl.create_default_context(cafile=str(self.ca_file))
        server_name = f"{service}.{NAMESPACE}.svc"
        data = None if body is None else json.dumps(body)

        def send() -> tuple[int, Any]:
            raw = socket.create_connection((ip, port), timeout=30)
            with context.wrap_socket(raw, server_hostname=server_name) as tls:
                connection = http.client.HTTPConnection(server_name, port, timeout=30)
                connection.sock = tls
                connection.request(
                    method, path, data, {"Content-Type": "application/json", **(headers or {})}
                )
                response = connection.getresponse()
                return response.status, json.loads(response.read() or b"null")

        return self.plane.network.call(send)


#: The label selector of the chart's controller pods.
CONTROLLER_SELECTOR: Final = "app.kubernetes.io/component=controller"


def controller_deployment(
    plane: ControlPlane, manifest: list[dict[str, Any]]
) -> ControllerDeployment:
    """Wait until the release's controller Deployment (in ``manifest``) is rolled out and the
    API server calls its webhook through the Service (a dry-run probe claim is denied)."""
    (deployment,) = [
        d["metadata"]["name"]
        for d in manifest
        if d["kind"] == "Deployment" and component(d) == "controller"
    ]
    config = next(d for d in manifest if d["kind"] == "ValidatingWebhookConfiguration")
    service = config["webhooks"][0]["clientConfig"]["service"]["name"]
    plane.kubectl(
        "rollout", "status", f"deployment/{deployment}", "-n", NAMESPACE, "--timeout=300s",
        step_name="the controller Deployment rolls out",
    )  # fmt: skip
    bundle = plane.kubectl(
        "get", "validatingwebhookconfiguration", config["metadata"]["name"], "-o",
        "jsonpath={.webhooks[0].clientConfig.caBundle}",
    ).stdout.strip()  # fmt: skip
    ca_file = plane.work / "webhook-ca.crt"
    ca_file.write_bytes(base64.b64decode(bundle))
    claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims?dryRun=All"

    def denied() -> bool:
        code, body = plane.request("POST", claims, PROBE_CLAIM)
        return code != 201 and "denied the request" in str(body)

    wait_until(
        denied,
        "the API server calls the webhook through its Service",
        "the probe claim denied",
        deadline_s=120,
    )
    return ControllerDeployment(
        plane, deployment, str(config["metadata"]["name"]), str(service), ca_file
    )
