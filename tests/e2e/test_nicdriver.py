"""The test NIC driver's own rules, without a cluster: its slice, its ``--nics`` flag, and what
preparing and unpreparing a claim answers and writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.kubelet.preparer import ClaimRef
from sharegpu.kube.slicerules import validate_resource_slice
from tests.e2e import nicdriver

NODE = "node-a"
REF = ClaimRef(namespace="ns", uid="0f1e2d3c-0000-0000-0000-000000000001", name="c")


def claim(results: list[dict[str, Any]], uid: str = REF.uid) -> dict[str, Any]:
    return {
        "metadata": {"name": REF.name, "namespace": REF.namespace, "uid": uid},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def result(device: str, driver: str = nicdriver.DRIVER, request: str = "nic") -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": NODE, "device": device}


def preparer(found: dict[str, Any] | None, cdi: Path) -> nicdriver.NicPreparer:
    return nicdriver.NicPreparer(lambda _path: found, NODE, nicdriver.DEFAULT_NICS, cdi)


def test_the_slice_is_valid_and_its_roots_match_some_mock_gpus_only() -> None:
    slice_ = nicdriver.nic_slice(NODE)
    assert validate_resource_slice(slice_) == []
    roots = [
        d["attributes"]["resource.kubernetes.io/pcieRoot"]["string"]
        for d in slice_["spec"]["devices"]
    ]
    assert roots == ["pci0000:80", "pci0000:40"]  # the mock GPUs 4-7 are under pci0000:80


def test_nics_flag() -> None:
    assert nicdriver.parse_nics("a=pci0000:00=0000:01:00.0") == [
        nicdriver.Nic("a", "pci0000:00", "0000:01:00.0")
    ]
    with pytest.raises(ValueError, match="name=pcieRoot=pciBusID"):
        nicdriver.parse_nics("a=pci0000:00")


def test_prepare_answers_its_own_results_and_writes_the_spec(tmp_path: Path) -> None:
    found = claim([result("nic-0"), result("gpu-4", driver="gpu.sharegpu.dev", request="gpu")])
    p = preparer(found, tmp_path)
    (outcome,) = p.prepare([REF]).values()
    assert outcome.error == ""
    (device,) = outcome.devices
    assert (device.device_name, device.request_names) == ("nic-0", ("nic",))
    assert device.cdi_device_ids == (f"{nicdriver.CDI_KIND}={REF.uid}",)
    spec = json.loads(p.spec_path(REF.uid).read_text())
    assert spec["devices"][0]["containerEdits"]["env"] == [
        "NIC_DEVICES=nic-0",
        "NIC_PCIE_ROOTS=pci0000:80",
    ]
    p.unprepare([REF])
    assert not p.spec_path(REF.uid).exists()


@pytest.mark.parametrize(
    ("found", "error"),
    [
        (None, "not found"),
        (claim([result("nic-0")], uid="other"), "not found"),
        (claim([result("gpu-0", driver="gpu.sharegpu.dev")]), "no NIC of this node"),
        (claim([result("nic-7")]), "no NIC of this node"),
    ],
)
def test_prepare_refuses_what_is_not_its_own(
    found: dict[str, Any] | None, error: str, tmp_path: Path
) -> None:
    (outcome,) = preparer(found, tmp_path).prepare([REF]).values()
    assert error in outcome.error and outcome.devices == ()
    assert list(tmp_path.iterdir()) == []
