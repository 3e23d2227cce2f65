"""explain offline on this node: the sharing mode and MIG strategy a claim needs, and the
DeviceClasses the chart installs, named in its messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sharegpuctl.cli import main
from sharegpuctl.cli.common import chart_installed_class_names
from tests.paths import EXAMPLES_DIR

Obj = dict[str, Any]


def explain(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[Obj]]:
    code = main(["explain", *argv, "--mock", "1", "--node-name", "n1", "-o", "json"])
    return code, list(json.loads(capsys.readouterr().out)["claims"])


@pytest.mark.parametrize(
    ("example", "flags"),
    [
        ("partitions", "--sharing-mode partitions"),
        ("mig-dynamic", "--sharing-mode partitions --mig dynamic"),
    ],
)
def test_a_claim_that_needs_another_mode_gets_a_hint_naming_it(
    capsys: pytest.CaptureFixture[str], example: str, flags: str
) -> None:
    code, entries = explain(capsys, "-f", str(EXAMPLES_DIR / example))
    assert code == 1 and entries
    for entry in entries:
        assert entry["allocated"] is False
        assert entry["hint"].startswith(
            f"it would be allocated with {flags} (this run: --sharing-mode consumable)"
        )
    # With the flags of the hint, they are allocated, and no hint remains.
    code, entries = explain(capsys, "-f", str(EXAMPLES_DIR / example), *flags.split())
    assert code == 0
    assert all(e["allocated"] and "hint" not in e for e in entries)


def test_the_hint_is_printed_with_the_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["explain", "-f", str(EXAMPLES_DIR / "partitions"), "--mock", "1", "-o", "text"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "  hint: it would be allocated with --sharing-mode partitions (this run:" in out
    assert "the chart's kubeletPlugin.sharingMode=partitions" in out


def _claim_of(count: int, device_class: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": count}}
                ]
            }
        },
    }


def test_no_hint_when_no_mode_allocates_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_claim_of(9, "gpu.sharegpu.dev")))
    code, [entry] = explain(capsys, "-f", str(path))
    assert code == 1 and entry["allocated"] is False
    assert "hint" not in entry


def test_a_missing_class_names_every_class_the_chart_installs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_claim_of(1, "nope.gpu.sharegpu.dev")))
    code, [entry] = explain(capsys, "-f", str(path))
    assert code == 1
    installed = chart_installed_class_names()
    assert installed == ("gpu.sharegpu.dev", "mig.gpu.sharegpu.dev")
    assert entry["error"].endswith(
        "create the class (the sharegpu chart installs gpu.sharegpu.dev and mig.gpu.sharegpu.dev)"
    )
    # Offline, both chart classes stand in (the cluster would have both).
    assert "(DeviceClasses there: gpu.sharegpu.dev, mig.gpu.sharegpu.dev)" in entry["error"]
