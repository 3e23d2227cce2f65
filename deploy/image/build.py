"""Build the driver's image without docker and without a container registry (``make image``).

The recipe of ``deploy/Dockerfile``, from Debian packages and Python wheels only:

1. the base layer: a Debian root filesystem made by ``mmdebstrap`` (variant ``minbase``) from
   :data:`SUITE` with Debian's ``python3`` and ``tini`` (:data:`PACKAGES`), without
   documentation, and the unprivileged user ``sharegpu`` (:data:`USER`); cached under
   ``~/.cache/sharegpu-image`` by its recipe, so only the first build downloads packages;
2. the dependencies' layer: the wheels of the project's runtime dependencies (``pip wheel``
   from PyPI, kept in the cache; with all of them there, no index is asked) unpacked into
   ``/usr/local/lib/python3.X/dist-packages``, Debian's place for locally installed packages,
   and compiled to bytecode; cached by the wheels' names;
3. the project's layer: its wheel (built from a copy of the checkout's sources) unpacked the
   same way, the console scripts of ``pyproject.toml`` in ``/usr/local/bin`` and the examples in
   ``/usr/share/sharegpu/examples``.

The output is one tar that is both an OCI image layout (``podman load``, ``ctr images import``,
``skopeo copy oci-archive:...``) and a docker archive (``docker load``), named as the chart
renders its default image: ``<image.repository>:<appVersion>`` from the chart, so the tag
follows the chart's version. The image runs as :data:`USER` by default (the controller's
``runAsUser``); the chart runs the kubelet plugin and the MPS daemons as root, which need the
host's device nodes and CDI directories.

The wheels are built by the Python running this script, which must be the minor version of the
image's Python (bookworm: 3.11): the compiled wheels and the bytecode are for that version.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import yaml

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.e2e.images import write_oci_archive  # noqa: E402

CHART_DIR: Final = REPO_ROOT / "deploy" / "helm" / "sharegpu"
#: Where ``make image`` writes the archive, relative to the checkout (one path for every version:
#: the image's name inside carries the version).
DEFAULT_OUTPUT: Final = Path("dist") / "sharegpu-image.tar"
#: The project's packages (pyproject.toml's ``packages.find``), copied to build its wheel.
PROJECT_PACKAGES: Final = ("api", "kubeletplugin", "controller", "sharegpu", "sharegpuctl")
#: The Debian release of the base layer; its python3 is 3.11 (the project needs >= 3.11).
SUITE: Final = "bookworm"
#: The Debian packages installed into the base layer, beside ``minbase``'s essential set.
PACKAGES: Final = ("python3", "tini", "ca-certificates")
#: The apt sources of the base layer (``MIRROR`` replaces the default mirror's URL).
SOURCES: Final = (
    "deb {mirror} bookworm main",
    "deb {mirror} bookworm-updates main",
    "deb {security} bookworm-security main",
)
DEFAULT_MIRROR: Final = "http://deb.debian.org/debian"
DEFAULT_SECURITY: Final = "http://deb.debian.org/debian-security"
#: The image's default user (uid:gid) and its name, as the chart's controller runs.
USER: Final = "65532:65532"
USER_NAME: Final = "sharegpu"
#: Paths dpkg does not install into the base layer (as Debian's slim images).
DPKG_EXCLUDES: Final = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
)
#: Files of the build host that mmdebstrap copies in and an image must not carry.
HOST_FILES: Final = frozenset({"etc/resolv.conf", "etc/hostname"})
ENV: Final = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONDONTWRITEBYTECODE=1",
    "PYTHONUNBUFFERED=1",
    # glibc's per-thread malloc arenas: two keep the plugin's resident memory flat under load.
    "MALLOC_ARENA_MAX=2",
)
LABELS: Final = {
    "org.opencontainers.image.title": "sharegpu",
    "org.opencontainers.image.description": "Kubernetes DRA driver for shared NVIDIA GPUs",
    "org.opencontainers.image.licenses": "Apache-2.0",
}


class BuildError(Exception):
    """A build step failed; the message says which and why."""


def default_cache() -> Path:
    """Where base layers and wheels are kept between builds."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "sharegpu-image"


def chart_image() -> str:
    """The image the chart renders by default: ``<image.repository>:<image.tag or appVersion>``."""
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    return f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}"


def _run(argv: Sequence[str], what: str, **kwargs: object) -> None:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip().splitlines()[-20:]
        raise BuildError(f"{what} failed (exit code {result.returncode}): " + "\n".join(tail))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (concurrent builds share the cache)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _install_mmdebstrap() -> None:
    """Install Debian's mmdebstrap where missing (as root with apt), else say how."""
    if shutil.which("mmdebstrap") is not None:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise BuildError("mmdebstrap not found (apt-get install mmdebstrap)")
    print("installing mmdebstrap with apt-get ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "mmdebstrap"]
    if subprocess.run(install, env=env, capture_output=True, timeout=600).returncode != 0:
        _run(["apt-get", "update", "-qq"], "apt-get update", env=env, timeout=600)
        _run(install, "apt-get install mmdebstrap", env=env, timeout=600)


def base_recipe(mirror: str, security: str) -> dict[str, object]:
    """Everything the base layer is made of; its hash names the cached layer."""
    return {
        "suite": SUITE,
        "variant": "minbase",
        "packages": list(PACKAGES),
        "sources": [s.format(mirror=mirror, security=security) for s in SOURCES],
        "dpkg": list(DPKG_EXCLUDES),
        "user": [USER, USER_NAME],
        # what _normalized keeps of mmdebstrap's tar
        "layout": 2,
    }


def _normalized(source: Path, target: Path) -> None:
    """Copy mmdebstrap's tar without device nodes (the runtime provides ``/dev``; unprivileged
    importers cannot create them) and without the build host's files."""
    with tarfile.open(source) as src, tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as dst:
        for member in src:
            name = member.name.removeprefix("./").rstrip("/")
            if name in ("", ".") or name in HOST_FILES or member.ischr() or member.isblk():
                continue
            member.name = name
            if member.islnk():
                member.linkname = member.linkname.removeprefix("./")
            dst.addfile(member, src.extractfile(member) if member.isreg() else None)


def base_layer(cache: Path, mirror: str, security: str, *, refresh: bool = False) -> Path:
    """The cached base layer of the recipe, made with mmdebstrap when absent (or ``refresh``:
    Debian's updates since the cached one was made)."""
    recipe = base_recipe(mirror, security)
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    layer = cache / f"base-{SUITE}-{key}.tar"
    with _locked(cache / "base.lock"):
        if layer.exists() and not refresh:
            return layer
        _install_mmdebstrap()
        print(f"building the Debian {SUITE} base layer with mmdebstrap ...", flush=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            raw = Path(tmp) / "rootfs.tar"
            argv = [
                "mmdebstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                *(f"--dpkgopt={option}" for option in DPKG_EXCLUDES),
                f'--customize-hook=chroot "$1" groupadd --system --gid {USER.split(":")[1]} '
                f"{USER_NAME}",
                f'--customize-hook=chroot "$1" useradd --system --uid {USER.split(":")[0]} '
                f"--gid {USER.split(':')[1]} --home-dir /nonexistent --no-create-home "
                f"--shell /usr/sbin/nologin {USER_NAME}",
                SUITE,
                str(raw),
                *recipe["sources"],  # type: ignore[misc]
            ]
            _run(argv, "mmdebstrap", timeout=1800)
            _normalized(raw, Path(tmp) / "base.tar")
            (Path(tmp) / "base.tar").rename(layer)
    return layer


def image_python(layer: Path) -> str:
    """The ``pythonX.Y`` of the base layer's ``/usr/bin/python3``."""
    with tarfile.open(layer) as tar:
        for member in tar:
            match = re.fullmatch(r"usr/bin/(python3\.\d+)", member.name)
            if match:
                return match.group(1)
    raise BuildError(f"{layer}: no usr/bin/python3.X")


def _project_source(directory: Path) -> Path:
    """A copy of the project's sources (as ``deploy/Dockerfile`` copies them): setuptools'
    ``build/`` in the checkout could hold modules deleted since."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, directory / name)
    for package in PROJECT_PACKAGES:
        shutil.copytree(
            REPO_ROOT / package,
            directory / package,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    return directory


def build_wheels(directory: Path, wheel_cache: Path, *, refresh: bool = False) -> list[Path]:
    """The wheels of the project and of its runtime dependencies in ``directory``. The
    dependencies come from ``wheel_cache`` alone where it holds them all (no index asked),
    else from PyPI (unless ``refresh``, the cache first); the dependencies' wheels are kept
    there."""
    wheel_cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sharegpu-src-") as tmp:
        source = _project_source(Path(tmp))
        argv = [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check"),
            *("--wheel-dir", str(directory), "--find-links", str(wheel_cache), str(source)),
        ]
        offline = subprocess.run(
            [*argv, "--no-index"], capture_output=True, text=True, check=False, timeout=1800
        )
        if refresh or offline.returncode != 0:
            _run(argv, "pip wheel", timeout=1800)
    wheels = sorted(directory.glob("*.whl"))
    for wheel in wheels:
        if not _is_project(wheel):
            shutil.copy2(wheel, wheel_cache / wheel.name)
    return wheels


def _is_project(wheel: Path) -> bool:
    return wheel.name.startswith("sharegpu-")


def _script(module: str) -> str:
    return f"#!/usr/bin/python3\nimport sys\nfrom {module} import main\nsys.exit(main())\n"


def _install(stage: Path, wheels: Sequence[Path], python: str) -> None:
    """Unpack ``wheels`` under ``stage`` where they lie in the image, compiled to bytecode."""
    site = stage / "usr" / "local" / "lib" / python / "dist-packages"
    _run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-compile", "--disable-pip-version-check", "--target", str(site), *map(str, wheels)],
        "pip install --target",
        timeout=1800,
    )  # fmt: skip
    shutil.rmtree(site / "bin", ignore_errors=True)  # scripts with this host's interpreter
    _run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode",
         "unchecked-hash", "-s", str(stage), "-p", "/", str(site)],
        "compileall",
        timeout=1800,
    )  # fmt: skip


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid, info.gid, info.uname, info.gname, info.mtime = 0, 0, "root", "root", 0
    if info.isdir() or info.mode & 0o111:
        info.mode = 0o755
    else:
        info.mode = 0o644
    return info


def _layer_of(stage: Path, layer: Path) -> Path:
    """``stage``'s tree as a layer tar at ``layer``, every entry owned by root."""
    with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as tar:
        for top in sorted(stage.iterdir()):
            tar.add(str(top), arcname=top.name, filter=_root_owned)
    return layer


def dependencies_layer(cache: Path, wheels: Sequence[Path], python: str) -> Path:
    """The cached layer of the dependencies' ``wheels`` (named by their file names and
    ``python``), made when absent."""
    names = sorted(w.name for w in wheels)
    key = hashlib.sha256(json.dumps([python, names]).encode()).hexdigest()[:16]
    layer = cache / f"dependencies-{key}.tar"
    with _locked(cache / "dependencies.lock"):
        if layer.exists():
            return layer
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            stage = Path(tmp) / "stage"
            _install(stage, wheels, python)
            _layer_of(stage, Path(tmp) / "layer.tar").rename(layer)
    return layer


def project_layer(work: Path, wheel: Path, python: str) -> Path:
    """The project's layer under ``work``: its packages, console scripts and examples."""
    stage = work / "stage"
    _install(stage, [wheel], python)
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    bin_dir = stage / "usr" / "local" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, entry in scripts.items():
        script = bin_dir / name
        script.write_text(_script(entry.split(":", 1)[0]))
        script.chmod(0o755)
    shutil.copytree(REPO_ROOT / "examples", stage / "usr" / "share" / "sharegpu" / "examples")
    return _layer_of(stage, work / "project.tar")


def _architecture() -> str:
    """The OCI architecture of this machine, whose Debian packages mmdebstrap installs."""
    out = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=False, timeout=30
    )
    if out.returncode != 0 or not out.stdout.strip():
        raise BuildError("dpkg --print-architecture failed: mmdebstrap needs a Debian host")
    return {"armhf": "arm", "i386": "386"}.get(out.stdout.strip(), out.stdout.strip())


def build(
    output: Path,
    names: Sequence[str],
    *,
    cache: Path | None = None,
    mirror: str = DEFAULT_MIRROR,
    security: str = DEFAULT_SECURITY,
    refresh: bool = False,
) -> Path:
    """Write the image under ``names`` to ``output`` (an OCI layout that is also a docker
    archive); returns ``output``."""
    cache = cache or default_cache()
    base = base_layer(cache, mirror, security, refresh=refresh)
    python = image_python(base)
    here = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if python != here:
        raise BuildError(
            f"the image's Python is {python} (Debian {SUITE}) and this one is {here}: run the "
            f"build with {python} (its wheels and bytecode are for one minor version)"
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sharegpu-image-") as tmp:
        wheels = build_wheels(Path(tmp) / "wheels", cache / "wheels", refresh=refresh)
        (project,) = [w for w in wheels if _is_project(w)]
        dependencies = dependencies_layer(cache, [w for w in wheels if w != project], python)
        layer = project_layer(Path(tmp), project, python)
        write_oci_archive(
            output,
            names,
            [base, dependencies, layer],
            cmd=("sharegpu", "--help"),
            env=ENV,
            user=USER,
            labels=LABELS,
            docker_archive=True,
            architecture=_architecture(),
        )
    return output


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python deploy/image/build.py", description=__doc__.split("\n\n", 1)[0]
    )
    parser.add_argument(
        "--output", type=Path, help=f"the archive to write (default: {DEFAULT_OUTPUT})"
    )
    parser.add_argument(
        "--name", help="the image's name (default: the chart's <image.repository>:<appVersion>)"
    )
    parser.add_argument(
        "--also-tag", action="append", default=[], help="another tag for the same image"
    )
    parser.add_argument("--cache", type=Path, help=f"cache directory (default {default_cache()})")
    parser.add_argument(
        "--mirror",
        default=os.environ.get("DEBIAN_MIRROR", DEFAULT_MIRROR),
        help="Debian mirror (default $DEBIAN_MIRROR or %(default)s)",
    )
    parser.add_argument(
        "--security-mirror",
        default=os.environ.get("DEBIAN_SECURITY_MIRROR", DEFAULT_SECURITY),
        help="Debian security mirror (default $DEBIAN_SECURITY_MIRROR or %(default)s)",
    )
    parser.add_argument(
        "--refresh-base",
        action="store_true",
        help="make the Debian base layer anew (Debian's updates since the cached one)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    name = args.name or chart_image()
    repository, _, tag = name.rpartition(":")
    if not repository or "/" in tag:
        print(f"--name {name!r}: expected <repository>:<tag>", file=sys.stderr)
        return 2
    output = args.output or REPO_ROOT / DEFAULT_OUTPUT
    names = [name, *(f"{repository}:{extra}" for extra in args.also_tag)]
    try:
        build(
            output,
            names,
            cache=args.cache,
            mirror=args.mirror,
            security=args.security_mirror,
            refresh=args.refresh_base,
        )
    except (BuildError, subprocess.TimeoutExpired) as exc:
        print(f"make image: {exc}", file=sys.stderr)
        return 1
    print(f"{output}: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
