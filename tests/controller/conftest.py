"""Fixtures of the controller tests: a started admission webhook and its HTTPS client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from api.names import DEFAULT_DRIVER_NAME as DRIVER
from controller.metrics import ControllerMetrics
from controller.webhook import AdmissionHandler, CertificateReloader, WebhookServer
from sharegpu.kube.telemetry import Telemetry
from tests.controller.webhook_helpers import Endpoint, issue_certificate


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
