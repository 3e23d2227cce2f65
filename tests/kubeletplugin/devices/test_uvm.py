"""Creating the UVM device nodes at start, with the fake command runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeletplugin.devices.uvm import NVIDIA_MODPROBE, ensure_uvm_device_nodes
from kubeletplugin.runner import CommandResult, FakeRunner, HostRunner, RecordedCall

MODPROBE = (NVIDIA_MODPROBE, "-u", "-c=0")


def creating(dev: Path) -> FakeRunner:
    """A runner whose nvidia-modprobe creates the nodes, as the real one does."""

    def answer(call: RecordedCall) -> CommandResult:
        for name in ("nvidia-uvm", "nvidia-uvm-tools"):
            (dev / name).touch()
        return CommandResult(call.argv, 0)

    runner = FakeRunner()
    runner.on(NVIDIA_MODPROBE, answer=answer)
    return runner


def test_creates_the_nodes_once_then_does_nothing(tmp_path: Path) -> None:
    runner = creating(tmp_path)
    assert ensure_uvm_device_nodes(runner, tmp_path) is True
    assert runner.argvs() == [MODPROBE]
    assert (tmp_path / "nvidia-uvm").exists() and (tmp_path / "nvidia-uvm-tools").exists()
    assert ensure_uvm_device_nodes(runner, tmp_path) is True
    assert runner.argvs() == [MODPROBE]


def test_nothing_runs_when_the_nodes_exist(tmp_path: Path) -> None:
    (tmp_path / "nvidia-uvm").touch()
    (tmp_path / "nvidia-uvm-tools").touch()
    runner = FakeRunner()
    assert ensure_uvm_device_nodes(runner, tmp_path) is True
    assert runner.argvs() == []


def test_one_missing_node_is_enough_to_run(tmp_path: Path) -> None:
    (tmp_path / "nvidia-uvm").touch()
    runner = creating(tmp_path)
    assert ensure_uvm_device_nodes(runner, tmp_path) is True
    assert runner.argvs() == [MODPROBE]


def test_a_failing_run_is_one_warning_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = FakeRunner()
    runner.on(NVIDIA_MODPROBE, returncode=1, stderr="FATAL: Module nvidia_uvm not found")
    with caplog.at_level("DEBUG", logger="kubeletplugin.devices.uvm"):
        assert ensure_uvm_device_nodes(runner, tmp_path) is False
    (record,) = caplog.records
    assert record.levelname == "WARNING"
    message = record.getMessage()
    assert "nvidia-modprobe -u -c=0: exit code 1" in message
    assert "Module nvidia_uvm not found" in message
    assert "\n" not in message


def test_nodes_still_absent_after_a_successful_run_is_one_warning_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("DEBUG", logger="kubeletplugin.devices.uvm"):
        assert ensure_uvm_device_nodes(FakeRunner(), tmp_path) is False
    (record,) = caplog.records
    assert record.levelname == "WARNING"
    assert str(tmp_path / "nvidia-uvm-tools") in record.getMessage()
    assert "--dev-root" in record.getMessage()


def test_the_binary_comes_from_the_driver_root(tmp_path: Path) -> None:
    """With the real runner a driver root without nvidia-modprobe is a warning, not a crash."""
    root = tmp_path / "driver"
    root.mkdir()
    dev = tmp_path / "dev"
    dev.mkdir()
    assert ensure_uvm_device_nodes(HostRunner(root, base_env={}), dev) is False
