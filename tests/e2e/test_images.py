"""The OCI archives of the end-to-end node (no control plane, no containerd): image names as the
CRI normalizes them, and an archive whose index, manifest, config and layer digests agree."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import tomllib
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


def test_archive_is_also_a_docker_archive(tmp_path: Path) -> None:
    archive = images.write_oci_archive(
        tmp_path / "image.tar",
        ["sharegpu:1"],
        [b"layer one", b"layer two"],
        user="65532:65532",
        labels={"org.opencontainers.image.title": "sharegpu"},
        docker_archive=True,
    )
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    (docker,) = json.loads(files["manifest.json"])
    assert docker["RepoTags"] == ["docker.io/library/sharegpu:1"]
    assert [files[layer] for layer in docker["Layers"]] == [b"layer one", b"layer two"]
    config = json.loads(files[docker["Config"]])
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Labels"] == {"org.opencontainers.image.title": "sharegpu"}
    (entry,) = json.loads(files["index.json"])["manifests"]
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].split(':')[1]}"])
    assert docker["Config"] == f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"


def test_oci_archive_without_docker_manifest_by_default(tmp_path: Path) -> None:
    archive = images.write_oci_archive(tmp_path / "image.tar", ["a"], [b"x"])
    with tarfile.open(archive) as tar:
        assert "manifest.json" not in tar.getnames()


def test_driver_image_is_named_as_the_chart_renders_it() -> None:
    chart = yaml.safe_load((REPO_ROOT / "deploy/helm/sharegpu/Chart.yaml").read_text())
    assert driverimage.chart_image() == f"sharegpu:{chart['appVersion']}"


def _tar(path: Path, members: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w") as tar:
        for member in members:
            tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isreg() else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info


def test_base_layer_drops_device_nodes_and_the_build_hosts_files(tmp_path: Path) -> None:
    raw = _tar(
        tmp_path / "raw.tar",
        [
            _member("./", tarfile.DIRTYPE),
            _member("./dev/", tarfile.DIRTYPE),
            _member("./dev/null", tarfile.CHRTYPE),
            _member("./etc/resolv.conf", size=3),
            _member("./etc/hostname", size=3),
            _member("./etc/passwd", size=5),
            _member("./usr/bin/python3.11", size=4),
        ],
    )
    driverimage.builder()._normalized(raw, tmp_path / "base.tar")
    with tarfile.open(tmp_path / "base.tar") as tar:
        assert tar.getnames() == ["dev", "etc/passwd", "usr/bin/python3.11"]
    assert driverimage.builder().image_python(tmp_path / "base.tar") == "python3.11"


def test_build_refuses_a_python_other_than_the_images(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = driverimage.builder()
    base = _tar(tmp_path / "base.tar", [_member("usr/bin/python3.99", size=1)])
    monkeypatch.setattr(build, "base_layer", lambda *_args, **_kwargs: base)
    with pytest.raises(build.BuildError, match=r"the image's Python is python3\.99"):
        build.build(tmp_path / "out.tar", ["sharegpu:1"], cache=tmp_path)
    assert not (tmp_path / "out.tar").exists()


def test_dockerfile_follows_the_recipe_of_make_image() -> None:
    """deploy/Dockerfile writes the same console scripts, installs the same Debian packages and
    creates the same user as deploy/image/build.py."""
    build = driverimage.builder()
    dockerfile = (REPO_ROOT / "deploy" / "Dockerfile").read_text()
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (entries,) = re.findall(r"for entry in ([^;]+);", dockerfile)
    assert sorted(entries.replace("\\\n", " ").split()) == sorted(
        f"{name}:{target.split(':', 1)[0]}" for name, target in scripts.items()
    )
    (final_install,) = re.findall(
        r"apt-get install -y --no-install-recommends ([^\n]+tini[^\n]*)", dockerfile
    )
    assert sorted(final_install.replace("\\", " ").split()) == sorted(build.PACKAGES)
    assert f"debian:{build.SUITE}-slim" in dockerfile
    assert f"USER {build.USER}" in dockerfile
    uid, gid = build.USER.split(":")
    assert (
        f"--uid {uid} --gid {gid}" in dockerfile and f"--gid {gid} {build.USER_NAME}" in dockerfile
    )
    ignored = (REPO_ROOT / "deploy" / "Dockerfile.dockerignore").read_text().split()
    for package in build.PROJECT_PACKAGES:
        assert f"!{package}/" in ignored, f"the build context leaves out {package}/"
