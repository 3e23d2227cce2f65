"""Fixtures of the kubelet-kit tests: private socket directories for a plugin server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kubeletplugin.kubelet.helpers import Dirs, socket_dirs


@pytest.fixture
def dirs() -> Iterator[Dirs]:
    """Fresh registration and plugin socket directories, removed after the test."""
    with socket_dirs() as d:
        yield d
