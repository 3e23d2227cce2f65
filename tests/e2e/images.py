"""Container images of the end-to-end node without docker or a registry: OCI image archives
written here and imported with ``ctr -n k8s.io images import``.

:func:`busybox_image` makes a one-layer image from the host's static busybox (``busybox-static``):
the pod sandbox ("pause") image and the workload image the examples' pods run under their own
image names. Each archive holds one uncompressed layer, its config and a manifest whose
``io.containerd.image.name`` annotation is the fully qualified name the CRI looks pods' images up
by (``pytorch/pytorch:2.7.0`` is ``docker.io/pytorch/pytorch:2.7.0``).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

#: Where Debian's busybox-static installs its binary.
BUSYBOX: Final = Path("/bin/busybox")


def qualified(name: str) -> str:
    """The fully qualified reference of an image name, as the CRI normalizes it:
    ``busybox`` -> ``docker.io/library/busybox:latest``."""
    first, _, rest = name.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        name = f"docker.io/{name if rest else 'library/' + name}"
    last = name.rsplit("/", 1)[1]
    return name if ":" in last or "@" in last else f"{name}:latest"


def _add(tar: tarfile.TarFile, info: tarfile.TarInfo, data: bytes = b"") -> None:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if info.isreg():
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def busybox_layer(commands: Iterable[str]) -> bytes:
    """A layer tar: ``/bin/busybox`` and a symlink to it under ``/bin`` for each of ``commands``,
    with the directories a container root needs."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "root"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            _add(tar, info)
        binary = tarfile.TarInfo("bin/busybox")
        binary.mode = 0o755
        _add(tar, binary, BUSYBOX.read_bytes())
        for command in sorted(set(commands) - {"busybox"}):
            link = tarfile.TarInfo(f"bin/{command}")
            link.type, link.linkname, link.mode = tarfile.SYMTYPE, "busybox", 0o777
            _add(tar, link)
        passwd = tarfile.TarInfo("etc/passwd")
        passwd.mode = 0o644
        _add(tar, passwd, b"root:x:0:0:root:/root:/bin/sh\n")
    return buf.getvalue()


def busybox_commands() -> list[str]:
    """The applets of the host's busybox."""
    out = subprocess.run(
        [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True, timeout=30
    )
    return out.stdout.split()


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def write_oci_archive(
    path: Path,
    names: Sequence[str],
    layers: Sequence[bytes | Path],
    *,
    entrypoint: Sequence[str] = (),
    cmd: Sequence[str] = (),
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",),
    user: str = "",
    labels: Mapping[str, str] | None = None,
    docker_archive: bool = False,
    architecture: str = "amd64",
) -> Path:
    """An OCI image layout tar at ``path`` with one linux image for ``architecture`` (OCI's names:
    amd64, arm64) (``layers``, uncompressed
    tars given as bytes or files) listed once under each of ``names`` (qualified by
    :func:`qualified`), running as ``user`` (empty: the image's root). With ``docker_archive``
    the tar is also a docker archive (``docker load``): a ``manifest.json`` naming the same
    config and layer blobs, as ``docker save`` writes beside the OCI layout."""
    blobs: dict[str, bytes | Path] = {}

    def blob(data: bytes | Path, media_type: str) -> dict[str, Any]:
        if isinstance(data, Path):
            digest, size = _file_digest(data), data.stat().st_size
        else:
            digest, size = "sha256:" + hashlib.sha256(data).hexdigest(), len(data)
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": size}

    layer_descriptors = [blob(layer, "application/vnd.oci.image.layer.v1.tar") for layer in layers]
    config = {
        "architecture": architecture,
        "os": "linux",
        "config": {
            "Entrypoint": list(entrypoint) or None,
            "Cmd": list(cmd) or None,
            "Env": list(env),
            **({"User": user} if user else {}),
            **({"Labels": dict(labels)} if labels else {}),
        },
        "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in layer_descriptors]},
    }
    config_descriptor = blob(
        json.dumps(config, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json"
    )
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_descriptor,
        "layers": layer_descriptors,
    }
    manifest_descriptor = blob(
        json.dumps(manifest, sort_keys=True).encode(), "application/vnd.oci.image.manifest.v1+json"
    )
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                **manifest_descriptor,
                "platform": {"architecture": architecture, "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": qualified(name),
                    "org.opencontainers.image.ref.name": qualified(name).rsplit(":", 1)[1],
                },
            }
            for name in names
        ],
    }
    with tarfile.open(path, "w") as tar:
        entries: dict[str, bytes | Path] = {
            "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
            "index.json": json.dumps(index, sort_keys=True).encode(),
        }
        if docker_archive:
            docker_manifest = [
                {
                    "Config": f"blobs/sha256/{config_descriptor['digest'].split(':', 1)[1]}",
                    "RepoTags": [qualified(name) for name in names],
                    "Layers": [
                        f"blobs/sha256/{d['digest'].split(':', 1)[1]}" for d in layer_descriptors
                    ],
                }
            ]
            entries["manifest.json"] = json.dumps(docker_manifest).encode()
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            _add(tar, info)
        for digest, data in blobs.items():
            entries[f"blobs/sha256/{digest.split(':', 1)[1]}"] = data
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.mode = 0o644
            if isinstance(data, Path):
                info.size, info.mtime = data.stat().st_size, 0
                with data.open("rb") as f:
                    tar.addfile(info, f)
            else:
                _add(tar, info, data)
    return path


def busybox_image(path: Path, names: Sequence[str], cmd: Sequence[str] = ("sh",)) -> Path:
    """:func:`write_oci_archive` of the busybox layer under ``names``."""
    return write_oci_archive(path, names, [busybox_layer(busybox_commands())], cmd=cmd)


def missing_tools() -> list[str]:
    """What :func:`busybox_image` and the driver's image (``make image``) need and this machine
    lacks."""
    missing = []
    if not BUSYBOX.exists() or shutil.which("busybox") is None:
        missing.append(f"no static busybox at {BUSYBOX} (apt-get install busybox-static)")
    if shutil.which("mmdebstrap") is None:
        missing.append("no mmdebstrap to build the driver's image (apt-get install mmdebstrap)")
    return missing
