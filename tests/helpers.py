"""Helpers every test folder shares."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from sharegpuctl.local.apiserver import KubeAPIServer

T = TypeVar("T")

#: The default wait for something that normally happens within a second or two.
PATIENCE_S = 30.0
#: The per-test timeout of a test whose work must be bounded (``pytest.mark.timeout``): a safety
#: net that ends a hang, never a check of speed (the work takes milliseconds; the defects such
#: tests guard against took minutes).
HANG_GUARD_S = 60.0


def eventually(
    condition: Callable[[], T],
    what: str | Callable[[], str] = "",
    *,
    timeout_s: float = PATIENCE_S,
    interval_s: float = 0.05,
) -> T:
    """Poll ``condition`` until it returns a truthy value, and return that value.

    Fails the test (AssertionError naming ``what``, or what it returns when it is a function
    such as a log tail) when ``timeout_s`` real seconds pass first.
    The condition is evaluated once more after the deadline, so a busy machine that stalled the
    poller never fails a condition that holds; exceptions it raises propagate.
    """
    end = time.monotonic() + timeout_s
    while True:
        past_deadline = time.monotonic() > end
        value = condition()
        if value:
            return value
        if past_deadline:
            named = what() if callable(what) else what
            raise AssertionError(f"not reached within {timeout_s:g}s: {named or condition}")
        time.sleep(interval_s)


def built_kubectl() -> str:
    """The real kubectl of the end-to-end binaries (``make e2e`` builds it); skips the test,
    naming what is missing, where it is not built."""
    import os
    import subprocess

    import pytest

    from tests.e2e.binaries import bin_dir

    try:
        path = bin_dir() / "kubectl"
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"kubectl: cannot locate the e2e binaries ({exc})")
    if not os.access(path, os.X_OK):
        pytest.skip(
            f"kubectl not built (no {path}); `make e2e` builds it (tests/e2e/build-binaries.sh)"
        )
    return str(path)


def create_namespaces(server: KubeAPIServer, *names: str) -> None:
    """Create ``names`` on ``server`` (like the real one, it refuses namespaced objects in a
    namespace that does not exist; ``default`` and the ``kube-*`` ones exist from the start)."""
    for name in names:
        server.store.create("namespaces", {"metadata": {"name": name}})
