"""The host seam: ``--device-backend`` picks the NVIDIA or the simulated host once, and each
hands out its own discovery, MIG partitioner, tools, health and usage sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeletplugin.config import ConfigError, build_parser, parse_config
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.mockmig import MockMigPartitioner
from kubeletplugin.devices.nvml import NvmlBackend
from kubeletplugin.health.mockfile import MockHealthChecker
from kubeletplugin.health.nvmlcheck import NvmlHealthChecker
from kubeletplugin.hosts.fakerunner import FakeRunner
from kubeletplugin.hosts.nvidia import NvidiaHost
from kubeletplugin.hosts.options import SimulatedOptions
from kubeletplugin.hosts.simtools import SimulatedLauncher
from kubeletplugin.hosts.simulated import MOCK_MIG_STATE_FILE, SimulatedHost
from kubeletplugin.main import make_host
from kubeletplugin.prepare.checkpoint import DEFAULT_BOOT_ID_FILE
from kubeletplugin.runner import HostRunner
from kubeletplugin.sharing.daemons import NoLauncher
from kubeletplugin.sharing.shm import PlainDirectory, TmpfsMounter
from kubeletplugin.usage.mocksource import FileUsageSource
from kubeletplugin.usage.source import NvmlUsageSource

BASE = ["--node-name", "n1"]


def test_the_default_host_is_the_nvidia_host() -> None:
    config = parse_config([*BASE, "--driver-root", "/run/nvidia/driver"], environ={})
    assert config.simulated is None
    host = make_host(config)
    assert isinstance(host, NvidiaHost)
    assert isinstance(host.backend, NvmlBackend)
    assert host.dev_root == Path("/dev")
    assert host.boot_id_file == DEFAULT_BOOT_ID_FILE
    assert isinstance(host.health_checker(), NvmlHealthChecker)
    assert isinstance(host.usage_source(()), NvmlUsageSource)
    tools = host.share_tools(None)
    assert isinstance(tools.runner, HostRunner)
    assert tools.runner.driver_root == Path("/run/nvidia/driver")
    assert isinstance(tools.shm, TmpfsMounter)
    # Without a daemon pod template MPS shares are refused, naming the missing flag.
    assert isinstance(tools.launcher, NoLauncher)


def test_the_mock_backend_is_the_simulated_host(tmp_path: Path) -> None:
    health, usage, boot = tmp_path / "h.yaml", tmp_path / "u.yaml", tmp_path / "boot_id"
    config = parse_config(
        [
            *BASE,
            "--device-backend=mock",
            "--mock-gpus=3",
            f"--plugin-data-dir={tmp_path / 'data'}",
            f"--mock-health-file={health}",
            f"--mock-usage-file={usage}",
            "--mock-mig-step-seconds=0.5",
            f"--mock-boot-id-file={boot}",
        ],
        environ={},
    )
    assert config.simulated == SimulatedOptions(
        gpus=3, health_file=health, usage_file=usage, mig_step_seconds=0.5, boot_id_file=boot
    )
    host = make_host(config)
    assert isinstance(host, SimulatedHost)
    assert isinstance(host.backend, MockBackend)
    assert len(host.backend.discover()) == 3
    assert host.dev_root is None  # simulated GPUs have no device nodes
    assert host.boot_id_file == boot
    checker = host.health_checker()
    assert isinstance(checker, MockHealthChecker) and checker.path == health
    source = host.usage_source(host.backend.discover())
    assert isinstance(source, FileUsageSource) and source.path == usage
    partitioner = host.mig_partitioner()
    assert isinstance(partitioner, MockMigPartitioner)
    assert partitioner.state_file == tmp_path / "data" / MOCK_MIG_STATE_FILE
    assert partitioner.step_seconds == 0.5
    tools = host.share_tools(None)
    assert isinstance(tools.runner, FakeRunner)
    assert isinstance(tools.launcher, SimulatedLauncher)
    assert isinstance(tools.shm, PlainDirectory)
    assert host.usage_problem() is None


def test_the_simulated_host_keeps_the_kernels_boot_id_unless_told() -> None:
    config = parse_config([*BASE, "--device-backend=mock"], environ={})
    assert make_host(config).boot_id_file == DEFAULT_BOOT_ID_FILE


def test_dynamic_mig_puts_the_default_mock_gpus_in_mig_mode(tmp_path: Path) -> None:
    config = parse_config(
        [*BASE, "--device-backend=mock", "--sharing-mode=partitions", "--mig=dynamic"],
        environ={},
    )
    host = make_host(config)
    assert all(g.mig_mode == "Enabled" for g in host.backend.discover())


@pytest.mark.parametrize(
    "argv",
    [
        ["--mock-config", "/x.yaml"],
        ["--mock-health-file", "/h.yaml"],
        ["--mock-usage-file", "/u.yaml"],
        ["--mock-mig-step-seconds", "1"],
        ["--mock-boot-id-file", "/boot_id"],
    ],
)
def test_simulated_host_flags_need_the_mock_backend(argv: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config([*BASE, *argv], environ={})
    assert str(info.value) == f"{argv[0]} needs --device-backend mock"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mock-mig-step-seconds", "61"], "--mock-mig-step-seconds 61.0: must be 0 to 60"),
        (["--mock-boot-id-file", "boot_id"], "--mock-boot-id-file 'boot_id': must be an absolute"),
    ],
)
def test_bad_simulated_host_flags_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config([*BASE, "--device-backend=mock", *argv], environ={})


def test_test_seams_are_not_production_flags(capsys: pytest.CaptureFixture[str]) -> None:
    help_text = build_parser().format_help()
    for hidden in ("--mock-mig-step-seconds", "--mock-boot-id-file"):
        assert hidden not in help_text
    for removed in ("--dev-root", "--boot-id-file"):
        assert removed not in help_text
        with pytest.raises(SystemExit) as exc:
            parse_config([*BASE, removed, "/x"], environ={})
        assert exc.value.code == 2
    capsys.readouterr()


def test_only_a_host_whose_daemons_are_pods_lists_daemon_pods(tmp_path: Path) -> None:
    """The usage sampler lists the MPS daemon pods of the plugin's namespace only where the
    daemons are pods (a daemon pod template and a namespace): the chart grants ``list pods``
    only with the template, so without it every usage sample got a 403 (the mock backend, or
    ``kubeletPlugin.mps.enabled=false``)."""
    template = tmp_path / "daemon-pod.yaml"
    template.write_text("apiVersion: v1\nkind: Pod\n")
    pods = ("--namespace", "gpu", "--mps-daemon-pod-template", str(template))
    mock = ("--device-backend", "mock")
    for args, expected in (
        ((*mock, "--namespace", "gpu"), False),
        ((*mock, *pods), True),
        (pods, True),
        (("--namespace", "gpu"), False),
    ):
        config = parse_config([*BASE, *args], environ={})
        assert make_host(config).runs_daemon_pods() is expected, args
