"""``sharegpu validate --quota``: the offline verdict uses the webhook's charge rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sharegpuctl.cli import main
from tests.paths import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "gpu-quota"


def test_the_example_quota_denies_the_second_claim(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["validate", "-f", str(EXAMPLE / "quota-claims.yaml"), "-o", "json"]
    code = main([*args, "--quota", str(EXAMPLE / "gpu-quota.yaml")])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    (finding,) = report["findings"]
    assert finding["name"] == "share-b"
    assert finding["message"] == (
        "exceeded GpuQuota gpu-quota-demo/team-gpus: cores: used 60, asked 60, hard 100, 40 left"
    )


def test_a_hostile_quota_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "q.yaml"
    bad.write_text(
        "apiVersion: resource.sharegpu.dev/v1alpha1\nkind: GpuQuota\n"
        "metadata: {name: q, namespace: x}\nspec: {hard: {cores: -4, memory: [1]}}\n"
    )
    code = main(["validate", "-f", str(EXAMPLE / "quota-claims.yaml"), "--quota", str(bad)])
    err = capsys.readouterr().err
    assert code == 2
    assert "spec.hard.cores: must be an integer between 0 and 100000000 (got -4)" in err
    assert "Traceback" not in err
