"""examples/gpu-and-nic-same-pcie-root against the slices of two drivers: sharegpu's mock GPUs
(4 under ``pci0000:00``, 4 under ``pci0000:80``) and the test NIC driver's NICs (``nic-0`` under
``pci0000:80``, ``nic-1`` under ``pci0000:40``). The allocator and ``sharegpu explain`` place the
claim only on a GPU and a NIC of one root, and say why a second one does not fit; the e2e run
(tests/e2e/test_topology.py) shows kube-scheduler doing the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from api import names
from sharegpu.allocator import allocate_many
from sharegpuctl.cli import main
from tests.e2e import nicdriver
from tests.examples.helpers import GPU_CLASS, NODE, example_claims, node_slices, results
from tests.paths import EXAMPLES_DIR

EXAMPLE = EXAMPLES_DIR / "gpu-and-nic-same-pcie-root"
CLASSES = [GPU_CLASS, nicdriver.device_class()]


def both_slices(nics: tuple[nicdriver.Nic, ...] = nicdriver.DEFAULT_NICS) -> list[dict[str, Any]]:
    return [*node_slices(names.SHARING_MODE_CONSUMABLE), nicdriver.nic_slice(NODE, nics)]


def roots(slices: list[dict[str, Any]], found: list[dict[str, Any]]) -> dict[str, str]:
    """Request -> the PCIe root of its device."""
    devices = {
        (s["spec"]["driver"], d["name"]): d for s in slices for d in s["spec"].get("devices", [])
    }
    return {
        r["request"]: devices[(r["driver"], r["device"])]["attributes"][names.ATTR_PCIE_ROOT][
            "string"
        ]
        for r in found
    }


def test_the_gpu_and_the_nic_share_a_pcie_root_and_a_second_claim_does_not_fit() -> None:
    slices = both_slices()
    (claim,) = example_claims(EXAMPLE.name)
    second = {**claim, "metadata": {"name": "second", "namespace": "default"}}
    first, other = allocate_many([claim, second], slices, CLASSES, node=NODE)
    found = results(first)
    assert {(r["driver"], r["request"]) for r in found} == {
        (names.DEFAULT_DRIVER_NAME, "gpu"),
        (nicdriver.DRIVER, "nic"),
    }
    assert roots(slices, found) == {"gpu": "pci0000:80", "nic": "pci0000:80"}
    assert other.allocation is None  # nic-1's root has no GPU


def test_no_nic_under_a_gpu_root_means_no_allocation() -> None:
    lonely = (nicdriver.Nic("nic-9", "pci0000:40", "0000:41:00.0"),)
    (outcome,) = allocate_many(
        example_claims(EXAMPLE.name), both_slices(lonely), CLASSES, node=NODE
    )
    assert outcome.allocation is None


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    slices, classes = tmp_path / "slices.yaml", tmp_path / "classes.yaml"
    slices.write_text(yaml.safe_dump_all(both_slices()))
    classes.write_text(yaml.safe_dump_all(CLASSES))
    return slices, classes


def explain(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    code = main(["explain", *args, "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_explain_offline_places_the_pair_and_says_why_a_second_claim_waits(
    inputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slices, classes = inputs
    common = ["--slices", str(slices), "--classes", str(classes)]
    code, report = explain(["-f", str(EXAMPLE), *common], capsys)
    assert code == 0
    (entry,) = report["claims"]
    assert entry["allocated"]
    assert roots(both_slices(), entry["results"]) == {"gpu": "pci0000:80", "nic": "pci0000:80"}
    # The first claim allocated (as the cluster has it), a second one of the same shape.
    allocated = tmp_path / "allocated.yaml"
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "first", "namespace": "default"},
        "spec": example_claims(EXAMPLE.name)[0]["spec"],
        "status": {"allocation": entry["allocation"]},
    }
    allocated.write_text(yaml.safe_dump(claim))
    pending = tmp_path / "second.yaml"
    pending.write_text(
        yaml.safe_dump(
            {**claim, "metadata": {"name": "second", "namespace": "default"}, "status": {}}
        )
    )
    code, report = explain(["-f", str(pending), *common, "--allocated", str(allocated)], capsys)
    assert code != 0
    (entry,) = report["claims"]
    assert not entry["allocated"]
    text = json.dumps(entry)
    assert "already allocated to default/first" in text
    assert (
        "matchAttribute resource.kubernetes.io/pcieRoot: device has pci0000:40, but no eligible "
        "device of request gpu has that value"
    ) in text
