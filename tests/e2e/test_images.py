"""The OCI archives of the end-to-end node (no control plane, no containerd): image names as the
CRI normalizes them, and an archive whose index, manifest, config and layer digests agree."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.e2e import driverimage, images
from tests.paths import REPO_ROOT


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("busybox", "docker.io/library/busybox:latest"),
        ("sharegpu:0.1.0", "docker.io/library/sharegpu:0.1.0"),
        (
            "pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime",
            "docker.io/pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime",
        ),
        ("nvcr.io/nvidia/cuda:12.8.0-base", "nvcr.io/nvidia/cuda:12.8.0-base"),
        ("localhost/sharegpu-e2e/pause:1", "localhost/sharegpu-e2e/pause:1"),
        ("registry:5000/app", "registry:5000/app:latest"),
    ],
)
def test_qualified_names_follow_the_cri(name: str, expected: str) -> None:
    assert images.qualified(name) == expected


def test_archive_digests_and_names_agree(tmp_path: Path) -> None:
    layer_file = tmp_path / "layer.tar"
    with tarfile.open(layer_file, "w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    archive = images.write_oci_archive(
        tmp_path / "image.tar", ["a/b:1", "c"], [layer_file, b"not a tar"], cmd=("sh",)
    )
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    names = [m["annotations"]["io.containerd.image.name"] for m in index["manifests"]]
    assert names == ["docker.io/a/b:1", "docker.io/library/c:latest"]
    (digest,) = {m["digest"] for m in index["manifests"]}
    manifest = json.loads(files[f"blobs/sha256/{digest.split(':')[1]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert config["rootfs"]["diff_ids"] == [layer["digest"] for layer in manifest["layers"]]
    assert files[f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}"] == (
        layer_file.read_bytes()
    )
    assert config["config"]["Cmd"] == ["sh"] and config["os"] == "linux"


@pytest.mark.skipif(not images.BUSYBOX.exists(), reason="no static busybox (busybox-static)")
def test_busybox_layer_links_every_applet_to_busybox() -> None:
    with tarfile.open(fileobj=io.BytesIO(images.busybox_layer(["sh", "sleep"]))) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["bin/busybox"].isfile() and members["bin/busybox"].mode == 0o755
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "busybox"
    assert members["tmp"].isdir() and members["tmp"].mode == 0o1777


def test_driver_image_holds_the_runtime_closure_and_no_dev_tools() -> None:
    members = driverimage.layer_members()
    site = f"{sys.base_prefix.lstrip('/')}/lib/python{sys.version_info[0]}.{sys.version_info[1]}"
    site += "/site-packages"
    for needed in ("kubeletplugin/main.py", "controller/main.py", "pydantic/__init__.py"):
        assert f"{site}/{needed}" in members, needed
    assert not [m for m in members if m.startswith((f"{site}/mypy/", f"{site}/_pytest/"))]
    assert not [m for m in members if "/__pycache__/" in m and "/kubeletplugin/" in m]
    assert str(driverimage.TINI).lstrip("/") in members


def test_driver_image_is_named_as_the_chart_renders_it() -> None:
    chart = yaml.safe_load((REPO_ROOT / "deploy/helm/sharegpu/Chart.yaml").read_text())
    assert driverimage.chart_image() == f"sharegpu:{chart['appVersion']}"
