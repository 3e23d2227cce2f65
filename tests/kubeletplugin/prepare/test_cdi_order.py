"""The order of a device's CDI IDs decides which ``NVIDIA_VISIBLE_DEVICES`` a container sees.

How a runtime merges the edits of several CDI devices (container-device-interface, read at
``pkg/cdi/cache.go`` ``Cache.InjectDevices`` and ``pkg/cdi/container-edits.go``
``ContainerEdits.Apply``/``Append``, repository cncf-tags/container-device-interface, commits
0256ad419b02bfa4e6f13f22f80409e7a2d28b17 and 0e814495988fcb5b93dfbd6cc668f1406df676a4):

- the IDs are walked in the order given; the first time a device of a spec is met, that spec's
  top-level ``containerEdits`` are appended, then the device's own edits;
- the collected ``env`` entries are applied in that order, each replacing an earlier variable
  of the same name (runtime-tools' ``AddMultipleProcessEnv``).

:func:`merged_env` is this test's own model of those two rules. The NVIDIA Container Toolkit's
generated spec sets ``NVIDIA_VISIBLE_DEVICES=void`` in its top-level edits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from api import names
from kubeletplugin.model import GpuInfo
from kubeletplugin.prepare.cdi import NvidiaCdiDetector
from tests.kubeletplugin.prepare.helpers import (
    DRIVER,
    FakeClaims,
    Node,
    assert_valid_cdi,
    claim,
    gpus,
    ref,
    result,
)

KIND = names.cdi_kind(DRIVER)


def toolkit_spec(gpu_list: Sequence[GpuInfo]) -> dict[str, Any]:
    """A spec shaped like ``nvidia-ctk cdi generate --device-name-strategy=uuid`` output."""
    return {
        "cdiVersion": "0.5.0",
        "kind": names.NVIDIA_CTK_CDI_KIND,
        "devices": [
            {
                "name": g.uuid,
                "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{g.minor}"}]},
            }
            for g in gpu_list
        ],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidiactl"}],
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": "/usr/bin/nvidia-cdi-hook",
                    "args": ["nvidia-cdi-hook", "update-ldcache"],
                }
            ],
        },
    }


def merged_env(specs: Sequence[Mapping[str, Any]], ids: Sequence[str]) -> dict[str, str]:
    """The container environment after injecting ``ids`` (see the module doc)."""
    devices: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for number, spec in enumerate(specs):
        for device in spec["devices"]:
            devices[f"{spec['kind']}={device['name']}"] = (number, device)
    entries: list[str] = []
    seen_specs: set[int] = set()
    for cdi_id in ids:
        number, device = devices[cdi_id]  # an unresolvable ID fails the container
        if number not in seen_specs:
            seen_specs.add(number)
            entries += specs[number].get("containerEdits", {}).get("env", [])
        entries += device["containerEdits"].get("env", [])
    env: dict[str, str] = {}
    for entry in entries:
        key, value = entry.split("=", 1)
        env[key] = value
    return env


def test_the_model_lets_the_later_device_win() -> None:
    a = {"kind": "a.com/x", "devices": [{"name": "1", "containerEdits": {"env": ["V=a"]}}]}
    b = {"kind": "b.com/x", "devices": [{"name": "1", "containerEdits": {"env": ["V=b"]}}]}
    assert merged_env([a, b], ["a.com/x=1", "b.com/x=1"]) == {"V": "b"}
    assert merged_env([a, b], ["b.com/x=1", "a.com/x=1"]) == {"V": "a"}


def prepared(node: Node, tmp_path: Path, devices: Sequence[str]) -> tuple[Any, list[Any], Path]:
    """Prepare one claim of ``devices`` next to a toolkit spec; (spec docs, device ids, ...)."""
    etc = tmp_path / "etc-cdi"
    etc.mkdir()
    gpu_list = gpus()
    toolkit_file = etc / "nvidia.yaml"
    toolkit_file.write_text(yaml.safe_dump(toolkit_spec(gpu_list)))
    claims = FakeClaims()
    c = claim("tk", [result("gpu", d) for d in devices])
    claims.add(c)
    detector = NvidiaCdiDetector(names.NVIDIA_CTK_CDI_KIND, [etc])
    out = node.state(claims, nvidia=detector).prepare([ref(c)])[c["metadata"]["uid"]]
    ids = [i for d in out.devices for i in d.cdi_device_ids]
    (ours,) = node.spec_files()
    return [yaml.safe_load(toolkit_file.read_text()), assert_valid_cdi(ours)], ids, ours


def test_the_toolkit_spec_fixture_is_valid_cdi(tmp_path: Path) -> None:
    path = tmp_path / "nvidia.json"
    path.write_text(json.dumps(toolkit_spec(gpus())))
    assert_valid_cdi(path)


def test_our_id_comes_after_the_toolkit_id(node: Node, tmp_path: Path) -> None:
    _specs, ids, _ = prepared(node, tmp_path, ["gpu-1"])
    assert ids[0] == f"{names.NVIDIA_CTK_CDI_KIND}={gpus()[1].uuid}"
    assert ids[1].startswith(f"{KIND}=")


@pytest.mark.parametrize("devices", [["gpu-1"], ["gpu-1", "gpu-3"]])
def test_the_container_sees_the_claims_gpus_not_void(
    node: Node, tmp_path: Path, devices: list[str]
) -> None:
    specs, ids, _ = prepared(node, tmp_path, devices)
    env = merged_env(specs, ids)
    by_name = {g.index: g.uuid for g in gpus()}
    wanted = [by_name[int(d.split("-")[1])] for d in devices]
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(wanted)
    assert env["SHAREGPU_GPU_UUIDS"] == ",".join(wanted)


def test_without_a_toolkit_spec_only_our_id_is_returned(node: Node, tmp_path: Path) -> None:
    claims = FakeClaims()
    c = claim("solo", [result("gpu", "gpu-2")])
    claims.add(c)
    detector = NvidiaCdiDetector(names.NVIDIA_CTK_CDI_KIND, [tmp_path / "absent"])
    out = node.state(claims, nvidia=detector).prepare([ref(c)])[c["metadata"]["uid"]]
    (device,) = out.devices
    assert len(device.cdi_device_ids) == 1 and device.cdi_device_ids[0].startswith(f"{KIND}=")


def test_spec_found(tmp_path: Path) -> None:
    etc = tmp_path / "etc-cdi"
    etc.mkdir()
    detector = NvidiaCdiDetector(names.NVIDIA_CTK_CDI_KIND, [etc, tmp_path / "absent"])
    assert detector.spec_found() is False
    (etc / "other.json").write_text(
        '{"cdiVersion": "0.5.0", "kind": "vendor.com/x", "devices": []}'
    )
    assert detector.spec_found() is False
    (etc / "nvidia.json").write_text(json.dumps(toolkit_spec(gpus(1))))
    assert detector.spec_found() is True
