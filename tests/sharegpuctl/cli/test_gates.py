"""``sharegpu validate`` and ``sharegpu explain``: one set of checks, run before allocating,
and the feature gates of the Kubernetes version checked against (default: the latest, 1.37)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from api import gates
from sharegpuctl.cli import main

from .test_explain import NODE, claim, explain, request, write

Obj = dict[str, Any]


def validate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Obj]:
    code = main(["validate", *argv, "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


def typo_claim() -> Obj:
    obj = claim("typo", request(capacity={"memory": "10Gi", "cores": "20"}))
    exactly = obj["spec"]["devices"]["requests"][0]["exactly"]
    exactly["capacity"] = {"requets": exactly["capacity"]["requests"]}
    return obj


def test_explain_refuses_what_validate_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = write(tmp_path / "c.yaml", typo_claim())
    code, checked = validate(capsys, "-f", f)
    assert code == 1
    code, report = explain(capsys, "-f", f, "--node-name", NODE)
    assert code == 1
    assert report["valid"] is False
    assert report["findings"] == checked["findings"]
    [finding] = report["findings"]
    assert finding["path"] == "spec.devices.requests[0].exactly.capacity"
    assert "requets" in finding["message"]
    assert [c["allocated"] for c in report["claims"]] == [False]
    assert "node" not in report["claims"][0]


def test_explain_human_output_names_the_finding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = write(tmp_path / "c.yaml", typo_claim())
    assert main(["explain", "-f", f, "--node-name", NODE]) == 1
    out = capsys.readouterr().out
    assert "allocated on node" not in out
    assert out.splitlines()[-1] == (
        "not allocated: 1 error(s) against Kubernetes 1.37 (the checks of sharegpu validate)"
    )


def test_a_valid_claim_is_still_allocated_and_warnings_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = write(tmp_path / "c.yaml", claim("ok", request(capacity={"memory": "10Gi"})))
    code, report = explain(capsys, "-f", f, "--node-name", NODE)
    assert code == 0
    assert report["kubernetesVersion"] == "1.37"
    assert [c["allocated"] for c in report["claims"]] == [True]
    # a memory-only share: the admission checks warn that cores take the default
    assert [x["severity"] for x in report["findings"]] == ["warning"]


def test_explain_checks_gates_at_the_version_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = write(tmp_path / "c.yaml", claim("s", request(capacity={"memory": "10Gi", "cores": "20"})))
    code, report = explain(capsys, "-f", f, "--node-name", NODE, "--kubernetes-version", "1.35")
    assert code == 0  # a warning: the 1.35 API server would drop the request
    [finding] = report["findings"]
    assert finding["message"].startswith("Kubernetes 1.35 drops capacity requests unless")


def test_default_version_is_the_latest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path / "c.yaml", claim("c", request()))
    _, report = validate(capsys, "-f", f)
    assert report["kubernetesVersion"] == "1.37" == "{}.{}".format(*gates.LATEST_KUBERNETES)


def derived_claim() -> Obj:
    obj = claim(
        "derived",
        request("a"),
        request("b"),
        constraints=[{"matchAttribute": "derived/numa"}],
    )
    for req in obj["spec"]["devices"]["requests"]:
        req["exactly"]["derivedAttributes"] = [
            {"name": "derived/numa", "expression": "device.attributes['gpu.sharegpu.dev'].index"}
        ]
    return obj


def skip_slice() -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {
            "driver": "gpu.sharegpu.dev",
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "skipNodeOperations": ["*"],
            "partitionTypeAttribute": "gpu.sharegpu.dev/profile",
            "devices": [{"name": "gpu-0"}],
        },
    }


@pytest.mark.parametrize(
    ("obj", "paths", "gate_names"),
    [
        (
            derived_claim(),
            [
                "spec.devices.requests[0].exactly.derivedAttributes",
                "spec.devices.requests[1].exactly.derivedAttributes",
            ],
            [gates.DERIVED_ATTRIBUTES] * 2,
        ),
        (
            skip_slice(),
            ["spec.skipNodeOperations", "spec.partitionTypeAttribute"],
            [gates.OPTIONAL_NODE_OPERATIONS, gates.PARTITIONABLE_DEVICES_TYPE],
        ),
    ],
    ids=["derivedAttributes", "slice"],
)
def test_new_alpha_fields_are_accepted_with_gates_off_and_unsupported_with_gates_on(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    obj: Obj,
    paths: list[str],
    gate_names: list[str],
) -> None:
    f = write(tmp_path / "o.yaml", obj)
    code, report = validate(capsys, "-f", f)
    assert code == 0, report
    assert [(x["path"], x["severity"]) for x in report["findings"]] == [
        (p, "warning") for p in paths
    ]
    for finding, gate in zip(report["findings"], gate_names, strict=True):
        assert (
            f"unless the {gate} feature gate is enabled (alpha and off by default from "
            in (finding["message"])
        )
    on = ",".join(f"{g}=true" for g in sorted(set(gate_names)))
    code, report = validate(capsys, "-f", f, "--feature-gates", on)
    assert code == 1
    assert [(x["path"], x["severity"]) for x in report["findings"]] == [(p, "error") for p in paths]
    for finding, gate in zip(report["findings"], gate_names, strict=True):
        assert (
            f"({gate}, alpha in Kubernetes 1.37) are not supported by sharegpu"
            in (finding["message"])
        )


def test_skip_node_operations_in_an_allocation_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = claim("held", request())
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": "gpu.sharegpu.dev",
                        "pool": NODE,
                        "device": "gpu-0",
                        "skipNodeOperations": ["NodePrepareResources", "NodeUnprepareResources"],
                    }
                ]
            }
        }
    }
    f = write(tmp_path / "c.yaml", obj)
    code, report = validate(capsys, "-f", f)
    assert code == 0
    [finding] = report["findings"]
    assert finding["path"] == "status.allocation.devices.results[0].skipNodeOperations"
    code, report = validate(
        capsys, "-f", f, "--feature-gates", f"{gates.OPTIONAL_NODE_OPERATIONS}=true"
    )
    assert code == 1
    # on 1.36 the field does not exist: the schema reports it, no gate finding
    code, report = validate(capsys, "-f", f, "--kubernetes-version", "1.36")
    assert code == 1
    assert all("feature gate" not in x["message"] for x in report["findings"])


def test_explain_prints_warnings_to_stderr_for_humans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = write(tmp_path / "c.yaml", claim("ok", request(capacity={"memory": "10Gi"})))
    assert main(["explain", "-f", f, "--node-name", NODE]) == 0
    out, err = capsys.readouterr()
    assert "default/ok: allocated on node" in out
    assert "warning" not in out
    [line] = err.splitlines()
    assert line.startswith(f"{f}: ResourceClaim/ok: spec.devices.requests[0]") and (
        ": warning: memory requested without cores" in line
    )


def test_a_device_class_extended_resource_needs_its_gate_before_1_36(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpus"},
        "spec": {
            "selectors": [{"cel": {"expression": "device.driver == 'gpu.sharegpu.dev'"}}],
            "extendedResourceName": "example.com/gpu",
        },
    }
    f = write(tmp_path / "c.yaml", device_class)
    code, report = validate(capsys, "-f", f, "--kubernetes-version", "1.35")
    assert code == 0
    [finding] = report["findings"]
    assert finding["path"] == "spec.extendedResourceName"
    assert f"unless the {gates.EXTENDED_RESOURCE} feature gate is enabled" in finding["message"]
    for extra in (
        ("--kubernetes-version", "1.36"),
        ("--feature-gates", "DRAExtendedResource=true"),
    ):
        args = (
            ("--kubernetes-version", "1.35", *extra)
            if extra[0] != "--kubernetes-version"
            else extra
        )
        code, report = validate(capsys, "-f", f, *args)
        assert (code, report["findings"]) == (0, [])


def alpha_1_36_slice() -> Obj:
    """A slice with the fields of the 1.36 alpha gates that are still off by default in 1.37:
    list-valued attributes and node-allocatable resources."""
    obj = skip_slice()
    del obj["spec"]["skipNodeOperations"], obj["spec"]["partitionTypeAttribute"]
    obj["spec"]["devices"] = [
        {
            "name": "gpu-0",
            "attributes": {"numaNodes": {"ints": [0, 1]}, "model": {"string": "x"}},
            "nodeAllocatableResources": {"memory": {"overhead": {"perPod": "1Gi"}}},
        }
    ]
    return obj


def test_gates_off_by_default_since_1_36_are_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    version = "1.37"
    f = write(tmp_path / "s.yaml", alpha_1_36_slice())
    code, report = validate(capsys, "-f", f, "--kubernetes-version", version)
    assert code == 0, report
    found = [(x["path"], x["severity"]) for x in report["findings"]]
    assert found == [
        ("spec.devices[0].attributes[numaNodes].ints", "warning"),
        ("spec.devices[0].nodeAllocatableResources", "warning"),
    ]
    lists, allocatable = (x["message"] for x in report["findings"])
    assert lists.startswith(
        f"Kubernetes {version} drops list-valued attributes unless the {gates.LIST_ATTRIBUTES} "
        "feature gate is enabled (alpha and off by default from 1.36)"
    )
    assert "refuses the slice" in lists
    assert allocatable.startswith(
        f"Kubernetes {version} drops node-allocatable resources unless the "
        f"{gates.NODE_ALLOCATABLE_RESOURCES} feature gate is enabled"
    )
    on = f"{gates.LIST_ATTRIBUTES}=true,{gates.NODE_ALLOCATABLE_RESOURCES}=true"
    code, report = validate(capsys, "-f", f, "--kubernetes-version", version, "--feature-gates", on)
    assert code == 1
    [finding] = report["findings"]
    assert finding["path"] == "spec.devices[0].nodeAllocatableResources"
    assert "are not supported by sharegpu" in finding["message"]


def test_list_valued_attributes_are_warned_about_at_1_36(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = alpha_1_36_slice()
    del obj["spec"]["devices"][0]["nodeAllocatableResources"]
    f = write(tmp_path / "s.yaml", obj)
    code, report = validate(capsys, "-f", f, "--kubernetes-version", "1.36")
    assert code == 0, report
    [finding] = report["findings"]
    assert finding["path"] == "spec.devices[0].attributes[numaNodes].ints"
    assert finding["message"].startswith("Kubernetes 1.36 drops list-valued attributes unless")


def test_partitionable_and_binding_fields_of_a_slice_are_warned_about_at_1_35(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = skip_slice()
    spec = obj["spec"]
    del spec["skipNodeOperations"], spec["partitionTypeAttribute"], spec["nodeName"]
    spec["perDeviceNodeSelection"] = True
    spec["devices"] = [
        {
            "name": "gpu-0",
            "nodeName": NODE,
            "bindsToNode": True,
            "bindingConditions": ["ready"],
            "bindingFailureConditions": ["failed"],
        }
    ]
    f = write(tmp_path / "s.yaml", obj)
    code, report = validate(capsys, "-f", f, "--kubernetes-version", "1.35")
    assert code == 0, report
    assert sorted(x["path"] for x in report["findings"]) == [
        "spec.devices[0].bindingConditions",
        "spec.devices[0].bindingFailureConditions",
        "spec.devices[0].bindsToNode",
        "spec.devices[0].nodeName",
        "spec.perDeviceNodeSelection",
    ]
    [per_device] = [x for x in report["findings"] if x["path"] == "spec.perDeviceNodeSelection"]
    assert f"unless the {gates.PARTITIONABLE_DEVICES} feature gate" in per_device["message"]
    assert per_device["message"].endswith("so the API server refuses it")
    code, report = validate(capsys, "-f", f, "--kubernetes-version", "1.36")
    assert (code, report["findings"]) == (0, [])


def test_distinct_attribute_needs_consumable_capacity_before_1_36(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = claim(
        "d",
        request("a"),
        request("b"),
        constraints=[{"distinctAttribute": "gpu.sharegpu.dev/uuid"}],
    )
    f = write(tmp_path / "c.yaml", obj)
    code, report = validate(capsys, "-f", f, "--kubernetes-version", "1.35")
    assert code == 0, report
    [finding] = report["findings"]
    assert finding["path"] == "spec.devices.constraints[0].distinctAttribute"
    assert f"unless the {gates.CONSUMABLE_CAPACITY} feature gate" in finding["message"]
    assert "refuses the claim" in finding["message"]
    code, report = validate(capsys, "-f", f)
    assert (code, report["findings"]) == (0, [])


def typo_class() -> Obj:
    """The driver's DeviceClass with ``selectors`` mistyped: every device would match it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.sharegpu.dev"},
        "spec": {"selectorz": [{"cel": {"expression": "device.driver == 'gpu.sharegpu.dev'"}}]},
    }


@pytest.mark.parametrize(
    ("option", "obj", "path"),
    [
        ("--classes", typo_class(), "spec"),
        ("--allocated", typo_claim(), "spec.devices.requests[0].exactly.capacity"),
    ],
    ids=["classes", "allocated"],
)
def test_explain_checks_the_classes_and_allocated_files_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, obj: Obj, path: str
) -> None:
    f = write(tmp_path / "c.yaml", claim("ok", request()))
    side = write(tmp_path / "side.yaml", obj)
    code, report = explain(capsys, "-f", f, option, side, "--node-name", NODE)
    assert code == 1
    assert report["valid"] is False
    [finding] = report["findings"]
    assert (finding["file"], finding["path"], finding["severity"]) == (side, path, "error")
    assert [c["allocated"] for c in report["claims"]] == [False]
