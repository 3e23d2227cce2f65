"""The upstream binaries of the end-to-end run: where they are, whether they can be built here.

``tests/e2e/build-binaries.sh`` builds them from the Go modules pinned under
``tests/e2e/upstream/`` (at the releases ``api/upstream.toml`` names) into the user's cache
directory. ``python -m tests.e2e.binaries`` (run by
``make e2e``) builds them where the prerequisites hold and otherwise says which one is missing
and exits 0, so the tests then skip with the same reason.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Final

from api.upstream import UPSTREAM
from tests.paths import REPO_ROOT

E2E_DIR: Final = REPO_ROOT / "tests" / "e2e"
BUILD_SCRIPT: Final = E2E_DIR / "build-binaries.sh"
KUBERNETES_PINS: Final = E2E_DIR / "upstream" / "kubernetes" / "go.mod"

#: What the control-plane steps run, in build order (kube-apiserver, etcd and kubectl first:
#: every step needs them).
CONTROL_PLANE: Final = (
    "etcd",
    "kube-apiserver",
    "kubectl",
    "kube-controller-manager",
    "kube-scheduler",
)
#: What the real node runs (a kubelet, kube-proxy, and containerd with its shim and ctr).
NODE: Final = ("kubelet", "kube-proxy", "containerd")
#: Upstream's DRA test driver (k8s.io/kubernetes/test/e2e/dra/test-driver), the benchmarks' Go
#: peer, built alone into :func:`test_driver_dir`.
TEST_DRIVER: Final = "test-driver"


#: The environment variable that picks another pinned release (``make e2e K8S=1.36.3``).
VERSION_ENV: Final = "SHAREGPU_E2E_K8S"


def pinned_version(pins: Path) -> str:
    """The ``k8s.io/kubernetes`` version ``pins`` (a go.mod) requires, e.g. ``v1.37.2``."""
    match = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes (v\S+)", pins.read_text(), re.M)
    if match is None:
        raise ValueError(f"{pins}: no requirement on k8s.io/kubernetes")
    return match.group(1)


def kubernetes_version() -> str:
    """The version of the run: :data:`VERSION_ENV` where it names a pinned release (the build
    script refuses any other), else ``api/upstream.toml``'s ``kubernetes`` (``v1.37.2``)."""
    wanted = os.environ.get(VERSION_ENV, "").strip()
    return f"v{(wanted or UPSTREAM.kubernetes).removeprefix('v')}"


def kubernetes_minor() -> int:
    """The minor version of the run (37 for v1.37.2)."""
    return int(kubernetes_version().split(".")[1])


def missing_prerequisites() -> list[str]:
    """Why the end-to-end run cannot happen on this machine (empty when it can)."""
    missing = []
    if platform.system() != "Linux":
        missing.append(f"not Linux ({platform.system()})")
    elif os.geteuid() != 0:
        missing.append("not root")
    if shutil.which("go") is None:
        missing.append("no Go toolchain on PATH (go builds the upstream binaries)")
    if shutil.which("flock") is None:
        missing.append("no flock (util-linux) on PATH")
    return missing


@cache
def bin_dir() -> Path:
    """The cache directory the binaries of the current pins are built into."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-dir"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return Path(out.stdout.strip().splitlines()[-1])


@cache
def test_driver_dir() -> Path:
    """The cache directory of upstream's DRA test driver (``build-binaries.sh test-driver``): its
    own, keyed by its pins under ``tests/e2e/upstream/test-driver/``."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-dir", TEST_DRIVER],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def missing_binaries(names: tuple[str, ...] = CONTROL_PLANE) -> list[str]:
    """The binaries among ``names`` not built yet for the current pins."""
    return [n for n in names if not os.access(bin_dir() / n, os.X_OK)]


def main() -> int:
    """Build the control-plane and node binaries, or say why they cannot be built here
    (exit 0)."""
    missing = missing_prerequisites()
    if missing:
        print("e2e skipped: " + "; ".join(missing))
        return 0
    return subprocess.run(
        ["bash", str(BUILD_SCRIPT), *CONTROL_PLANE, *NODE], check=False
    ).returncode


if __name__ == "__main__":
    sys.exit(main())
