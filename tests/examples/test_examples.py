"""The examples: layout, strict schemas, GpuConfigs, CEL selectors and `sharegpu validate`.

Every manifest validates strictly against the Kubernetes 1.34 and 1.36 schemas. The fields the
examples use that are gated in 1.34 (request ``capacity.requests``: DRAConsumableCapacity;
DeviceClass ``extendedResourceName``: DRAExtendedResource) are part of the 1.34 schemas, so both
versions check them; each example's README states the Kubernetes version and feature gate it
needs, because a 1.34 API server with the gate off drops those fields instead of refusing them.

Selectors are also evaluated against the devices the kubelet plugin publishes for its default mock
GPUs (H100 80GB), per sharing mode, to show that each selects what its README says.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.gpuconfig import GpuConfigError, parse_gpu_config
from api.names import DEFAULT_DRIVER_NAME
from kubeletplugin.devices.mock import default_gpu, gpu_from_entry, mig_devices_from_entries
from kubeletplugin.devices.slices import (
    consumable_device,
    desired_slices,
    partition_devices,
    resource_slice_objects,
)
from kubeletplugin.devices.table import node_devices
from sharegpu.allocator import allocate_many
from sharegpu.cel import CelCompileError, CelEvalError, compile_selector, device_activation
from tests.deploy.helpers import (
    EXAMPLES_DIR,
    KUBERNETES_VERSIONS,
    validation_errors,
)
from tests.examples.helpers import (
    EXAMPLE_FILES,
    GPU_CLASS,
    NODE,
    all_documents,
    claim_specs,
    documents,
    example_claims,
    example_classes,
    node_slices,
    results,
)

EXAMPLE_DIRS = sorted(p for p in EXAMPLES_DIR.iterdir() if p.is_dir())

#: The cases the examples must cover (one directory each).
REQUIRED_EXAMPLES = {
    "whole-gpu",
    "select-by-model-and-memory",
    "two-pods-fractional-share",
    "mps-with-overrides",
    "burstable-shares",
    "time-slicing",
    "multi-gpu-same-pcie-root",
    "multi-gpu-nvlink",
    "gpu-and-nic-same-pcie-root",
    "first-available",
    "device-plugin-style",
    "partitions",
    "admin-device-classes",
    "vllm-inference",
    "training-job",
    "mig-static",
    "gpu-quota",
}


def selector_expressions(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(request name, CEL expression) of every selector in the manifest."""
    if doc["kind"] == "DeviceClass":
        for selector in doc["spec"].get("selectors", []):
            yield "<class>", selector["cel"]["expression"]
    for spec in claim_specs(doc):
        for request in spec["devices"]["requests"]:
            alternatives = (
                [(request["name"], request["exactly"])]
                if "exactly" in request
                else [(f"{request['name']}/{s['name']}", s) for s in request["firstAvailable"]]
            )
            for name, body in alternatives:
                for selector in body.get("selectors", []):
                    yield name, selector["cel"]["expression"]


def example_selectors(example: str) -> dict[str, list[str]]:
    """Request name -> its selector expressions, for one example directory."""
    found: dict[str, list[str]] = {}
    for path in sorted((EXAMPLES_DIR / example).glob("*.yaml")):
        for doc in documents(path):
            for request, expression in selector_expressions(doc):
                found.setdefault(request, []).append(expression)
    return found


#: The sections every example README has after its title and paragraph, in this order.
README_SECTIONS = ["## Apply", "## Verify", "## Clean up"]


def test_every_case_has_a_directory_with_readme_and_manifests() -> None:
    assert {p.name for p in EXAMPLE_DIRS} >= REQUIRED_EXAMPLES
    for directory in EXAMPLE_DIRS:
        readme = directory / "README.md"
        assert readme.is_file(), f"{directory} has no README.md"
        text = readme.read_text()
        intro, _, rest = text.partition("\n## ")
        body = [block for block in intro.split("\n\n") if block.strip()]
        assert len(body) == 2 and body[0].startswith("# "), f"{readme}: a title and one paragraph"
        headings = re.findall(r"^## .*$", "## " + rest, re.MULTILINE)
        assert headings == README_SECTIONS, f"{readme}: sections {headings}"
        for section in re.split(r"^## .*$", "## " + rest, flags=re.MULTILINE)[1:]:
            assert "```" in section, f"{readme}: every section shows its commands"
        assert f"examples/{directory.name}/" in rest, f"{readme}: apply the example's files"
        assert list(directory.glob("*.yaml")), f"{directory} has no manifests"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.parent.name)
def test_manifests_validate_strictly(path: Path, version: str) -> None:
    docs = documents(path)
    assert docs, f"{path} is empty"
    errors = [err for doc in docs for err in validation_errors(doc, version)]
    assert errors == []


def test_gpu_configs_are_valid() -> None:
    seen = 0
    for path, doc in all_documents():
        for spec in claim_specs(doc):
            for entry in spec["devices"].get("config", []):
                opaque = entry["opaque"]
                assert opaque["driver"] == DEFAULT_DRIVER_NAME
                try:
                    parse_gpu_config(opaque["parameters"])
                except GpuConfigError as err:
                    pytest.fail(f"{path}: {err}")
                seen += 1
    assert seen >= 2, "the MPS and time-slicing examples carry GpuConfigs"


def test_selectors_compile() -> None:
    problems: list[str] = []
    for path, doc in all_documents():
        for request, expression in selector_expressions(doc):
            try:
                compile_selector(expression)
            except CelCompileError as err:
                problems.append(f"{path} request {request}: {err}")
    assert problems == []


def matching(expressions: list[str], devices: list[dict[str, Any]]) -> list[str]:
    """Names of the devices every expression selects; an evaluation error propagates."""
    programs = [compile_selector(e) for e in expressions]
    chosen = []
    for device in devices:
        activation = device_activation(DEFAULT_DRIVER_NAME, device)
        if all(p.evaluate(activation) for p in programs):
            chosen.append(device["name"])
    return chosen


H100 = default_gpu("node-a", 0, 1)
A100 = gpu_from_entry(
    "node-a", 1, 2, {"productName": "NVIDIA A100-SXM4-40GB", "memoryTotal": 42949672960}
)


def test_whole_gpu_selects_only_whole_devices_in_every_mode() -> None:
    (expressions,) = example_selectors("whole-gpu").values()
    assert matching(expressions, [consumable_device(H100)]) == ["gpu-0"]
    assert matching(expressions, partition_devices(H100)) == ["gpu-0"]


def test_model_and_memory_selectors_pick_the_h100() -> None:
    (expressions,) = example_selectors("select-by-model-and-memory").values()
    devices = [consumable_device(H100), consumable_device(A100)]
    assert matching(expressions, devices) == ["gpu-0"]


def test_first_available_prefers_h100_then_a100_then_any() -> None:
    selectors = example_selectors("first-available")
    h100, a100 = consumable_device(H100), consumable_device(A100)
    assert matching(selectors["gpu/h100"], [h100, a100]) == ["gpu-0"]
    assert matching(selectors["gpu/a100"], [h100, a100]) == ["gpu-1"]
    assert "gpu/any" not in selectors, "the last alternative takes any device of the class"


def test_partitions_example_selects_the_halves() -> None:
    (expressions,) = example_selectors("partitions").values()
    assert matching(expressions, partition_devices(H100)) == ["gpu-0-half-0", "gpu-0-half-1"]
    # Outside partitions mode the attribute does not exist: an error, as its README says.
    with pytest.raises(CelEvalError):
        matching(expressions, [consumable_device(H100)])


@pytest.mark.process
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_sharegpu_validate_accepts_every_example_without_warnings(version: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sharegpuctl",
            "validate",
            "-f",
            str(EXAMPLES_DIR),
            "--kubernetes-version",
            version,
            "-o",
            "json",
            # The capacity examples need DRAConsumableCapacity, off by default before 1.36.
            *(["--feature-gates", "DRAConsumableCapacity=true"] if version < "1.36" else []),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["objects"] == sum(1 for _ in all_documents())
    assert (report["errors"], report["warnings"]) == (0, 0), report["findings"]


# --- allocation on the slices the plugin publishes (kube-scheduler semantics) ---


@pytest.mark.parametrize(
    ("example", "mode"),
    [
        ("whole-gpu", "consumable"),
        ("whole-gpu", "partitions"),
        ("whole-gpu", "exclusive"),
        ("select-by-model-and-memory", "consumable"),
        ("two-pods-fractional-share", "consumable"),
        ("mps-with-overrides", "consumable"),
        ("burstable-shares", "consumable"),
        ("time-slicing", "consumable"),
        ("multi-gpu-same-pcie-root", "consumable"),
        ("multi-gpu-nvlink", "consumable"),
        ("multi-gpu-nvlink", "exclusive"),
        ("first-available", "consumable"),
        ("partitions", "partitions"),
        ("admin-device-classes", "partitions"),
        ("vllm-inference", "consumable"),
        ("training-job", "consumable"),
    ],
)
def test_example_claims_are_allocatable(example: str, mode: str) -> None:
    claims = example_claims(example)
    assert claims
    classes = example_classes(example)
    for outcome in allocate_many(claims, node_slices(mode), classes, node=NODE):
        assert results(outcome)


def test_two_fractional_shares_land_on_one_gpu() -> None:
    small, large = allocate_many(
        example_claims("two-pods-fractional-share"),
        node_slices("consumable"),
        [GPU_CLASS],
        node=NODE,
    )
    (a,), (b,) = results(small), results(large)
    assert a["device"] == b["device"] == "gpu-0"
    assert a["shareID"] != b["shareID"]
    assert a["consumedCapacity"] == {"cores": "30", "memory": "10Gi"}
    assert b["consumedCapacity"] == {"cores": "50", "memory": "20Gi"}


def test_whole_gpu_takes_all_capacity_and_partitions_take_half() -> None:
    (whole,) = allocate_many(
        example_claims("whole-gpu"), node_slices("consumable"), [GPU_CLASS], node=NODE
    )
    (result,) = results(whole)
    assert result["consumedCapacity"]["cores"] == "100"
    (half,) = allocate_many(
        example_claims("partitions"), node_slices("partitions"), [GPU_CLASS], node=NODE
    )
    (result,) = results(half)
    assert result["device"] == "gpu-0-half-0"


def test_multi_gpu_example_gets_two_gpus_on_one_pcie_root() -> None:
    claims = example_claims("multi-gpu-same-pcie-root")
    (outcome,) = allocate_many(claims, node_slices("consumable"), [GPU_CLASS], node=NODE)
    devices = [r["device"] for r in results(outcome)]
    assert len(set(devices)) == 2


def test_first_available_takes_the_h100_subrequest() -> None:
    (outcome,) = allocate_many(
        example_claims("first-available"), node_slices("consumable"), [GPU_CLASS], node=NODE
    )
    (result,) = results(outcome)
    assert result["request"] == "gpu/h100"


def test_admin_classes_pick_a_quarter_and_a_whole_h100() -> None:
    classes = example_classes("admin-device-classes")
    by_claim = dict(
        zip(
            [c["metadata"]["name"] for c in example_claims("admin-device-classes")],
            allocate_many(
                example_claims("admin-device-classes"),
                node_slices("partitions"),
                classes,
                node=NODE,
            ),
            strict=True,
        )
    )
    (quarter,) = results(by_claim["quarter-gpu"])
    assert quarter["device"] == "gpu-0-quarter-0"
    (h100,) = results(by_claim["h100-gpu"])
    assert h100["device"] == "gpu-1", "gpu-0 is partly taken by the quarter"
    # In consumable mode the quarter class matches nothing (its README says so); H100s still do.
    quarter_c, h100_c = allocate_many(
        example_claims("admin-device-classes"), node_slices("consumable"), classes, node=NODE
    )
    assert quarter_c.allocation is None
    (whole,) = results(h100_c)
    assert whole["consumedCapacity"] == {"cores": "100", "memory": "79Gi"}


def test_admin_h100_class_rejects_other_models() -> None:
    (h100_class,) = [
        c
        for c in example_classes("admin-device-classes")
        if c["metadata"]["name"].startswith("h100")
    ]
    expressions = [s["cel"]["expression"] for s in h100_class["spec"]["selectors"]]
    assert matching(expressions, [consumable_device(H100), consumable_device(A100)]) == ["gpu-0"]
    assert matching(expressions, partition_devices(H100)) == ["gpu-0"]


def test_vllm_replicas_and_training_shares_fit_two_on_a_gpu() -> None:
    (vllm,) = example_claims("vllm-inference")
    (share,) = [
        c for c in example_claims("training-job") if c["metadata"]["name"].endswith("share")
    ]
    for claim in (vllm, share):
        pair = [claim, {**claim, "metadata": {**claim["metadata"], "name": "second"}}]
        outcomes = allocate_many(pair, node_slices("consumable"), [GPU_CLASS], node=NODE)
        devices = [r["device"] for outcome in outcomes for r in results(outcome)]
        assert devices == ["gpu-0", "gpu-0"], claim["metadata"]["name"]


def mig_node_slices(mode: str) -> list[dict[str, Any]]:
    """The slices of a node whose GPU 0 holds two 1g.10gb and one 3g.40gb MIG device."""
    parent = dataclasses.replace(default_gpu(NODE, 0, 2), mig_mode="Enabled")
    entries = [
        {"profile": "1g.10gb", "gpuInstance": 9},
        {"profile": "1g.10gb", "gpuInstance": 10},
        {"profile": "3g.40gb", "gpuInstance": 2},
    ]
    migs = mig_devices_from_entries(NODE, parent, entries, "MIG test node")
    gpus = [dataclasses.replace(parent, mig_devices=migs), default_gpu(NODE, 1, 2)]
    objects = resource_slice_objects(
        desired_slices(node_devices(gpus, mode)), DEFAULT_DRIVER_NAME, NODE, None, 1
    )
    for obj in objects:
        obj["metadata"]["name"] = obj["metadata"]["generateName"] + "x"
    return objects


@pytest.mark.parametrize("mode", ["consumable", "partitions", "exclusive"])
def test_mig_example_takes_the_1g_10gb_mig_devices_one_claim_each(mode: str) -> None:
    (claim,) = example_claims("mig-static")
    claims = [{**claim, "metadata": {**claim["metadata"], "name": f"mig-{i}"}} for i in range(3)]
    first, second, third = allocate_many(
        claims, mig_node_slices(mode), example_classes("mig-static"), node=NODE
    )
    assert [r["device"] for o in (first, second) for r in results(o)] == [
        "gpu-0-mig-9-0",
        "gpu-0-mig-10-0",
    ]
    assert third.allocation is None, "two 1g.10gb MIG devices, never shared"
