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
    assert main(["devices", "--device-backend", "nvml", "--mock-config", "gpus.yaml"]) == 2
    assert "--mock-config needs --device-backend mock" in capsys.readouterr().err
    assert main(["devices", "--device-backend", "nvml", "--mock", "2"]) == 2
    assert "--mock needs --device-backend mock" in capsys.readouterr().err
    assert main(["devices", "--device-backend", "mock", "--node-name", "Not_A_Name"]) == 2
    capsys.readouterr()


@pytest.mark.parametrize("count", ["0", "-1", "129"])
def test_mock_count_out_of_range_is_a_usage_error(
    count: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["devices", "--device-backend", "mock", "--mock-gpus", count, "--node-name", "n1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first == f"sharegpu devices: error: --mock-gpus must be between 1 and 128, got {count}"


def test_the_plugins_host_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """The command takes the node plugin's flags: the same GPUs, no warning."""
    report = devices(capsys, "--device-backend", "mock", "--mock-gpus", "3", "--node-name", "n1")
    assert report["backend"] == "mock" and len(report["gpus"]) == 3  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""
    assert main(["devices", "--device-backend", "mock", "--node-name", "n1", "-o", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["gpus"]) == 8


def test_deprecated_spellings_still_work_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = devices(capsys, "--device-backend", "mock", "--mock-gpus", "2", "--node-name", "n1")
    assert main(["devices", "--mock", "2", "--node-name", "n1", "-o", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == new
    assert err == (
        "sharegpu devices: warning: --mock N is deprecated: use --device-backend mock "
        "--mock-gpus N\n"
    )
    config = tmp_path / "gpus.yaml"
    config.write_text(yaml.safe_dump([{"productName": "NVIDIA A100-SXM4-40GB"}]))
    assert main(["devices", "--mock-config", str(config), "--node-name", "n1", "-o", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["gpus"][0]["productName"] == "NVIDIA A100-SXM4-40GB"
    assert err == (
        "sharegpu devices: warning: --mock-config without --device-backend mock is deprecated: "
        "add --device-backend mock\n"
    )


@pytest.mark.process
def test_console_script_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sharegpuctl", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("devices", "validate", "explain", "status", "demo"):
        assert command in done.stdout


@pytest.mark.parametrize(
    "publishing",
    [
        [],
        ["--default-share-cores", "40", "--max-shares-per-gpu", "4"],
        ["--sharing-mode", "partitions", "--max-shares-per-gpu", "2"],
        ["--sharing-mode", "partitions", "--mig", "dynamic"],
    ],
)
def test_the_slices_of_the_plugins_print_slices(publishing: list[str]) -> None:
    """``sharegpu devices`` and ``sharegpu-kubeletplugin --print-slices`` take the same flags and
    show the same slices (the CLI names them, the plugin leaves the names to the API server)."""
    from kubeletplugin.config import parse_config
    from kubeletplugin.main import make_host, slice_settings, slices_yaml
    from kubeletplugin.preview import node_preview
    from sharegpuctl.cli import build_parser
    from sharegpuctl.cli.common import local_node

    argv = ["--device-backend", "mock", "--mock-gpus", "2", "--node-name", "n1", *publishing]
    # What the plugin's main prints for --print-slices (without configuring its logging here).
    config = parse_config(["--print-slices", *argv], environ={})
    printed = list(
        yaml.safe_load_all(slices_yaml(node_preview(make_host(config), slice_settings(config))))
    )
    node = local_node(build_parser().parse_args(["devices", *argv]))
    for obj in printed:
        obj["metadata"] = {"name": obj["metadata"].pop("generateName") + "local"}
    assert printed == list(node.slices) and len(printed) >= 1
