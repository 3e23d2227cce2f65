"""Fixtures of the controller tests: the embedded API server with the namespaces the tests
write to, and a started admission webhook and its HTTPS client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from api.names import DEFAULT_DRIVER_NAME as DRIVER
from controller.metrics import ControllerMetrics
from controller.webhook import AdmissionHandler, CertificateReloader, WebhookServer
from sharegpu.kube.telemetry import Telemetry
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.controller.webhook_helpers import Endpoint, issue_certificate
from tests.helpers import create_namespaces

#: Where the controller tests' leases, quotas, claims and pods live.
NAMESPACES = ("sharegpu", "team-a", "team", "ml")


@pytest.fixture
def apiserver() -> Iterator[KubeAPIServer]:
    """A started in-process API server with :data:`NAMESPACES`, stopped after the test."""
    with KubeAPIServer() as server:
        create_namespaces(server, *NAMESPACES)
        yield server


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[Endpoint]:
    ca = trustme.CA()
    cert, key = issue_certificate(ca, tmp_path)
    telemetry = Telemetry("test-webhook")
    admission = AdmissionHandler(DRIVER, ControllerMetrics(telemetry))
    server = WebhookServer("127.0.0.1:0", admission, CertificateReloader(cert, key, 0.0)).start()
    try:
        yield Endpoint(server, ca, telemetry)
    finally:
        server.stop()
        telemetry.shutdown()
