"""The node's device table: the one place device names are decided, rendered into the slices
and shared by prepare, health and the publisher."""

from __future__ import annotations

from pathlib import Path

import pytest

from api import names
from kubeletplugin.config import parse_config
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.slices import desired_slices
from kubeletplugin.devices.table import node_devices
from kubeletplugin.main import build_plugin
from sharegpuctl.local.apiserver import KubeAPIServer


@pytest.mark.parametrize("mode", names.SHARING_MODES)
@pytest.mark.parametrize("count", [0, 1, 8, 64])
def test_table_names_are_the_published_device_names_in_order(mode: str, count: int) -> None:
    gpus = MockBackend("node-a", count=count).discover() if count else []
    table = node_devices(gpus, mode)
    published = [d["name"] for content in desired_slices(table) for d in content.get("devices", [])]
    assert [d.name for d in table] == published
    assert len(set(published)) == len(table)


def test_partitions_mode_publishes_every_profile_and_only_true_partitions_are_partitions() -> None:
    (gpu,) = MockBackend("node-a", count=1).discover()
    table = node_devices([gpu], names.SHARING_MODE_PARTITIONS)
    assert len(table) == sum(names.PARTITION_PROFILES.values())
    whole = table["gpu-0"]
    assert (whole.profile, whole.partition) == ("whole", None)
    half = table["gpu-0-half-1"]
    assert (half.profile, half.partition, half.gpu) == ("half", "half", gpu)
    assert "gpu-0-half-2" not in table and table.get("gpu-0-half-2") is None


def test_whole_gpu_modes_have_one_device_per_gpu_in_index_order() -> None:
    gpus = MockBackend("node-a", count=3).discover()
    table = node_devices(list(reversed(gpus)), names.SHARING_MODE_CONSUMABLE)
    assert table.gpus == tuple(gpus)
    assert [(d.name, d.gpu, d.partition) for d in table] == [
        (f"gpu-{g.index}", g, None) for g in gpus
    ]
    assert table.names_by_gpu() == {g.uuid: [f"gpu-{g.index}"] for g in gpus}
    assert table.of_gpu(gpus[1]) == [table["gpu-1"]]


def test_unknown_sharing_mode_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="unknown sharing mode 'shared' \\(allowed: consumable"):
        node_devices([], "shared")


@pytest.mark.parametrize("mode", names.SHARING_MODES)
def test_the_daemon_hands_one_table_to_publisher_prepare_and_health(
    apiserver: KubeAPIServer, tmp_path: Path, mode: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    apiserver.write_kubeconfig(kubeconfig)
    config = parse_config(
        [
            "--node-name=node-a",
            f"--kubeconfig={kubeconfig}",
            "--device-backend=mock",
            "--mock-gpus=2",
            f"--sharing-mode={mode}",
            f"--plugin-registry-dir={tmp_path / 'registry'}",
            f"--plugin-data-dir={tmp_path / 'data'}",
            f"--cdi-dir={tmp_path / 'cdi'}",
        ],
        {},
    )
    plugin = build_plugin(config)
    try:
        assert plugin.devices.sharing_mode == mode
        assert plugin.claims is not None and plugin.health is not None
        assert plugin.publisher.devices is plugin.devices
        assert plugin.claims.state.devices is plugin.devices
        assert plugin.health.devices is plugin.devices
    finally:
        plugin.stop()
