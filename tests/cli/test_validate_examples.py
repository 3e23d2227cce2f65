"""Every manifest under examples/ passes ``sharegpu validate`` (Kubernetes 1.34 and 1.36)."""

from __future__ import annotations

import json

import pytest

from sharegpu.cli import main
from tests.paths import EXAMPLES_DIR

EXAMPLES = EXAMPLES_DIR


@pytest.mark.parametrize("version", ["1.34", "1.36"])
def test_examples_validate(version: str, capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(EXAMPLES.rglob("*.yaml"))
    assert files, f"no examples under {EXAMPLES}"
    code = main(["validate", "-f", str(EXAMPLES), "--kubernetes-version", version, "-o", "json"])
    report = json.loads(capsys.readouterr().out)
    assert report["findings"] == []
    assert code == 0
    assert report["objects"] >= len(files)
