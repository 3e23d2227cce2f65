"""The health flags: defaults, checks, and how they configure the plugin."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeletplugin.config import ConfigError, parse_config
from kubeletplugin.health.events import DEFAULT_IGNORED_XIDS
from kubeletplugin.health.flags import DEFAULT_HEALTH_OPTIONS
from kubeletplugin.health.mockfile import MockHealthChecker
from kubeletplugin.health.nvmlcheck import NvmlHealthChecker
from kubeletplugin.health.settings import HealthSettings
from kubeletplugin.main import build_plugin, make_host
from sharegpuctl.local.apiserver import KubeAPIServer

BASE = ["--node-name", "n1"]


def test_defaults() -> None:
    health = parse_config(BASE, environ={}).health
    assert health == DEFAULT_HEALTH_OPTIONS
    assert health.enabled
    assert health.settings.probe_interval == 5.0
    assert health.settings.recovery_probes == 3
    assert health.settings.ignored_xids == DEFAULT_IGNORED_XIDS
    assert health.settings.taint_effect == "NoSchedule"


def test_every_flag_is_applied(tmp_path: Path) -> None:
    config = parse_config(
        [
            *BASE,
            "--device-backend",
            "mock",
            "--health-probe-interval",
            "0.5",
            "--health-recovery-probes",
            "7",
            "--health-ignore-xids",
            "13, 94",
            "--health-taint-effect",
            "NoExecute",
            "--mock-health-file",
            str(tmp_path / "h.yaml"),
            "--disable-health",
        ],
        environ={},
    )
    health = config.health
    assert not health.enabled
    assert health.settings.probe_interval == 0.5
    assert health.settings.recovery_probes == 7
    assert health.settings.ignored_xids == frozenset({13, 94})
    assert health.settings.taint_effect == "NoExecute"
    assert config.simulated is not None
    assert config.simulated.health_file == tmp_path / "h.yaml"
    assert parse_config([*BASE, "--health-ignore-xids", ""], environ={}).health.settings == (
        HealthSettings(ignored_xids=frozenset())
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--health-probe-interval", "0"], "--health-probe-interval must be > 0"),
        # NaN compares false with everything: it slipped through and made the probe loop spin.
        (["--health-probe-interval", "nan"], "--health-probe-interval must be a finite number"),
        (["--health-probe-interval", "inf"], "--health-probe-interval must be a finite number"),
        (["--health-recovery-probes", "0"], "--health-recovery-probes must be at least 1"),
        (["--health-ignore-xids", "13,abc"], "--health-ignore-xids: XID 'abc' is not an integer"),
        (["--mock-health-file", "h.yaml"], "--mock-health-file needs --device-backend mock"),
    ],
)
def test_bad_flags_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config([*BASE, *argv], environ={})


def test_bad_taint_effect_is_rejected_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config([*BASE, "--health-taint-effect", "None"], environ={})
    assert exc.value.code == 2
    assert "--health-taint-effect" in capsys.readouterr().err


def test_checker_follows_the_backend() -> None:
    nvml = parse_config(BASE, environ={})
    mock = parse_config([*BASE, "--device-backend", "mock"], environ={})
    assert isinstance(make_host(nvml).health_checker(), NvmlHealthChecker)
    assert isinstance(make_host(mock).health_checker(), MockHealthChecker)


@pytest.mark.parametrize("disabled", [False, True])
def test_plugin_gets_a_monitor_unless_disabled(
    apiserver: KubeAPIServer, tmp_path: Path, disabled: bool
) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    argv = [
        *BASE,
        "--kubeconfig",
        kubeconfig,
        "--device-backend",
        "mock",
        "--mock-gpus",
        "2",
        "--plugin-registry-dir",
        str(tmp_path / "registry"),
        "--plugin-data-dir",
        str(tmp_path / "data"),
        "--cdi-dir",
        str(tmp_path / "cdi"),
    ]
    plugin = build_plugin(parse_config(argv + (["--disable-health"] if disabled else []), {}))
    try:
        if disabled:
            assert plugin.health is None and plugin.health_source is None
        else:
            assert plugin.health is not None and plugin.health_source is not None
            assert plugin.health.taints() == {}
            assert [d.device_name for d in plugin.health.device_health()] == ["gpu-0", "gpu-1"]
    finally:
        plugin.stop()
