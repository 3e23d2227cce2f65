"""``sharegpu devices``: mock GPUs, slice summaries per mode, the nvml failure line, help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sharegpuctl.cli import main


def devices(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["devices", *argv, "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_mock_gpus_and_consumable_slices(capsys: pytest.CaptureFixture[str]) -> None:
    report = devices(capsys, "--mock", "3", "--node-name", "n1")
    assert report["node"] == "n1" and report["backend"] == "mock"
    gpus = report["gpus"]
    assert isinstance(gpus, list) and [g["index"] for g in gpus] == [0, 1, 2]
    first = gpus[0]
    assert first["productName"] == "NVIDIA H100 80GB HBM3"
    assert first["memory"]["usable"] == "81032Mi" and first["memory"]["total"] == "81559Mi"
    assert first["cudaComputeCapability"] == "9.0" and first["pcieRoot"] == "pci0000:00"
    assert {g["nvlinkDomain"] for g in gpus} == {"nvswitch"}
    slices = report["resourceSlices"]
    assert isinstance(slices, dict)
    assert (slices["count"], slices["devices"], slices["counterSets"]) == (1, 3, 0)
    assert slices["slices"][0]["deviceNames"] == ["gpu-0", "gpu-1", "gpu-2"]


def test_partitions_mode_summary(capsys: pytest.CaptureFixture[str]) -> None:
    report = devices(capsys, "--mock", "2", "--sharing-mode", "partitions", "--node-name", "n1")
    slices = report["resourceSlices"]
    assert isinstance(slices, dict)
    # Per GPU: whole, 2 halves, 4 quarters, 8 eighths; counter sets in their own slice.
    assert slices["devices"] == 2 * 15 and slices["counterSets"] == 2
    assert slices["slices"][0]["counterSetNames"] == ["gpu-0-counters", "gpu-1-counters"]


def test_mock_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "gpus.yaml"
    config.write_text(yaml.safe_dump([{"productName": "NVIDIA A100-SXM4-40GB"}]))
    report = devices(capsys, "--mock-config", str(config), "--node-name", "n1")
    gpus = report["gpus"]
    assert isinstance(gpus, list) and gpus[0]["productName"] == "NVIDIA A100-SXM4-40GB"


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--mock", "2", "--node-name", "n1", "-o", "table"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("GPUs on node n1 (mock backend)\nINDEX  PRODUCT")
    assert "79.1Gi/79.6Gi" in out
    assert "1 slice(s), 2 device(s), 0 counter set(s)" in out


def test_nvml_without_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["devices", "--device-backend", "nvml", "--node-name", "n1"])
    err = capsys.readouterr().err
    if code == 0:
        pytest.skip("this machine has an NVIDIA GPU with a working NVML library")
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("sharegpu devices: error: ") and "NVML" in err


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--device-backend", "nvml", "--mock", "2"]) == 2
    assert "--mock and --mock-config need --device-backend mock" in capsys.readouterr().err
    assert main(["devices", "--mock", "2", "--node-name", "Not_A_Name"]) == 2
    capsys.readouterr()


@pytest.mark.parametrize("count", ["0", "-1", "129"])
def test_mock_count_out_of_range_is_a_usage_error(
    count: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["devices", "--mock", count, "--node-name", "n1"]) == 2
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first == f"sharegpu devices: error: --mock: must be between 1 and 128, got {count}"


@pytest.mark.process
def test_console_script_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sharegpuctl", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("devices", "validate", "explain", "status", "demo"):
        assert command in done.stdout
