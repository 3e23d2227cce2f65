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
