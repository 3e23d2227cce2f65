"""The CUDA unified-memory nodes: the host's where it has them, else by their numbers from
``/proc/devices`` (``238 nvidia-uvm`` on an H200 node), and the start-up check."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from kubeletplugin.containeredits import DeviceNode
from kubeletplugin.devices.procdevices import ProcDevices
from kubeletplugin.devices.uvm import UVM_FILE_MODE, check_uvm, uvm_device_nodes

FIXTURE = Path(__file__).parent / "data" / "proc-devices"
H200_UVM_MAJOR = 238


def host(tmp_path: Path, *present: str, loaded: bool = True) -> tuple[Path, ProcDevices]:
    """(dev root with the ``present`` nodes, /proc/devices with or without nvidia-uvm)."""
    dev, proc = tmp_path / "dev", tmp_path / "proc"
    dev.mkdir(parents=True)
    proc.mkdir()
    for name in present:
        (dev / name).touch()
    if loaded:
        shutil.copy(FIXTURE, proc / "devices")
    else:
        (proc / "devices").write_text("Character devices:\n195 nvidia-frontend\n")
    return dev, ProcDevices(proc)


def test_nodes_the_host_has_go_in_as_the_hosts(tmp_path: Path) -> None:
    dev, devices = host(tmp_path, "nvidia-uvm", "nvidia-uvm-tools")
    assert uvm_device_nodes(dev, devices) == (
        DeviceNode("/dev/nvidia-uvm", str(dev / "nvidia-uvm")),
        DeviceNode("/dev/nvidia-uvm-tools", str(dev / "nvidia-uvm-tools")),
    )


def test_absent_nodes_go_in_by_their_numbers(tmp_path: Path) -> None:
    dev, devices = host(tmp_path, "nvidia-uvm")
    nodes = uvm_device_nodes(dev, devices)
    assert nodes == (
        DeviceNode("/dev/nvidia-uvm", str(dev / "nvidia-uvm")),
        DeviceNode.char("/dev/nvidia-uvm-tools", H200_UVM_MAJOR, 1, UVM_FILE_MODE),
    )
    dev2, devices2 = host(tmp_path / "bare")
    assert [n.to_json() for n in uvm_device_nodes(dev2, devices2)] == [
        {
            "path": "/dev/nvidia-uvm",
            "type": "c",
            "major": H200_UVM_MAJOR,
            "minor": 0,
            "fileMode": 0o666,
            "permissions": "rw",
        },
        {
            "path": "/dev/nvidia-uvm-tools",
            "type": "c",
            "major": H200_UVM_MAJOR,
            "minor": 1,
            "fileMode": 0o666,
            "permissions": "rw",
        },
    ]


def test_without_the_module_absent_nodes_are_left_out_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dev, devices = host(tmp_path, "nvidia-uvm", loaded=False)
    with caplog.at_level(logging.WARNING, logger="kubeletplugin.devices.uvm"):
        nodes = uvm_device_nodes(dev, devices)
    assert nodes == (DeviceNode("/dev/nvidia-uvm", str(dev / "nvidia-uvm")),)
    (record,) = caplog.records
    assert str(dev / "nvidia-uvm-tools") in record.getMessage()
    assert "lists no character device 'nvidia-uvm'" in record.getMessage()


def test_a_garbled_proc_devices_is_a_warning_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dev, devices = host(tmp_path)
    devices.path.write_text("<html>\n")
    with caplog.at_level(logging.WARNING, logger="kubeletplugin.devices.uvm"):
        assert uvm_device_nodes(dev, devices) == ()
    assert "line 1" in caplog.text


def test_the_start_check_is_quiet_when_the_host_has_the_nodes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dev, devices = host(tmp_path, "nvidia-uvm", "nvidia-uvm-tools", loaded=False)
    with caplog.at_level(logging.INFO, logger="kubeletplugin.devices.uvm"):
        assert check_uvm(dev, devices) is True
    assert caplog.records == []


def test_the_start_check_says_how_absent_nodes_are_given(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dev, devices = host(tmp_path)
    with caplog.at_level(logging.INFO, logger="kubeletplugin.devices.uvm"):
        assert check_uvm(dev, devices) is True
    (record,) = caplog.records
    assert record.levelname == "INFO"
    assert "by their numbers (major 238 of nvidia-uvm)" in record.getMessage()


def test_the_start_check_names_the_host_prerequisite_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dev, devices = host(tmp_path, loaded=False)
    with caplog.at_level(logging.INFO, logger="kubeletplugin.devices.uvm"):
        assert check_uvm(dev, devices) is False
    (record,) = caplog.records
    message = record.getMessage()
    assert record.levelname == "WARNING" and "\n" not in message
    assert "nvidia-modprobe -u -c=0" in message and "cannot load a kernel module" in message
    assert str(devices.path) in message
