"""Every manifest under examples/ passes ``sharegpu validate`` (Kubernetes 1.34 and 1.36)."""

from __future__ import annotations

import json

import pytest

from sharegpuctl.cli import main
from tests.paths import EXAMPLES_DIR

EXAMPLES = EXAMPLES_DIR


@pytest.mark.parametrize("version", ["1.34", "1.36"])
def test_examples_validate(version: str, capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(EXAMPLES.rglob("*.yaml"))
    assert files, f"no examples under {EXAMPLES}"
    # The capacity examples need DRAConsumableCapacity, off by default before 1.36 (their
    # README says so); validate warns unless the gate is said to be on.
    gates = ["--feature-gates", "DRAConsumableCapacity=true"] if version != "1.36" else []
    code = main(
        ["validate", "-f", str(EXAMPLES), "--kubernetes-version", version, "-o", "json", *gates]
    )
    report = json.loads(capsys.readouterr().out)
    assert report["findings"] == []
    assert code == 0
    assert report["objects"] >= len(files)
