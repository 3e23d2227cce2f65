"""The console scripts start, print help, and say which release they are."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from api.version import VERSION
from tests.paths import REPO_ROOT

pytestmark = pytest.mark.process

COMMANDS = {
    "kubeletplugin": "sharegpu-kubeletplugin",
    "controller": "sharegpu-controller",
    "sharegpuctl": "sharegpu",
}


@pytest.mark.parametrize("module", ["kubeletplugin", "controller", "sharegpuctl"])
def test_module_prints_help(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True
    )
    assert "usage:" in out.stdout


@pytest.mark.parametrize("module", ["kubeletplugin", "controller", "sharegpuctl"])
def test_module_prints_its_version(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout == f"{COMMANDS[module]} {VERSION}\n"


def test_chart_and_installed_package_carry_the_release_version() -> None:
    from importlib.metadata import version

    chart = yaml.safe_load((REPO_ROOT / "deploy/helm/sharegpu/Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)
    assert version("sharegpu") == VERSION
