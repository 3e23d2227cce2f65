"""validate and explain refuse a resource.k8s.io version the target release does not serve
(:mod:`api.apiversions`), naming the versions it serves and how v1 shapes the request, unless
``--runtime-config`` enables it as the cluster's kube-apiserver does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sharegpuctl.cli import main

V1BETA1_CLAIM = """\
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaim
metadata: {name: c, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      deviceClassName: gpu.sharegpu.dev
"""
SERVED_ERROR = (
    "Kubernetes 1.37 does not serve resource.k8s.io/v1beta1 (it serves resource.k8s.io/v1); its "
    "API server serves resource.k8s.io/v1beta1 only with --runtime-config="
    "resource.k8s.io/v1beta1=true"
)
SHAPE_HINT = "deviceClassName: in resource.k8s.io/v1, put deviceClassName, count, selectors and"


def claim_file(tmp_path: Path, text: str = V1BETA1_CLAIM) -> str:
    path = tmp_path / "claim.yaml"
    path.write_text(text)
    return str(path)


def findings(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, str]]]:
    code = main([*argv, "-o", "json"])
    return code, list(json.loads(capsys.readouterr().out)["findings"])


def test_validate_refuses_v1beta1_at_the_default_release(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, found = findings(capsys, "validate", "-f", claim_file(tmp_path))
    assert code == 1
    assert [(f["path"], f["severity"]) for f in found] == [
        ("apiVersion", "error"),
        ("spec.devices.requests[0]", "error"),
    ]
    assert found[0]["message"].startswith(SERVED_ERROR)
    assert found[1]["message"].startswith(SHAPE_HINT)


def test_explain_does_not_allocate_a_claim_the_release_does_not_serve(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["explain", "-f", claim_file(tmp_path), "--mock", "1", "-o", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert report["valid"] is False
    assert [c["allocated"] for c in report["claims"]] == [False]
    assert report["findings"][0]["message"].startswith(SERVED_ERROR)


def test_runtime_config_enables_the_version_as_the_cluster_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = claim_file(tmp_path)
    enable = ["--runtime-config", "resource.k8s.io/v1beta1=true"]
    code, found = findings(capsys, "validate", "-f", path, *enable)
    assert code == 0 and found == []
    assert main(["explain", "-f", path, "--mock", "1", *enable, "-o", "json"]) == 0
    capsys.readouterr()
    # =false, or another version, enables nothing.
    for other in ("resource.k8s.io/v1beta1=false", "resource.k8s.io/v1beta2=true"):
        code, found = findings(capsys, "validate", "-f", path, "--runtime-config", other)
        assert code == 1 and found[0]["path"] == "apiVersion"


@pytest.mark.parametrize("release", ["1.34", "1.35", "1.36"])
def test_every_supported_release_serves_only_v1_by_default(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, release: str
) -> None:
    v1beta2 = V1BETA1_CLAIM.replace("v1beta1", "v1beta2")
    code, found = findings(
        capsys, "validate", "-f", claim_file(tmp_path, v1beta2), "--kubernetes-version", release
    )
    assert code == 1
    assert found[0]["message"].startswith(
        f"Kubernetes {release} does not serve resource.k8s.io/v1beta2 (it serves "
        "resource.k8s.io/v1)"
    )
    v1 = V1BETA1_CLAIM.replace("v1beta1", "v1").replace(
        "      deviceClassName: gpu.sharegpu.dev",
        "      exactly: {deviceClassName: gpu.sharegpu.dev}",
    )
    code, found = findings(
        capsys, "validate", "-f", claim_file(tmp_path, v1), "--kubernetes-version", release
    )
    assert code == 0, found


def test_a_malformed_runtime_config_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["validate", "-f", claim_file(tmp_path), "--runtime-config", "v1beta1"])
    assert code == 2
    assert (
        "--runtime-config v1beta1: 'v1beta1' is not GROUP/VERSION=true" in capsys.readouterr().err
    )
