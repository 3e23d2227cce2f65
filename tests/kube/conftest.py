"""Fixtures of the Kubernetes client tests: the embedded API server with the leader election
tests' namespace."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sharegpuctl.local.apiserver import KubeAPIServer
from tests.helpers import create_namespaces


@pytest.fixture
def apiserver() -> Iterator[KubeAPIServer]:
    """A started in-process API server with the ``sharegpu`` namespace, stopped after the test."""
    with KubeAPIServer() as server:
        create_namespaces(server, "sharegpu")
        yield server
