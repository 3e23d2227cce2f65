"""The console scripts start and print help."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process


@pytest.mark.parametrize("module", ["kubeletplugin", "controller", "sharegpu"])
def test_module_prints_help(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True
    )
    assert "usage:" in out.stdout
