"""The plugin flags of share enforcement and the enforcer the daemon builds from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeletplugin.config import ConfigError, parse_config
from kubeletplugin.hosts.fakerunner import FakeRunner
from kubeletplugin.main import enforcer_for, make_host
from kubeletplugin.runner import HostRunner
from kubeletplugin.sharing.strategies.mps import MpsNode


def test_defaults_run_driver_tools_from_the_host_root() -> None:
    config = parse_config(["--node-name", "n1"], environ={})
    assert (config.driver_root, config.limits_library) == (Path("/"), None)
    enforcer = enforcer_for(config, make_host(config))
    assert isinstance(enforcer.setup.runner, HostRunner)
    assert enforcer.setup.runner.driver_root == Path("/")
    assert enforcer.setup.limits_library is None
    assert enforcer.node_of(MpsNode).manager.root == Path(
        "/var/lib/kubelet/plugins/gpu.sharegpu.dev/mps"
    )


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
    enforcer = enforcer_for(config, make_host(config))
    assert isinstance(enforcer.setup.runner, HostRunner)
    assert enforcer.setup.runner.driver_root == Path("/run/nvidia/driver")
    assert enforcer.setup.limits_library == "/opt/hami/libvgpu.so"
    assert enforcer.node_of(MpsNode).manager.root == Path("/data/mps")


def test_mock_backend_uses_the_simulated_tools() -> None:
    config = parse_config(["--node-name", "n1", "--device-backend", "mock"], environ={})
    assert isinstance(enforcer_for(config, make_host(config)).setup.runner, FakeRunner)


@pytest.mark.parametrize("flag", ["--driver-root", "--limits-library"])
def test_relative_paths_are_refused(flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(["--node-name", "n1", flag, "lib/x.so"], environ={})
    assert str(info.value) == f"{flag} 'lib/x.so': must be an absolute path"


@pytest.mark.parametrize("flag", ["--mps-root", "--mps-daemon-pod-template"])
def test_relative_mps_paths_are_refused(flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(["--node-name", "n1", "--namespace", "ns", flag, "run/mps"], environ={})
    assert str(info.value) == f"{flag} 'run/mps': must be an absolute path"


def test_mps_flags_and_the_namespace_from_the_downward_api() -> None:
    config = parse_config(
        [
            "--node-name",
            "n1",
            "--mps-root",
            "/run/sharegpu/mps",
            "--mps-daemon-pod-template",
            "/etc/sharegpu/mps/daemon-pod.yaml",
        ],
        environ={"POD_NAMESPACE": "gpu-system"},
    )
    assert config.mps_root == Path("/run/sharegpu/mps")
    assert config.mps_daemon_pod_template == Path("/etc/sharegpu/mps/daemon-pod.yaml")
    assert config.namespace == "gpu-system"


def test_a_daemon_pod_template_needs_a_namespace() -> None:
    with pytest.raises(ConfigError, match=r"--mps-daemon-pod-template needs --namespace"):
        parse_config(["--node-name", "n1", "--mps-daemon-pod-template", "/t.yaml"], environ={})


def test_without_a_launcher_real_gpus_refuse_mps_shares_with_a_clear_error(
    tmp_path: Path,
) -> None:
    from api.gpuconfig import DriverConfigs
    from kubeletplugin.hosts.nvidia import nvidia_share_tools
    from kubeletplugin.sharing.enforcement import ShareError
    from kubeletplugin.sharing.enforcer import build_enforcer
    from kubeletplugin.sharing.shm import PlainDirectory, TmpfsMounter
    from tests.kubeletplugin.prepare import helpers as h
    from tests.kubeletplugin.sharing.helpers import record

    fake = FakeRunner()
    enforcer = build_enforcer(
        nvidia_share_tools(Path("/")), tmp_path, driver_name=h.DRIVER, mps_root=tmp_path / "m"
    )
    mps = enforcer.node_of(MpsNode).manager
    mps.runner = fake  # no NVIDIA tools here
    assert isinstance(mps.shm, TmpfsMounter)
    mps.shm = PlainDirectory()  # tests never mount
    fake.on("nvidia-smi", "-i", stdout="Default\n")
    share = record(h.gpus()[0], "gpu-0", ("gpu",), 30, 2**30, share_id="s-1")
    with pytest.raises(ShareError, match="no MPS daemon pod template"):
        enforcer.apply("claim-a", [share], DriverConfigs())
    assert mps.root == tmp_path / "m"


def test_the_shm_bound_reaches_the_mps_manager(tmp_path: Path) -> None:
    from kubeletplugin.hosts.simulated import simulated_share_tools
    from kubeletplugin.sharing.enforcer import build_enforcer
    from tests.kubeletplugin.prepare import helpers as h

    enforcer = build_enforcer(
        simulated_share_tools(), tmp_path, driver_name=h.DRIVER, mps_shm_bytes=64 * 1024**2
    )
    assert enforcer.node_of(MpsNode).manager.shm_bytes == 64 * 1024**2
