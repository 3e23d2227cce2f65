"""A real container runtime consumes the specs: podman runs a container with the returned CDI ID.

Podman >= 4.6 takes ``--cdi-spec-dir``; older ones (Debian 12 ships 4.3) read only the default
spec directories, so there the spec file is shown to podman as a copy in ``/var/run/cdi`` (under
its unique claim-UID name, removed right after the container ran).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.devices.migcaps import MIG_MINORS_FILE
from kubeletplugin.devices.mock import load_mock_config
from kubeletplugin.hosts.simulated import simulated_share_tools
from kubeletplugin.sharing.enforcement import ShareEnforcer
from kubeletplugin.sharing.enforcer import build_enforcer
from tests.kubeletplugin.prepare.helpers import (
    DRIVER,
    GI,
    FakeClaims,
    Node,
    assert_valid_cdi,
    claim,
    gpus,
    ref,
    result,
    short_mps_root,
)

pytestmark = pytest.mark.podman

PODMAN = shutil.which("podman")
BUSYBOX = shutil.which("busybox")
RUN_FLAGS = ["--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
SYSTEM_CDI_DIR = Path("/var/run/cdi")
#: The driver-format ``mig-minors`` and ``/proc/devices`` fixtures.
DATA = Path(__file__).parents[1] / "devices" / "data"


def _podman(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    assert PODMAN is not None
    return subprocess.run(
        [PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if PODMAN is None:
        pytest.skip("podman is not installed (tests/setup-system.sh installs it where apt exists)")
    if BUSYBOX is None:
        pytest.skip("busybox-static is not installed; no image can be built offline")
    info = _podman("info")
    if info.returncode != 0:
        pytest.skip(f"podman cannot run here: {info.stderr.strip()[:300]}")
    root = tmp_path_factory.mktemp("rootfs")
    (root / "bin").mkdir()
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    for applet in ("sh", "env", "test", "stat"):
        os.symlink("busybox", root / "bin" / applet)
    archive = root.parent / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname=".")
    name = f"localhost/sharegpu-test-busybox:{uuid.uuid4().hex[:12]}"
    imported = _podman("import", str(archive), name)
    assert imported.returncode == 0, imported.stderr
    try:
        yield name
    finally:
        _podman("rmi", "-f", name)


def _supports_cdi_spec_dir() -> bool:
    return "--cdi-spec-dir" in _podman("run", "--help").stdout


@pytest.fixture
def node(tmp_path: Path) -> Node:
    if not _supports_cdi_spec_dir() and os.geteuid() != 0:
        pytest.skip("this podman reads CDI specs only from /var/run/cdi, which needs root")
    return Node(tmp_path)


def _run_env(
    image: str,
    spec: Path,
    cdi_ids: Sequence[str],
    probe_dir: str | None = None,
    command: Sequence[str] | None = None,
) -> dict[str, str]:
    """``env`` inside a container started with ``--device <id>`` for each of ``cdi_ids`` from
    ``spec`` (after checking that ``probe_dir`` is a directory there, when given), or the
    ``key=value`` lines ``command`` prints."""
    args = ["run", "--rm", *RUN_FLAGS]
    copied: Path | None = None
    if _supports_cdi_spec_dir():
        args += ["--cdi-spec-dir", str(spec.parent)]
    else:
        # Only the default directories: show podman the same file there (a unique name, so
        # nothing else in /var/run/cdi is touched).
        SYSTEM_CDI_DIR.mkdir(parents=True, exist_ok=True)
        copied = SYSTEM_CDI_DIR / spec.name
        shutil.copyfile(spec, copied)
    try:
        if command is None:
            command = (
                ["env"] if probe_dir is None else ["sh", "-c", f'test -d "{probe_dir}" && env']
            )
        devices = [arg for cdi_id in cdi_ids for arg in ("--device", cdi_id)]
        run = _podman(*args, *devices, image, *command)
    finally:
        if copied is not None:
            copied.unlink(missing_ok=True)
    assert run.returncode == 0, run.stderr
    return dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)


def _prepare_and_run(
    image: str,
    node: Node,
    obj: dict[str, Any],
    enforcer: ShareEnforcer | None = None,
    probe_dir: str | None = None,
    every_device: bool = False,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Prepare ``obj``, run a container with its first CDI device (``every_device``: with all
    of them, in the order kubelet got them), unprepare; returns the spec and the env."""
    claims = FakeClaims()
    claims.add(obj)
    state = node.state(claims, enforcer=enforcer)
    r = ref(obj)
    out = state.prepare([r])[r.uid]
    assert out.error == ""
    spec = node.cdi_dir / f"k8s.gpu.sharegpu.dev-claim_{r.uid}.json"
    try:
        doc = assert_valid_cdi(spec)
        devices = out.devices if every_device else out.devices[:1]
        return doc, _run_env(image, spec, [d.cdi_device_ids[0] for d in devices], probe_dir)
    finally:
        state.unprepare([r])
        assert not spec.exists()


def test_share_variables_are_visible_in_the_container(image: str, node: Node) -> None:
    obj = claim("podman-share", [result("gpu", "gpu-2", share={"cores": 30, "memory": 10 * GI})])
    _, env = _prepare_and_run(image, node, obj)
    md = obj["metadata"]
    res = obj["status"]["allocation"]["devices"]["results"][0]
    assert env["SHAREGPU_CLAIM"] == f"default/{md['name']}"
    assert env["SHAREGPU_CLAIM_UID"] == md["uid"]
    assert env["SHAREGPU_DEVICE"] == "gpu-2"
    assert env["SHAREGPU_SHARE_ID"] == res["shareID"]
    assert env["SHAREGPU_CORES"] == "30"
    assert env["SHAREGPU_MEMORY"] == str(10 * GI)
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["SHAREGPU_GPU_UUID"]


def test_whole_gpu_with_a_uid_starting_with_a_digit(image: str, node: Node) -> None:
    # cdiVersion 0.5.0 (device name starts with a digit) is accepted by podman 4.x.
    obj = claim(
        "podman-whole",
        [result("gpu", "gpu-0")],
        uid=f"0{uuid.uuid4().hex[1:8]}-0000-4000-8000-000000000000",
    )
    doc, env = _prepare_and_run(image, node, obj)
    assert doc["cdiVersion"] == "0.5.0"
    assert env["SHAREGPU_CORES"] == "100"
    assert "SHAREGPU_SHARE_ID" not in env


def test_mps_share_edits_reach_the_container(image: str, node: Node) -> None:
    # The share enforcer of the mock backend (MPS by default for shares): its mounts and
    # variables must be accepted by a real runtime.
    mps_root = short_mps_root()
    enforcer = build_enforcer(
        simulated_share_tools(), node.data_dir, driver_name=DRIVER, mps_root=mps_root
    )
    obj = claim("podman-mps", [result("gpu", "gpu-1", share={"cores": 30, "memory": 10 * GI})])
    gpu_uuid = gpus()[1].uuid
    pipe = f"/run/sharegpu/mps/{gpu_uuid}/pipe"
    try:
        doc, env = _prepare_and_run(image, node, obj, enforcer=enforcer, probe_dir=pipe)
    finally:
        shutil.rmtree(mps_root, ignore_errors=True)
    assert doc["devices"][0]["containerEdits"]["mounts"]
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["SHAREGPU_CORES"] == "30"


def test_a_container_given_both_devices_of_a_request_sees_both_gpus(image: str, node: Node) -> None:
    obj = claim(
        "podman-pair",
        [
            result("gpu", "gpu-5", share={"cores": 30, "memory": 10 * GI}),
            result("gpu", "gpu-2", share={"cores": 20, "memory": 4 * GI}),
        ],
    )
    _, env = _prepare_and_run(image, node, obj, every_device=True)
    g = gpus()
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{g[2].uuid},{g[5].uuid}"
    assert env["SHAREGPU_DEVICES"] == "gpu-2,gpu-5"
    assert env["SHAREGPU_GPU_UUIDS"] == f"{g[2].uuid},{g[5].uuid}"
    assert env["SHAREGPU_CORES_LIST"] == "20,30"
    assert env["SHAREGPU_MEMORY_LIST"] == f"{4 * GI},{10 * GI}"
    assert env["SHAREGPU_REQUEST"] == "gpu"


def test_device_nodes_given_by_their_numbers_are_created_in_the_container(
    image: str, node: Node, tmp_path: Path
) -> None:
    """A MIG device's capability nodes and absent UVM nodes go into the spec as character
    devices by their numbers; the runtime creates them although the host has no such files
    (the H200's majors: 238 nvidia-uvm, 241 nvidia-caps)."""
    dev, proc = tmp_path / "dev", tmp_path / "proc"
    dev.mkdir()
    (proc / MIG_MINORS_FILE).parent.mkdir(parents=True)
    shutil.copy(DATA / "mig-minors", proc / MIG_MINORS_FILE)
    shutil.copy(DATA / "proc-devices", proc / "devices")
    config = tmp_path / "gpus.yaml"
    config.write_text("- migDevices: [{profile: 1g.10gb, gpuInstance: 9}]\n")
    claims = FakeClaims()
    obj = claim("podman-mig", [result("gpu", "gpu-0-mig-9-0")])
    claims.add(obj)
    state = node.state(
        claims, gpu_list=load_mock_config("node-a", config), dev_root=dev, proc_root=proc
    )
    r = ref(obj)
    out = state.prepare([r])[r.uid]
    assert out.error == ""
    spec = node.cdi_dir / f"k8s.gpu.sharegpu.dev-claim_{r.uid}.json"
    try:
        doc = assert_valid_cdi(spec)
        paths = [n["path"] for n in doc["devices"][0]["containerEdits"]["deviceNodes"]]
        assert paths == [
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-caps/nvidia-cap84",
            "/dev/nvidia-caps/nvidia-cap85",
        ]
        script = " && ".join(f"test -c {p} && echo {p}=$(stat -c '%t:%T:%a' {p})" for p in paths)
        found = _run_env(
            image, spec, out.devices[0].cdi_device_ids[:1], command=["sh", "-c", script]
        )
    finally:
        state.unprepare([r])
    # stat prints the major and minor in hex: 238 = ee, 241 = f1, 84 = 54, 85 = 55.
    assert found == {
        "/dev/nvidia-uvm": "ee:0:666",
        "/dev/nvidia-uvm-tools": "ee:1:666",
        "/dev/nvidia-caps/nvidia-cap84": "f1:54:444",
        "/dev/nvidia-caps/nvidia-cap85": "f1:55:444",
    }
