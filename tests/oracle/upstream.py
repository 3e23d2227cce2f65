"""Building and running the Go oracle under ``upstream/``.

The binary is built from the pinned module into a cache outside the checkout,
``${XDG_CACHE_HOME:-~/.cache}/sharegpu-oracle/<hash of go.mod, go.sum, main.go>/dra-oracle``,
with its Go module and build caches beside it, so a second run reuses it. One build at a time
(a file lock); a build that cannot happen (no Go toolchain, modules neither cached nor
downloadable) is reported as a reason, and the tests skip naming it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, Final

from api.upstream import UPSTREAM, staging
from tests.paths import REPO_ROOT

SOURCE_DIR: Final = REPO_ROOT / "tests" / "oracle" / "upstream"
SOURCES: Final = ("go.mod", "go.sum", "main.go")
#: The module whose answers the oracle gives (read from go.mod, for the recorded cases).
ALLOCATOR_MODULE: Final = "k8s.io/dynamic-resource-allocation"
BUILD_TIMEOUT_S: Final = 1200


class OracleUnavailable(Exception):
    """The oracle cannot be built or run here; the message names what is missing."""


def required(module: str, gomod: Path = SOURCE_DIR / "go.mod") -> str | None:
    """The version ``gomod`` requires of ``module`` (direct or indirect); None when it does
    not."""
    for line in gomod.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["require"]:
            parts = parts[1:]
        if parts[:1] == [module] and len(parts) >= 2:
            return parts[1]
    return None


def pinned_version() -> str:
    """The version of :data:`ALLOCATOR_MODULE` of ``api/upstream.toml``'s Kubernetes release,
    e.g. ``v0.37.2``; :class:`ValueError` when go.mod requires another (or none), so that the
    oracle never answers for a release other than the one the project names."""
    wanted = staging(UPSTREAM.kubernetes)
    found = required(ALLOCATOR_MODULE)
    if found != wanted:
        raise ValueError(
            f"{SOURCE_DIR / 'go.mod'}: requires {ALLOCATOR_MODULE} {found}, not {wanted} "
            f"(api/upstream.toml: kubernetes = {UPSTREAM.kubernetes})"
        )
    return wanted


def cache_root() -> Path:
    """The user's cache directory for the oracle."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sharegpu-oracle"


def binary_path() -> Path:
    """Where the binary of the current sources is (or will be) built."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((SOURCE_DIR / name).read_bytes())
    return cache_root() / f"{pinned_version()}-{digest.hexdigest()[:12]}" / "dra-oracle"


def _go_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GOMODCACHE=str(root / "gomod"),
        GOCACHE=str(root / "gocache"),
        GOFLAGS="-mod=readonly -trimpath -buildvcs=false",
        GOTOOLCHAIN="local",
        CGO_ENABLED="0",
    )
    env.setdefault("GOPROXY", "https://proxy.golang.org,direct")
    return env


@cache
def ensure_built() -> Path:
    """The oracle binary, built first when absent; :class:`OracleUnavailable` naming what is
    missing when it cannot be built."""
    binary = binary_path()
    if os.access(binary, os.X_OK):
        return binary
    go = shutil.which("go")
    if go is None:
        raise OracleUnavailable("no Go toolchain on PATH (go builds the upstream oracle)")
    binary.parent.mkdir(parents=True, exist_ok=True)
    env = _go_env(cache_root())
    with open(binary.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(binary, os.X_OK):
            return binary
        download = subprocess.run(
            [go, "mod", "download"],
            cwd=SOURCE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        if download.returncode != 0:
            last = (download.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise OracleUnavailable(
                f"the Go module cache lacks {ALLOCATOR_MODULE} {pinned_version()} and its "
                f"dependencies, and go mod download failed: {last}"
            )
        partial = binary.with_name("dra-oracle.partial")
        build = subprocess.run(
            [go, "build", "-o", str(partial), "."],
            cwd=SOURCE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        if build.returncode != 0:
            raise RuntimeError(f"building the oracle failed:\n{build.stderr}")
        partial.replace(binary)
    return binary


def ask(cases: Sequence[dict[str, Any]], timeout_s: float = 600) -> list[dict[str, Any]]:
    """Upstream's answer to each case (same order), from one run of the oracle."""
    binary = ensure_built()
    stdin = "".join(json.dumps(c, separators=(",", ":")) + "\n" for c in cases)
    proc = subprocess.run(
        [str(binary)], input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the oracle failed (exit {proc.returncode}): {proc.stderr.strip()}")
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    if len(answers) != len(cases):
        raise RuntimeError(f"the oracle answered {len(answers)} of {len(cases)} cases")
    return answers


def main() -> int:
    """Build the oracle, or say why it cannot be built here (exit 0: the tests then skip)."""
    try:
        print(ensure_built())
    except OracleUnavailable as exc:
        print(f"differential oracle skipped: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
