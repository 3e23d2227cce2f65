"""Preparing MIG devices: the container gets the MIG device, never its parent GPU.

The node has GPU 0 in MIG mode (two 1g.10gb and one 3g.40gb MIG device) next to a whole GPU 1;
capability minors come from the driver-format fixture ``devices/data/mig-minors``.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

from api import names
from kubeletplugin.devices.migcaps import MIG_MINORS_FILE
from kubeletplugin.devices.mock import load_mock_config
from kubeletplugin.devices.table import NodeDevices, node_devices
from kubeletplugin.model import GpuInfo
from kubeletplugin.prepare.cdi import CdiSpecWriter, NvidiaCdiDetector
from kubeletplugin.prepare.checkpoint import Checkpoint
from kubeletplugin.prepare.state import DeviceState
from kubeletplugin.sharing.enforcement import ShareEnforcer
from tests.kubeletplugin.prepare.helpers import (
    DRIVER,
    NODE,
    FakeClaims,
    Node,
    assert_valid_cdi,
    claim,
    ref,
    result,
    spec_env,
)
from tests.kubeletplugin.sharing.helpers import Tools, gpu_config

MINORS_FIXTURE = Path(__file__).parents[1] / "devices" / "data" / "mig-minors"
#: ``/proc/devices`` with ``241 nvidia-caps``, as on an H200 node.
DEVICES_FIXTURE = Path(__file__).parents[1] / "devices" / "data" / "proc-devices"
CAPS_MAJOR = 241
MIG_CONFIG = """\
- migDevices:
    - {profile: 1g.10gb, gpuInstance: 9}
    - {profile: 1g.10gb, gpuInstance: 10}
    - {profile: 3g.40gb, gpuInstance: 2, memory: 40192Mi, multiprocessors: 60}
- {}
"""


def mig_gpus(tmp_path: Path) -> list[GpuInfo]:
    path = tmp_path / "gpus.yaml"
    path.write_text(textwrap.dedent(MIG_CONFIG))
    return load_mock_config(NODE, path)


def host(
    tmp_path: Path, minors: bytes | None = None, devices: bytes | None = None
) -> tuple[Path, Path]:
    """(dev root with the GPU and control nodes but no capability node, proc root with
    mig-minors and ``/proc/devices``; the fixtures unless ``minors``/``devices`` are given)."""
    dev, proc = tmp_path / "dev", tmp_path / "proc"
    dev.mkdir(parents=True)
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (dev / name).touch()
    (proc / MIG_MINORS_FILE).parent.mkdir(parents=True)
    if minors is None:
        shutil.copy(MINORS_FIXTURE, proc / MIG_MINORS_FILE)
    else:
        (proc / MIG_MINORS_FILE).write_bytes(minors)
    if devices is None:
        shutil.copy(DEVICES_FIXTURE, proc / "devices")
    else:
        (proc / "devices").write_bytes(devices)
    return dev, proc


def state(
    node: Node,
    claims: FakeClaims,
    devices: NodeDevices,
    *,
    dev: Path | None = None,
    proc: Path | None = None,
    nvidia: NvidiaCdiDetector | None = None,
    enforcer: ShareEnforcer | None = None,
) -> DeviceState:
    writer = CdiSpecWriter(
        node.cdi_dir,
        DRIVER,
        dev_root=dev,
        nvidia=nvidia,
        proc_root=proc if proc is not None else node.root / "proc",
    )
    st = DeviceState(
        driver_name=DRIVER,
        node_name=NODE,
        devices=devices,
        claims=claims,
        cdi=writer,
        checkpoint=Checkpoint(node.data_dir, boot_id_file=node.boot_id_file),
        enforcer=enforcer,
    )
    st.start()
    return st


def one_spec(node: Node) -> dict[str, Any]:
    (path,) = node.spec_files()
    return assert_valid_cdi(path)


@pytest.fixture
def devices(tmp_path: Path) -> NodeDevices:
    return node_devices(mig_gpus(tmp_path), names.SHARING_MODE_CONSUMABLE)


def test_the_container_gets_the_mig_device_and_its_capabilities(
    node: Node, tmp_path: Path, devices: NodeDevices
) -> None:
    dev, proc = host(tmp_path)
    claims = FakeClaims()
    c = claim("mig", [result("gpu", "gpu-0-mig-9-0")])
    claims.add(c)
    outcome = state(node, claims, devices, dev=dev, proc=proc).prepare([ref(c)])
    assert outcome[c["metadata"]["uid"]].error == ""
    doc = one_spec(node)
    mig = devices["gpu-0-mig-9-0"].gpu
    parent = devices.gpus[0]
    env = spec_env(doc)
    assert env["NVIDIA_VISIBLE_DEVICES"] == mig.uuid
    assert env["SHAREGPU_GPU_UUID"] == env["SHAREGPU_GPU_UUIDS"] == mig.uuid
    assert env["SHAREGPU_DEVICE"] == "gpu-0-mig-9-0"
    assert (env["SHAREGPU_CORES"], env["SHAREGPU_MEMORY"]) == ("100", str(mig.memory_usable))
    assert env["SHAREGPU_MIG_PROFILE"] == "1g.10gb"
    assert env["SHAREGPU_MIG_PARENT_UUID"] == parent.uuid
    assert "SHAREGPU_PARTITION" not in env and "SHAREGPU_SHARE_ID" not in env
    nodes = doc["devices"][0]["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in nodes] == [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-caps/nvidia-cap84",
        "/dev/nvidia-caps/nvidia-cap85",
    ]
    # The host has no capability node files (see host()): they go in by their numbers.
    assert nodes[-2:] == [
        {
            "path": f"/dev/nvidia-caps/nvidia-cap{minor}",
            "type": "c",
            "major": CAPS_MAJOR,
            "minor": minor,
            "fileMode": 0o444,
            "permissions": "rw",
        }
        for minor in (84, 85)
    ]


def test_two_mig_devices_of_one_gpu_go_to_two_claims(
    node: Node, tmp_path: Path, devices: NodeDevices
) -> None:
    dev, proc = host(tmp_path)
    claims = FakeClaims()
    a = claim("a", [result("gpu", "gpu-0-mig-9-0")])
    b = claim("b", [result("gpu", "gpu-0-mig-2-0")])
    again = claim("again", [result("gpu", "gpu-0-mig-9-0")])
    claims.add(a, b, again)
    st = state(node, claims, devices, dev=dev, proc=proc)
    outcomes = st.prepare([ref(a), ref(b)])
    assert [o.error for o in outcomes.values()] == ["", ""]
    specs = {spec_env(assert_valid_cdi(p))["SHAREGPU_DEVICE"]: p for p in node.spec_files()}
    big = assert_valid_cdi(specs["gpu-0-mig-2-0"])
    assert spec_env(big)["SHAREGPU_MIG_PROFILE"] == "3g.40gb"
    caps = [n["path"] for n in big["devices"][0]["containerEdits"]["deviceNodes"][-2:]]
    assert caps == ["/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"]
    # The same MIG device is never handed out twice.
    error = st.prepare([ref(again)])[again["metadata"]["uid"]].error
    assert "already prepared exclusively" in error and "gpu-0-mig-9-0" in error


def test_a_mig_device_the_driver_lists_no_capability_for_fails_its_claim(
    node: Node, tmp_path: Path, devices: NodeDevices
) -> None:
    dev, proc = host(tmp_path, minors=b"gpu0/gi9/access 84\n")
    claims = FakeClaims()
    c = claim("mig", [result("gpu", "gpu-0-mig-9-0")])
    claims.add(c)
    error = state(node, claims, devices, dev=dev, proc=proc).prepare([ref(c)])
    message = error[c["metadata"]["uid"]].error
    assert "no entry for gpu0/gi9/ci0/access" in message
    assert node.spec_files() == []


@pytest.mark.parametrize(
    ("minors", "devices_text", "message"),
    [
        (None, b"Character devices:\n195 nvidia\n", "lists no character device 'nvidia-caps'"),
        (None, b"<html>\n", "devices line 1: '<html>' is not a '<major> <name>' entry"),
        (b"gpu0/gi9/access 84\ngpu0/gi9/ci0/access 85 86\n", None, "mig-minors line 2:"),
        (
            b"gpu0/gi9/access 84\ngpu0/gi9/access 90\ngpu0/gi9/ci0/access 85\n",
            None,
            "lists gpu0/gi9/access twice with different minors",
        ),
    ],
)
def test_capability_nodes_that_cannot_be_named_fail_the_claim_naming_the_file(
    node: Node,
    tmp_path: Path,
    devices: NodeDevices,
    minors: bytes | None,
    devices_text: bytes | None,
    message: str,
) -> None:
    dev, proc = host(tmp_path, minors=minors, devices=devices_text)
    claims = FakeClaims()
    c = claim("mig", [result("gpu", "gpu-0-mig-9-0")])
    claims.add(c)
    error = state(node, claims, devices, dev=dev, proc=proc).prepare([ref(c)])
    text = error[c["metadata"]["uid"]].error
    assert message in text and str(proc) in text
    assert node.spec_files() == []


def test_a_missing_mig_minors_file_fails_the_claim_naming_it(
    node: Node, tmp_path: Path, devices: NodeDevices
) -> None:
    dev, proc = host(tmp_path)
    (proc / MIG_MINORS_FILE).unlink()
    claims = FakeClaims()
    c = claim("mig", [result("gpu", "gpu-0-mig-9-0")])
    claims.add(c)
    error = state(node, claims, devices, dev=dev, proc=proc).prepare([ref(c)])
    assert f"cannot read {proc / MIG_MINORS_FILE}" in error[c["metadata"]["uid"]].error
    assert node.spec_files() == []


def test_prepared_mig_claims_survive_a_restart(
    node: Node, tmp_path: Path, devices: NodeDevices
) -> None:
    dev, proc = host(tmp_path)
    claims = FakeClaims()
    c = claim("mig", [result("gpu", "gpu-0-mig-10-0")])
    claims.add(c)
    first = state(node, claims, devices, dev=dev, proc=proc).prepare([ref(c)])
    gets = claims.gets
    second = state(node, claims, devices, dev=dev, proc=proc).prepare([ref(c)])
    assert second == first and claims.gets == gets, "answered from the checkpoint"


def test_the_mock_backend_gets_the_environment_without_device_nodes(
    node: Node, devices: NodeDevices
) -> None:
    claims = FakeClaims()
    c = claim("mig", [result("gpu", "gpu-0-mig-2-0"), result("gpu", "gpu-1")])
    claims.add(c)
    state(node, claims, devices).prepare([ref(c)])
    doc = one_spec(node)
    mig, whole = devices["gpu-0-mig-2-0"].gpu, devices["gpu-1"].gpu
    env = spec_env(doc)
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{mig.uuid},{whole.uuid}"
    assert "deviceNodes" not in doc["devices"][0]["containerEdits"]
    assert "SHAREGPU_MIG_PROFILE" not in spec_env(doc, 1)


def test_the_toolkit_device_of_a_mig_device_is_found_by_its_uuid_only(
    node: Node, tmp_path: Path, devices: NodeDevices
) -> None:
    etc = tmp_path / "etc-cdi"
    etc.mkdir()
    mig = devices["gpu-0-mig-9-0"].gpu
    (etc / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        "- name: '0'\n  containerEdits:\n    env: [X=1]\n"
    )
    detector = NvidiaCdiDetector(names.NVIDIA_CTK_CDI_KIND, [etc])
    claims = FakeClaims()
    c = claim("mig", [result("gpu", "gpu-0-mig-9-0")])
    claims.add(c)
    st = state(node, claims, devices, nvidia=detector)
    (device,) = st.prepare([ref(c)])[c["metadata"]["uid"]].devices
    assert not any(i.startswith("nvidia.com/gpu=") for i in device.cdi_device_ids), (
        "the parent's whole-GPU device is not the MIG device"
    )
    (etc / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        f"- name: {mig.uuid}\n  containerEdits:\n    env: [X=1]\n"
    )
    assert detector.device_ids(mig.uuid, None) == (f"nvidia.com/gpu={mig.uuid}",)


def test_a_mig_device_takes_only_the_exclusive_strategy(
    node: Node, tmp_path: Path, devices: NodeDevices
) -> None:
    tools = Tools.new()
    claims = FakeClaims()
    mps = claim("mps", [result("gpu", "gpu-0-mig-9-0")], configs=[gpu_config({"strategy": "MPS"})])
    plain = claim("plain", [result("gpu", "gpu-0-mig-10-0")])
    claims.add(mps, plain)
    st = state(node, claims, devices, enforcer=tools.enforcer(node.data_dir))
    out = st.prepare([ref(mps), ref(plain)])
    assert "supports only strategy Exclusive, not MPS" in out[mps["metadata"]["uid"]].error
    assert out[plain["metadata"]["uid"]].error == ""
    assert tools.fake.argvs() == []  # nothing was run for either


def test_a_restart_restores_the_enforcement_of_mig_claims_without_complaint(
    node: Node, tmp_path: Path, devices: NodeDevices, caplog: pytest.LogCaptureFixture
) -> None:
    tools = Tools.new()
    claims = FakeClaims()
    c = claim("mig", [result("gpu", "gpu-0-mig-10-0")])
    claims.add(c)
    state(node, claims, devices, enforcer=tools.enforcer(node.data_dir)).prepare([ref(c)])
    with caplog.at_level("WARNING"):
        restarted = state(node, claims, devices, enforcer=tools.enforcer(node.data_dir))
    assert set(restarted.prepared_claims()) == {c["metadata"]["uid"]}
    assert "does not match the claim" not in caplog.text
