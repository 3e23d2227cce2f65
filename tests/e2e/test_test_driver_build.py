"""Upstream's DRA test driver is built from pins of its own into a cache directory of its own, so
adding or changing it never changes the cluster binaries' cache key."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from api.upstream import UPSTREAM, staging
from tests.e2e.binaries import BUILD_SCRIPT, E2E_DIR, KUBERNETES_PINS, VERSION_ENV, pinned_version

TEST_DRIVER_PINS = E2E_DIR / "upstream" / "test-driver" / "go.mod"


def _script(*args: str, cache: Path, version: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), VERSION_ENV: version}
    return subprocess.run(
        ["bash", str(BUILD_SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_the_test_driver_has_its_own_cache_directory(tmp_path: Path) -> None:
    cluster = Path(_script("--print-dir", cache=tmp_path).stdout.strip())
    out = _script("--print-dir", "test-driver", cache=tmp_path)
    assert out.returncode == 0, out.stderr
    driver = Path(out.stdout.strip())
    assert driver.parent.parent == cluster.parent.parent == tmp_path / "sharegpu-e2e"
    prefix = f"test-driver-{pinned_version(KUBERNETES_PINS)}-"
    assert driver.parent.name.startswith(prefix) and driver.name == "bin"
    assert driver != cluster and not driver.exists()  # --print-dir builds nothing


def test_the_test_driver_pins_the_cluster_release() -> None:
    """The same k8s.io/kubernetes version, and every staging module replaced by its published
    version exactly as for the cluster binaries."""
    assert pinned_version(TEST_DRIVER_PINS) == pinned_version(KUBERNETES_PINS)

    def replaces(pins: Path) -> set[str]:
        return {
            line.strip()
            for line in pins.read_text().splitlines()
            if line.strip().startswith("k8s.io/") and "=>" in line
        }

    assert replaces(TEST_DRIVER_PINS) <= replaces(KUBERNETES_PINS)
    drivers = "k8s.io/dynamic-resource-allocation"
    assert f"{drivers} => {drivers} {staging(UPSTREAM.kubernetes)}" in replaces(TEST_DRIVER_PINS)


def test_the_test_driver_is_built_alone_and_only_for_its_release(tmp_path: Path) -> None:
    out = _script("kube-scheduler", "test-driver", cache=tmp_path)
    assert out.returncode == 1
    assert "test-driver is built alone" in out.stderr
    release, previous = UPSTREAM.kubernetes_releases()
    out = _script("--print-dir", "test-driver", cache=tmp_path, version=previous)
    assert out.returncode == 1
    assert f"the test driver is pinned at v{release}, not v{previous}" in out.stderr
