"""``sharegpu demo``: the whole driver end to end, checked through its JSON report."""

from __future__ import annotations

import contextlib
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from api.quantity import quantity_int
from sharegpu.cli import main
from sharegpu.cli.demo import tables_of
from sharegpu.cli.output import render_table
from tests.paths import EXAMPLES_DIR

CDI_PREFIX = "k8s.gpu.sharegpu.dev/claim="
EXPECTED_CLAIMS = {
    "default/whole-gpu",
    "default/small-share",
    "default/large-share",
    "default/mps-share",
    "default/h100-with-70gi",
    "default/two-gpus-one-pcie-root",
    "default/h100-else-a100-else-any",
}


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    """One demo run (``-o json``) shared by the tests of this module."""
    before = set(Path("/tmp").glob("sharegpu-demo-*"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["demo", "-o", "json"])
    data: dict[str, Any] = json.loads(out.getvalue())
    data["_exit"] = code
    data["_new_temp_dirs"] = sorted(set(Path("/tmp").glob("sharegpu-demo-*")) - before)
    return data


def by_claim(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["claim"]: c for c in report["claims"]}


def test_exit_code_slices_and_registration(report: dict[str, Any]) -> None:
    assert report["_exit"] == 0
    assert report["plugin"]["backend"] == "mock"
    assert report["plugin"]["sharingMode"] == "consumable"
    assert report["plugin"]["gpus"] == 8
    assert report["plugin"]["registeredVersion"] == "v1.DRAPlugin"
    assert report["slices"]["devices"] == 8
    names = [n for s in report["slices"]["items"] for n in s["deviceNames"]]
    assert names == [f"gpu-{i}" for i in range(8)]


def test_every_claim_allocated_and_prepared_with_cdi_ids(report: dict[str, Any]) -> None:
    claims = by_claim(report)
    assert set(claims) == EXPECTED_CLAIMS
    for name, c in claims.items():
        assert c["allocated"] and c["prepared"], name
        assert len(c["devices"]) == len(c["results"]), name
        for device in c["devices"]:
            ours = [i for i in device["cdiDeviceIDs"] if i.startswith(CDI_PREFIX)]
            assert len(ours) == 1, device
            assert c["uid"] in ours[0]
    assert [r["device"] for r in claims["default/two-gpus-one-pcie-root"]["results"]] == [
        "gpu-4",
        "gpu-5",
    ]
    assert claims["default/h100-else-a100-else-any"]["results"][0]["request"] == "gpu/h100"


def test_limits_equal_the_requested_shares(report: dict[str, Any]) -> None:
    claims = by_claim(report)
    for c in claims.values():
        for result, device in zip(c["results"], c["devices"], strict=True):
            limits = device["limits"]
            consumed = result["consumedCapacity"]
            assert device["device"] == result["device"]
            assert device["shareID"] == result["shareID"]
            assert limits["SHAREGPU_CORES"] == consumed["cores"]
            assert int(limits["SHAREGPU_MEMORY"]) == quantity_int(consumed["memory"])
            assert limits["SHAREGPU_SHARE_ID"] == result["shareID"]
            assert limits["SHAREGPU_GPU_UUID"] in limits["NVIDIA_VISIBLE_DEVICES"].split(",")
    # Both devices of the count-2 request name both GPUs, so the container sees both.
    pair = claims["default/two-gpus-one-pcie-root"]["devices"]
    uuids = ",".join(d["limits"]["SHAREGPU_GPU_UUID"] for d in pair)
    assert [d["limits"]["NVIDIA_VISIBLE_DEVICES"] for d in pair] == [uuids, uuids]
    small = claims["default/small-share"]["devices"][0]["limits"]
    assert small["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert small["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    large = claims["default/large-share"]["devices"][0]["limits"]
    assert large["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert large["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    # MPS overrides below the 40-core / 16Gi share.
    mps = claims["default/mps-share"]["devices"][0]["limits"]
    assert (mps["SHAREGPU_CORES"], mps["SHAREGPU_MEMORY"]) == ("40", str(16 * 2**30))
    assert mps["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert mps["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=12288M"
    # A share that takes the whole GPU is exclusive: no MPS limits.
    whole = claims["default/whole-gpu"]["devices"][0]["limits"]
    assert not [k for k in whole if k.startswith("CUDA_MPS_")]
    # The two fractional shares sit on one GPU with one MPS pipe directory.
    assert small["SHAREGPU_GPU_UUID"] == large["SHAREGPU_GPU_UUID"]
    assert small["CUDA_MPS_PIPE_DIRECTORY"] == large["CUDA_MPS_PIPE_DIRECTORY"]


def test_usage_table_sums_the_allocations(report: dict[str, Any]) -> None:
    cores: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    holders: dict[str, set[str]] = defaultdict(set)
    for c in report["claims"]:
        for r in c["results"]:
            cores[r["device"]] += int(r["consumedCapacity"]["cores"])
            memory[r["device"]] += quantity_int(r["consumedCapacity"]["memory"])
            holders[r["device"]].add(c["claim"])
    assert [g["index"] for g in report["usage"]] == list(range(8))
    for g in report["usage"]:
        device = f"gpu-{g['index']}"
        assert g["cores"]["allocated"] == cores[device]
        assert g["cores"]["allocated"] + g["cores"]["free"] == g["cores"]["capacity"] == 100
        used, free = quantity_int(g["memory"]["allocated"]), quantity_int(g["memory"]["free"])
        assert used == memory[device]
        assert used + free == quantity_int(g["memory"]["capacity"])
        assert set(g["claims"]) == holders[device]
    assert report["usage"][7]["claims"] == []


def test_everything_cleaned_up(report: dict[str, Any]) -> None:
    assert report["cleanup"] == {
        "unprepared": len(EXPECTED_CLAIMS),
        "cdiSpecsLeft": 0,
        "tempDirRemoved": True,
    }
    assert not Path(report["tempDir"]).exists()
    assert report["_new_temp_dirs"] == []


def test_human_tables(report: dict[str, Any]) -> None:
    text = "\n\n".join(render_table(t, "table") for t in tables_of(report))
    assert "Published ResourceSlices (node demo-node, consumable mode" in text
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in text
    assert "default/large-share, default/small-share" in text
    assert "CDI specs left after unprepare  0" in text


def test_examples_dir_prefers_the_environment_then_the_source_tree() -> None:
    from sharegpu.cli.demo import EXAMPLES_ENV, default_examples_dir

    source_tree = EXAMPLES_DIR
    assert default_examples_dir({}) == source_tree
    assert default_examples_dir({EXAMPLES_ENV: "/srv/examples"}) == Path("/srv/examples")
    assert default_examples_dir({EXAMPLES_ENV: ""}) == source_tree
