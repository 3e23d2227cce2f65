"""The driver's control-plane side on a :class:`~tests.e2e.controlplane.ControlPlane`: the CRDs,
the chart's controller RBAC, the controller process (``python -m controller``) and the chart's
webhook registration pointed at it. Shared by the test fixtures and ``tests/e2e/cluster.py``.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import sys
from pathlib import Path
from typing import Any, Final

import yaml

from tests.deploy.helpers import load_documents, run_helm
from tests.e2e.controlplane import WEBHOOK_CLIENT_NAME, ControlPlane, free_port, write_kubeconfig
from tests.e2e.processes import Process, StepFailed, failure, wait_until
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
    """The chart as ``helm template`` renders it, with the webhook's failure policy Fail (a
    webhook the API server cannot reach fails the request instead of admitting it silently),
    each ``values`` entry (``key=value``) set and each ``json_values`` entry (``key=JSON``) set
    with ``--set-json``."""
    argv = ("template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE)
    sets = [a for v in ("controller.webhook.failurePolicy=Fail", *values) for a in ("--set", v)]
    sets += [a for v in json_values for a in ("--set-json", v)]
    result = run_helm(helm, *argv, *sets)
    if result.returncode != 0:
        raise StepFailed(failure("render the chart", ["helm", *argv], result.stderr))
    return load_documents(result.stdout)


def apply(plane: ControlPlane, docs: list[dict[str, Any]], step_name: str) -> None:
    """``kubectl apply --server-side`` the documents."""
    plane.kubectl(
        "apply",
        "--server-side",
        "--field-manager=e2e",
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
class RunningController:
    """The controller process, where its webhook listens and the CA that signed its certificate."""

    process: Process
    webhook_port: int
    ca_file: Path


def start_controller(plane: ControlPlane, chart: list[dict[str, Any]]) -> RunningController:
    """``python -m controller`` with the chart's ServiceAccount and RBAC (a token of that account,
    so exactly the chart's permissions), its webhook on 127.0.0.1 with a certificate of the run's
    CA; returns once the webhook listens."""
    plane.kubectl("create", "namespace", NAMESPACE, step_name="create the namespace", check=False)
    rbac = [d for d in chart if component(d) == "controller" and d["kind"] in RBAC_KINDS]
    account = next(d["metadata"]["name"] for d in rbac if d["kind"] == "ServiceAccount")
    apply(plane, rbac, "apply the controller's RBAC from the chart")
    token = plane.kubectl(
        "create",
        "token",
        account,
        f"--namespace={NAMESPACE}",
        "--duration=24h",
        step_name="issue the controller's token",
    ).stdout.strip()
    kubeconfig = write_kubeconfig(
        plane.work / "controller.kubeconfig", plane.server, plane.pki.ca_file, token=token
    )
    cert, key = plane.pki.issue("webhook", "127.0.0.1", "localhost")
    argv = [
        sys.executable,
        "-m",
        "controller",
        f"--kubeconfig={kubeconfig}",
        "--webhook-address=127.0.0.1:0",
        f"--tls-cert-file={cert}",
        f"--tls-key-file={key}",
        # Only reviews with the API server's client certificate charge GpuQuotas.
        f"--webhook-client-ca-file={plane.pki.ca_file}",
        f"--webhook-client-name={WEBHOOK_CLIENT_NAME}",
        "--metrics-address=",
        f"--api-address=127.0.0.1:{free_port()}",
        "--leader-elect=true",
        f"--lease-namespace={NAMESPACE}",
    ]
    process = plane.processes.start(
        "controller", argv, env={"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)}
    )
    port: list[int] = []

    def webhook_listening() -> bool:
        match = re.search(r"webhook on https://127\.0\.0\.1:(\d+)", process.log.read_text())
        if match:
            port.append(int(match.group(1)))
        return bool(port)

    wait_until(webhook_listening, "start the controller", "the webhook listening", process=process)
    return RunningController(process, port[0], plane.pki.ca_file)


def register_webhook(
    plane: ControlPlane, controller: RunningController, chart: list[dict[str, Any]]
) -> str:
    """Apply the chart's ValidatingWebhookConfiguration with each service reference replaced by
    the controller's URL on 127.0.0.1; returns its name once the API server calls the webhook
    (a dry-run probe claim is denied)."""
    config = next(d for d in chart if d["kind"] == "ValidatingWebhookConfiguration")
    ca_bundle = base64.b64encode(controller.ca_file.read_bytes()).decode()
    for hook in config["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{controller.webhook_port}{path}",
            "caBundle": ca_bundle,
        }
    apply(plane, [config], "register the webhook")
    claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims?dryRun=All"

    def denied() -> bool:
        code, body = plane.request("POST", claims, PROBE_CLAIM)
        return code != 201 and "denied the request" in str(body)

    wait_until(
        denied,
        "register the webhook",
        "the API server calling the webhook",
        process=controller.process,
        deadline_s=60,
    )
    return str(config["metadata"]["name"])
