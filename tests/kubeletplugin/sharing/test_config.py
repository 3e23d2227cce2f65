"""The plugin flags of share enforcement and the enforcer the daemon builds from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeletplugin.config import ConfigError, parse_config
from kubeletplugin.main import enforcer_for
from kubeletplugin.runner import FakeRunner, HostRunner


def test_defaults_run_driver_tools_from_the_host_root() -> None:
    config = parse_config(["--node-name", "n1"], environ={})
    assert (config.driver_root, config.limits_library) == (Path("/"), None)
    enforcer = enforcer_for(config)
    assert isinstance(enforcer.runner, HostRunner)
    assert enforcer.runner.driver_root == Path("/")
    assert enforcer.limits_library is None
    assert enforcer.mps.root == Path("/var/lib/kubelet/plugins/gpu.sharegpu.dev/mps")


def test_flags_reach_the_enforcer() -> None:
    config = parse_config(
        [
            "--node-name",
            "n1",
            "--driver-root",
            "/run/nvidia/driver",
            "--limits-library",
            "/opt/hami/libvgpu.so",
            "--plugin-data-dir",
            "/data",
        ],
        environ={},
    )
    enforcer = enforcer_for(config)
    assert isinstance(enforcer.runner, HostRunner)
    assert enforcer.runner.driver_root == Path("/run/nvidia/driver")
    assert enforcer.limits_library == "/opt/hami/libvgpu.so"
    assert enforcer.mps.root == Path("/data/mps")


def test_mock_backend_uses_the_simulated_tools() -> None:
    config = parse_config(["--node-name", "n1", "--device-backend", "mock"], environ={})
    assert isinstance(enforcer_for(config).runner, FakeRunner)


@pytest.mark.parametrize("flag", ["--driver-root", "--limits-library"])
def test_relative_paths_are_refused(flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(["--node-name", "n1", flag, "lib/x.so"], environ={})
    assert str(info.value) == f"{flag} 'lib/x.so': must be an absolute path"
