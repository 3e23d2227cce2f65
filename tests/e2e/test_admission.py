"""The controller's validating webhook called by a real kube-apiserver (the chart's registration,
failure policy Fail): a bad GpuConfig is denied naming its field path, and a GpuQuota admits the
claim that fits and denies the one over it (examples/gpu-quota)."""

from __future__ import annotations

from typing import Any

import yaml

from tests.deploy.helpers import load_documents
from tests.e2e.controlplane import ControlPlane
from tests.e2e.processes import step
from tests.paths import EXAMPLES_DIR

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"


def _claim(name: str, namespace: str, config: list[Any] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpu.sharegpu.dev",
                    "capacity": {"requests": {"cores": "30", "memory": "4Gi"}},
                },
            }
        ]
    }
    if config is not None:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": devices},
    }


def _gpu_config(parameters: dict[str, Any]) -> list[Any]:
    return [
        {
            "opaque": {
                "driver": "gpu.sharegpu.dev",
                "parameters": {
                    "apiVersion": "resource.sharegpu.dev/v1alpha1",
                    "kind": "GpuConfig",
                    **parameters,
                },
            }
        }
    ]


def test_bad_gpu_config_is_denied_naming_the_field(webhook: str, crds: ControlPlane) -> None:
    bad = _claim("bad-config", "default", _gpu_config({"sharing": {"strategy": "Mps"}}))
    result = crds.kubectl("create", "-f", "-", stdin=yaml.safe_dump(bad), check=False)
    with step("a bad GpuConfig is denied", "kubectl create -f bad-config.yaml"):
        assert result.returncode != 0, result.stdout
        assert 'admission webhook "resourceclaim.gpu.sharegpu.dev" denied' in result.stderr
        assert "spec.devices.config[0].opaque.parameters" in result.stderr, result.stderr
        assert "sharing.strategy" in result.stderr, result.stderr
    good = _claim("good-config", "default", _gpu_config({"sharing": {"strategy": "MPS"}}))
    crds.kubectl("create", "-f", "-", stdin=yaml.safe_dump(good), step_name="a good GpuConfig")
    crds.kubectl("delete", "resourceclaim", "good-config", step_name="delete the good claim")


def test_gpu_quota_admits_within_and_denies_over(webhook: str, crds: ControlPlane) -> None:
    example = EXAMPLES_DIR / "gpu-quota"
    crds.kubectl("apply", "-f", str(example / "gpu-quota.yaml"), step_name="apply the GpuQuota")
    claims = {
        d["metadata"]["name"]: d for d in load_documents((example / "claims.yaml").read_text())
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
