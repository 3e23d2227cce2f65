"""The driver's image for the end-to-end node, built without docker from this machine's Python.

``deploy/Dockerfile`` needs a container engine and a registry; here the image is assembled from
what the test run already has, as an OCI archive (:func:`images.write_oci_archive`):

- the Python installation running the tests (``sys.base_prefix``, without its tests, IDLE,
  tkinter, static library and own site-packages), at the same path inside the image;
- the project's runtime dependencies: the files of every distribution ``sharegpu`` requires
  (transitively, no extras) as installed in the virtualenv, copied into that Python's
  site-packages, and the project's packages from the checkout;
- the shared libraries all of these load (``ldd``) at their host paths, a static busybox for
  ``/bin/sh``, and tini (Debian's ``tini``) as the chart's entry point expects;
- ``sharegpu-kubeletplugin``, ``sharegpu-controller`` and ``sharegpu`` in ``/usr/local/bin``,
  the console scripts of ``pyproject.toml``.

It is named as the chart renders the image by default (``sharegpu:<appVersion>``), so the chart
needs no image value. It runs only on machines like the one that built it.
"""

from __future__ import annotations

import importlib.metadata as metadata
import io
import os
import re
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import yaml
from packaging.requirements import Requirement

from tests.e2e import images
from tests.paths import REPO_ROOT

#: Where Debian's tini package installs it (the chart's plugin container runs ``tini -s --``).
TINI: Final = Path("/usr/bin/tini")
PROJECT_PACKAGES: Final = ("api", "kubeletplugin", "controller", "sharegpu", "sharegpuctl")
#: Parts of the Python installation the daemons never use.
_STDLIB_SKIPPED: Final = frozenset(
    {"test", "site-packages", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
)
_PY: Final = f"python{sys.version_info.major}.{sys.version_info.minor}"


def chart_image() -> str:
    """The image the chart renders by default: ``<image.repository>:<appVersion>``."""
    chart_dir = REPO_ROOT / "deploy" / "helm" / "sharegpu"
    values = yaml.safe_load((chart_dir / "values.yaml").read_text())
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    return f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}"


def _dependency_files() -> Iterator[Path]:
    """The installed files of every distribution the project requires (transitively)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r).name for r in project["dependencies"]]
    seen: set[str] = set()
    while todo:
        dist = metadata.distribution(todo.pop())
        key = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if key in seen:
            continue
        seen.add(key)
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        for file in dist.files or []:
            path = Path(str(file.locate()))
            if path.is_file():
                yield path


def _site_packages() -> Path:
    """The site-packages directory of the virtualenv running the tests."""
    return Path(str(metadata.distribution("pyyaml").locate_file("")))


def layer_members() -> dict[str, Path]:
    """Image path (relative, no leading slash) -> host file of everything but the scripts."""
    prefix = Path(sys.base_prefix)
    stdlib = prefix / "lib" / _PY
    target_site = stdlib / "site-packages"
    members: dict[str, Path] = {}

    def put(image_path: Path, host: Path) -> None:
        members[str(image_path).lstrip("/")] = host

    for sub in ("bin", "lib"):
        for root, dirs, files in os.walk(prefix / sub):
            here = Path(root)
            if here == stdlib:
                dirs[:] = [
                    d for d in dirs if d not in _STDLIB_SKIPPED and not d.startswith("config-")
                ]
            if here == prefix / "lib":
                dirs[:] = [d for d in dirs if d == _PY]
                files = [f for f in files if f.startswith("libpython")]
            for name in files:
                put(here / name, here / name)
    site = _site_packages()
    for path in _dependency_files():
        if site in path.parents:
            put(target_site / path.relative_to(site), path)
    for package in PROJECT_PACKAGES:
        for root, dirs, files in os.walk(REPO_ROOT / package):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                host = Path(root) / name
                put(target_site / host.relative_to(REPO_ROOT), host)
    put(TINI, TINI)
    return members


def _shared_libraries(files: list[Path]) -> set[Path]:
    """The shared libraries (and the dynamic loader) the ELF files among ``files`` load."""
    elves = [f for f in files if f.suffix == ".so" or ".so." in f.name or os.access(f, os.X_OK)]
    elves = [f for f in elves if f.read_bytes()[:4] == b"\x7fELF"]
    libraries: set[Path] = set()
    for chunk in range(0, len(elves), 100):
        out = subprocess.run(
            ["ldd", *map(str, elves[chunk : chunk + 100])],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        ).stdout
        for match in re.finditer(r"(?:=> )?(/\S+) \(0x", out):
            libraries.add(Path(match.group(1)))
    return libraries


def _script(module: str) -> bytes:
    interpreter = Path(sys.base_prefix) / "bin" / _PY
    return f"#!{interpreter}\nimport sys\nfrom {module} import main\nsys.exit(main())\n".encode()


def write_layer(path: Path) -> Path:
    """The image's one layer as a tar at ``path``."""
    members = layer_members()
    for library in _shared_libraries(list(members.values())):
        members.setdefault(str(library).lstrip("/"), library.resolve())
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("bin", "tmp", "etc", "proc", "sys", "dev", "run", "var", "usr/local/bin"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        busybox = tarfile.TarInfo("bin/busybox")
        busybox.mode, busybox.size = 0o755, images.BUSYBOX.stat().st_size
        with images.BUSYBOX.open("rb") as f:
            tar.addfile(busybox, f)
        for command in ("sh", "env", "cat", "ls", "sleep", "seq"):
            link = tarfile.TarInfo(f"bin/{command}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        parents = {str(p) for name in members for p in Path(name).parents if str(p) != "."}
        for directory in sorted(parents - {"bin", "tmp", "etc", "usr/local/bin"}):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name in sorted(members):
            tar.add(str(members[name]), arcname=name, recursive=False)
        for script, entry in project["scripts"].items():
            data = _script(entry.split(":", 1)[0])
            info = tarfile.TarInfo(f"usr/local/bin/{script}")
            info.mode, info.size = 0o755, len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def build(directory: Path, *tags: str) -> tuple[Path, str]:
    """Write the image's OCI archive under ``directory``, named as the chart renders it and also
    with each of ``tags`` instead of its tag; returns the archive and the chart's image name."""
    name = chart_image()
    names = [name, *(f"{name.rsplit(':', 1)[0]}:{tag}" for tag in tags)]
    layer = write_layer(directory / "sharegpu-layer.tar")
    env = (
        f"PATH=/usr/local/bin:{Path(sys.base_prefix) / 'bin'}:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE=1",
        "PYTHONUNBUFFERED=1",
        "MALLOC_ARENA_MAX=2",
    )
    archive = images.write_oci_archive(
        directory / "sharegpu.tar", names, [layer], cmd=("sharegpu", "--help"), env=env
    )
    layer.unlink()
    return archive, name
