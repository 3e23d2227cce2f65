"""Shared fixtures: an in-process Kubernetes API server and a client for it."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client
import pytest
from hypothesis import settings

from sharegpu.kube.rest import KubeRest
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.deploy.helpers import helm_binary
from tests.gpu.conftest import add_gpu_options

# Property tests draw the same examples on every run (seeded from each test), so a run on a
# busy CI machine is repeatable; explicit @example cases pin the regressions found so far.
settings.register_profile("deterministic", derandomize=True, deadline=None)
settings.load_profile("deterministic")


@pytest.fixture
def apiserver() -> Iterator[KubeAPIServer]:
    """A started in-process API server on 127.0.0.1 (random port), stopped after the test."""
    with KubeAPIServer() as server:
        yield server


@pytest.fixture
def kube_client(apiserver: KubeAPIServer) -> Iterator[kubernetes.client.ApiClient]:
    """An ApiClient configured for :func:`apiserver`, closed after the test."""
    client = apiserver.client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def kube(apiserver: KubeAPIServer) -> Iterator[KubeRest]:
    """A :class:`KubeRest` client for :func:`apiserver`, its ApiClient closed after the test."""
    client = apiserver.client()
    try:
        yield KubeRest(client)
    finally:
        client.close()


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm binary (``make test`` installs it); without one the test is skipped, naming
    what is missing and how to get it."""
    path = helm_binary()
    if path is None:
        pytest.skip(
            "helm not found (neither .venv/bin/helm nor helm on PATH): "
            "run `bash tests/install-helm.sh` (make test does)"
        )
    return path


def pytest_addoption(parser: pytest.Parser) -> None:
    add_gpu_options(parser)
