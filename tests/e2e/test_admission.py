"""The chart's controller Deployment's validating webhook, called by a real kube-apiserver through
its Service and kube-proxy (the release's registration, its default failure policy): a bad
GpuConfig is denied naming its field path, and a GpuQuota admits the claim that fits and denies
the one over it (examples/gpu-quota)."""

from __future__ import annotations

from typing import Any

import yaml

from tests.deploy.helpers import load_documents
from tests.e2e.claims import gpu_config, share_claim
from tests.e2e.controlplane import ControlPlane
from tests.e2e.driver import ControllerDeployment
from tests.e2e.processes import step, wait_until
from tests.paths import EXAMPLES_DIR

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"


def test_bad_gpu_config_is_denied_naming_the_field(webhook: str, crds: ControlPlane) -> None:
    bad = share_claim("bad-config", "default", gpu_config({"sharing": {"strategy": "Mps"}}))
    result = crds.kubectl("create", "-f", "-", stdin=yaml.safe_dump(bad), check=False)
    with step("a bad GpuConfig is denied", "kubectl create -f bad-config.yaml"):
        assert result.returncode != 0, result.stdout
        assert 'admission webhook "resourceclaim.gpu.sharegpu.dev" denied' in result.stderr
        assert "spec.devices.config[0].opaque.parameters" in result.stderr, result.stderr
        assert "sharing.strategy" in result.stderr, result.stderr
    good = share_claim("good-config", "default", gpu_config({"sharing": {"strategy": "MPS"}}))
    crds.kubectl("create", "-f", "-", stdin=yaml.safe_dump(good), step_name="a good GpuConfig")
    crds.kubectl("delete", "resourceclaim", "good-config", step_name="delete the good claim")


def test_gpu_quota_admits_within_and_denies_over(webhook: str, crds: ControlPlane) -> None:
    example = EXAMPLES_DIR / "gpu-quota"
    crds.kubectl("apply", "-f", str(example / "gpu-quota.yaml"), step_name="apply the GpuQuota")
    claims = {
        d["metadata"]["name"]: d
        for d in load_documents((example / "quota-claims.yaml").read_text())
    }
    within = crds.kubectl(
        "create", "-f", "-", stdin=yaml.safe_dump(claims["share-a"]), step_name="claim within"
    )
    assert "share-a created" in within.stdout
    over = crds.kubectl("create", "-f", "-", stdin=yaml.safe_dump(claims["share-b"]), check=False)
    with step("the GpuQuota denies the claim over it", "kubectl create -f share-b.yaml"):
        assert over.returncode != 0, over.stdout
        assert "denied the request" in over.stderr, over.stderr
        assert "team-gpus" in over.stderr, over.stderr
    quota = crds.kubectl(
        "get", "gpuq", "team-gpus", "-n", "gpu-quota-demo", "-o", "yaml", step_name="get gpuq"
    ).stdout
    used = yaml.safe_load(quota).get("status", {}).get("used", {})
    assert used.get("cores") == 60, quota


def _forged_review(
    plane: ControlPlane, controller: ControllerDeployment, claim: dict[str, Any]
) -> dict[str, Any]:
    """POST an AdmissionReview of a CREATE of ``claim`` straight to the webhook Service, past the
    API server and without its client certificate (from inside the sealed namespace); the
    review's response."""
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "forged-1",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "operation": "CREATE",
            "namespace": claim["metadata"]["namespace"],
            "object": {**claim, "metadata": {**claim["metadata"], "uid": "forged-uid"}},
        },
    }
    code, answer = controller.service_request(
        controller.webhook_service, 443, "POST", "/validate/resourceclaims", review
    )
    assert code == 200, answer
    response: dict[str, Any] = answer["response"]
    return response


def test_only_the_api_servers_reviews_charge_a_gpu_quota(
    webhook: str, crds: ControlPlane, controller: ControllerDeployment
) -> None:
    """The API server presents its client certificate (its AdmissionConfiguration, as
    docs/install.md sets it up); a review sent to the webhook without it is judged against the
    quota but never charged, so it cannot block the namespace's real claims."""
    quota = {
        "apiVersion": "resource.sharegpu.dev/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": "one-share", "namespace": "default"},
        "spec": {"hard": {"devices": 1}},
    }
    crds.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(quota), step_name="apply a GpuQuota")

    def charges() -> dict[str, Any]:
        got = crds.kubectl(
            "get", "gpuq", "one-share", "-o", "yaml", step_name="get the GpuQuota"
        ).stdout
        found: dict[str, Any] = (yaml.safe_load(got).get("status") or {}).get("claims") or {}
        return found

    try:
        with step("a forged review is admitted but not charged", "POST /validate/resourceclaims"):
            assert (
                _forged_review(crds, controller, share_claim("forged", "default"))["allowed"]
                is True
            )
            assert charges() == {}
        real = crds.kubectl(
            "create",
            "-f",
            "-",
            stdin=yaml.safe_dump(share_claim("real", "default")),
            step_name="a claim through the API server",
        )
        assert "real created" in real.stdout
        # Charged by admission (or, while the quota is not in the watch cache yet, by the
        # quota controller from the live claim).
        wait_until(
            lambda: [c.get("name") for c in charges().values()] == ["real"],
            "the claim through the API server is charged",
            "status.claims naming only the real claim",
        )
        with step("a forged review over the quota is denied and charges nothing", "POST"):
            denied = _forged_review(crds, controller, share_claim("forged-2", "default"))
            assert denied["allowed"] is False and "one-share" in denied["status"]["message"]
            assert [c.get("name") for c in charges().values()] == ["real"]
    finally:
        crds.kubectl("delete", "resourceclaim", "real", "--ignore-not-found", step_name="cleanup")
        crds.kubectl("delete", "gpuq", "one-share", "--ignore-not-found", step_name="cleanup")
