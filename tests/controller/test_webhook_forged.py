"""Forged AdmissionReviews against the real webhook over HTTPS and the embedded API server: only
a review whose client certificate the configured client CA verified (the API server's, set in
its admission configuration) writes GpuQuota charges; any other client that reaches the port is
judged without changing quota state."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from controller.config import config_from_args
from controller.main import Controller, build_parser
from controller.quotaadmit import QuotaAdmitter, not_enforced_warning
from controller.quotacharge import ChargeBasis
from controller.webhook import AdmissionHandler, CertificateReloader, WebhookServer
from sharegpu.kube.rest import KubeRest
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.controller.quota_helpers import DRIVER, claim, create_quota, quota, read_quota, review
from tests.controller.webhook_helpers import post_claim_review, webhook_tls

BASIS = ChargeBasis(largest_memory=80 * 1024**3, largest_node_gpus=8)


@dataclass
class Webhook:
    server: WebhookServer
    serving_ca: trustme.CA
    client_ca: trustme.CA

    def context(self, client: trustme.LeafCert | None = None) -> ssl.SSLContext:
        """A client context trusting the serving certificate, presenting ``client``."""
        context = ssl.create_default_context()
        self.serving_ca.configure_trust(context)
        if client is not None:
            client.configure_cert(context)
        return context

    def post(self, body: Any, client: trustme.LeafCert | None = None) -> dict[str, Any]:
        return post_claim_review(self.server.port, self.context(client), body, 30)


def start(kube: KubeRest, tmp_path: Path, names: tuple[str, ...] = ()) -> Webhook:
    tls = webhook_tls(tmp_path)
    serving_ca, client_ca, certs = tls.serving_ca, tls.client_ca, tls.certs
    admission = AdmissionHandler(DRIVER, quota=QuotaAdmitter(kube, DRIVER, basis=lambda: BASIS))
    server = WebhookServer("127.0.0.1:0", admission, certs, client_names=names).start()
    return Webhook(server, serving_ca, client_ca)


@pytest.fixture
def webhook(kube: KubeRest, tmp_path: Path) -> Iterator[Webhook]:
    hook = start(kube, tmp_path)
    try:
        yield hook
    finally:
        hook.server.stop()


def charges(kube: KubeRest) -> dict[str, Any]:
    status = read_quota(kube, "q").get("status") or {}
    found: dict[str, Any] = status.get("claims") or {}
    return found


def test_a_review_without_a_client_certificate_charges_nothing(
    kube: KubeRest, webhook: Webhook
) -> None:
    """The attack: a client with no credentials posts a CREATE of 2 GPUs for the victim's
    namespace; it used to be charged and to deny the victim's real claim."""
    create_quota(kube, quota("q", {"devices": 2}))
    forged = review(claim("forged"))
    for i in range(5):
        forged["request"]["uid"] = f"forged-{i}"
        assert webhook.post(forged)["allowed"] is True  # judged: it fits
    assert charges(kube) == {}
    too_big = review(claim("too-big"))
    too_big["request"]["object"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 3
    denied = webhook.post(too_big)  # still judged against the quota
    assert not denied["allowed"] and "GpuQuota team-a/q" in denied["status"]["message"]
    assert charges(kube) == {}
    # The API server's reviews, with its client certificate, are charged.
    apiserver = webhook.client_ca.issue_cert("kube-apiserver")
    for name in ("a", "b"):
        assert webhook.post(review(claim(name)), apiserver)["allowed"] is True
    assert sorted(charges(kube)) == ["a", "b"]
    refused = webhook.post(review(claim("c")), apiserver)
    assert not refused["allowed"] and "devices: used 2" in refused["status"]["message"]


def test_a_certificate_of_another_ca_fails_the_handshake(kube: KubeRest, webhook: Webhook) -> None:
    create_quota(kube, quota("q", {"devices": 2}))
    stranger = trustme.CA().issue_cert("kube-apiserver")
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        webhook.post(review(claim("a")), stranger)
    assert charges(kube) == {}


def test_with_client_names_only_a_certificate_naming_one_charges(
    kube: KubeRest, tmp_path: Path
) -> None:
    create_quota(kube, quota("q", {"devices": 4}))
    hook = start(kube, tmp_path, names=("sharegpu-webhook-client",))
    try:
        other = hook.client_ca.issue_cert("someone-else")
        assert hook.post(review(claim("a")), other)["allowed"] is True
        assert charges(kube) == {}
        right = hook.client_ca.issue_cert("sharegpu-webhook-client")
        assert hook.post(review(claim("b")), right)["allowed"] is True
        assert sorted(charges(kube)) == ["b"]
    finally:
        hook.server.stop()


def test_without_a_client_ca_no_review_charges(kube: KubeRest, tmp_path: Path) -> None:
    create_quota(kube, quota("q", {"devices": 4}))
    ca = trustme.CA()
    leaf = ca.issue_cert("localhost")
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    admission = AdmissionHandler(DRIVER, quota=QuotaAdmitter(kube, DRIVER, basis=lambda: BASIS))
    server = WebhookServer(
        "127.0.0.1:0",
        admission,
        CertificateReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")),
    ).start()
    try:
        hook = Webhook(server, ca, trustme.CA())
        assert hook.post(review(claim("a")), ca.issue_cert("kube-apiserver"))["allowed"] is True
        assert charges(kube) == {}
    finally:
        server.stop()


def test_without_the_certificate_concurrent_claims_pass_with_a_warning_saying_so(
    kube: KubeRest, tmp_path: Path
) -> None:
    """Without the API server's client certificate no review charges, so six claims admitted at
    the same time all fit a quota of two (the controller charges them when they appear). The
    webhook says so on each of them, and the metric says quota admission is not enforced; with
    the certificate exactly two of six are admitted."""
    create_quota(kube, quota("q", {"devices": 2}))
    hook = start(kube, tmp_path)
    try:
        reviews = [review(claim(f"c{i}"), uid=f"u-{i}") for i in range(6)]
        with ThreadPoolExecutor(max_workers=6) as pool:
            unverified = list(pool.map(hook.post, reviews))
        assert all(r["allowed"] for r in unverified)
        assert all(r["warnings"] == [not_enforced_warning("team-a")] for r in unverified)
        assert charges(kube) == {}
        apiserver = hook.client_ca.issue_cert("kube-apiserver")
        with ThreadPoolExecutor(max_workers=6) as pool:
            verified = list(pool.map(lambda r: hook.post(r, apiserver), reviews))
        assert sum(r["allowed"] for r in verified) == 2
        assert all("warnings" not in r for r in verified)
        assert len(charges(kube)) == 2
    finally:
        hook.server.stop()


def test_the_controller_says_at_start_and_in_a_metric_whether_quotas_are_enforced(
    apiserver: KubeAPIServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a client CA: a warning at start and the metric 0. With one: the metric is 1
    until a claim is judged without the API server's certificate (the API server does not
    present it yet), and 1 again once one comes with it."""
    ca = trustme.CA()
    leaf = ca.issue_cert("localhost")
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "client-ca.crt"))
    base = [
        f"--kubeconfig={apiserver.write_kubeconfig(tmp_path / 'kubeconfig')}",
        "--webhook-address=127.0.0.1:0",
        f"--tls-cert-file={tmp_path / 'tls.crt'}",
        f"--tls-key-file={tmp_path / 'tls.key'}",
        "--metrics-address=",
        "--api-address=",
    ]
    with_ca = [f"--webhook-client-ca-file={tmp_path}/client-ca.crt"]
    for extra, enforced in (([], 0.0), (with_ca, 1.0)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="controller.main"):
            controller = Controller(config_from_args(build_parser().parse_args(base + extra)))
            controller.start()
        try:
            text = controller.telemetry.scrape().decode()
            assert f"sharegpu_quota_admission_enforced {enforced}" in text
            assert controller.webhook is not None
            hook = Webhook(controller.webhook, ca, ca)
            hook.post(review(claim("unverified")))
            text = controller.telemetry.scrape().decode()
            assert "sharegpu_quota_admission_enforced 0.0" in text
            hook.post(review(claim("verified")), ca.issue_cert("kube-apiserver"))
            text = controller.telemetry.scrape().decode()
            assert f"sharegpu_quota_admission_enforced {enforced}" in text
        finally:
            controller.stop()
        loud = [r for r in caplog.records if "NOT enforced at admission" in r.getMessage()]
        assert len(loud) == (1 if enforced == 0.0 else 0)
