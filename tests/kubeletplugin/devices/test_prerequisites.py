"""The start-up check that workloads will get the NVIDIA driver libraries."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kubeletplugin.devices.prerequisites import (
    check_driver_libraries,
    containerd_default_runtime,
    driver_library_problem,
)

KIND = "nvidia.com/gpu"
DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))

#: containerd 1.7 (config version 2) as ``nvidia-ctk runtime configure --set-as-default`` leaves it.
V2_NVIDIA = """
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
"""
#: containerd 2.x (config version 3) with runc as the default.
V3_RUNC = """
version = 3
[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"
"""


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_toolkit_cdi_spec_is_enough(tmp_path: Path) -> None:
    config = write(tmp_path, V3_RUNC)
    assert driver_library_problem(True, KIND, DIRS, config) is None


def test_nvidia_default_runtime_is_enough(tmp_path: Path) -> None:
    assert driver_library_problem(False, KIND, DIRS, write(tmp_path, V2_NVIDIA)) is None


def test_neither_is_one_error_line(tmp_path: Path) -> None:
    config = write(tmp_path, V3_RUNC)
    finding = driver_library_problem(False, KIND, DIRS, config)
    assert finding is not None and finding.level == logging.ERROR
    assert "no CDI spec of kind nvidia.com/gpu in /etc/cdi, /var/run/cdi" in finding.message
    assert "default runtime is 'runc', not 'nvidia'" in finding.message
    assert "nvidia-ctk cdi generate" in finding.message
    assert "\n" not in finding.message


def test_a_config_without_a_default_runtime_means_runc(tmp_path: Path) -> None:
    config = write(tmp_path, "version = 2\n")
    assert containerd_default_runtime(config) is None
    finding = driver_library_problem(False, KIND, DIRS, config)
    assert finding is not None and "'runc'" in finding.message


def test_drop_in_imports_are_followed_and_the_last_wins(tmp_path: Path) -> None:
    write(tmp_path, V2_NVIDIA, "conf.d/99-nvidia.toml")
    config = write(
        tmp_path,
        'version = 2\nimports = ["conf.d/*.toml"]\n'
        + V2_NVIDIA.replace('"nvidia"', '"runc"', 1).replace("version = 2\n", ""),
    )
    assert containerd_default_runtime(config) == "nvidia"


@pytest.mark.parametrize("text", [None, "this is = = not toml"])
def test_an_unreadable_config_is_a_warning(tmp_path: Path, text: str | None) -> None:
    config = tmp_path / "config.toml"
    if text is not None:
        config.write_text(text)
    finding = driver_library_problem(False, KIND, DIRS, config)
    assert finding is not None and finding.level == logging.WARNING
    assert str(config) in finding.message and "\n" not in finding.message


def test_check_logs_exactly_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = write(tmp_path, V3_RUNC)
    with caplog.at_level(logging.DEBUG, logger="kubeletplugin.devices.prerequisites"):
        assert check_driver_libraries(False, KIND, DIRS, config) is False
        assert check_driver_libraries(True, KIND, DIRS, config) is True
    (record,) = caplog.records
    assert record.levelno == logging.ERROR


def test_no_containerd_config_to_read(tmp_path: Path) -> None:
    finding = driver_library_problem(False, KIND, DIRS, None)
    assert finding is not None and finding.level == logging.ERROR
