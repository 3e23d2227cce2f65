"""Builders of admission objects and an HTTPS client of the admission webhook."""

from __future__ import annotations

import http.client
import json
import ssl
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme

from api.names import DEFAULT_DRIVER_NAME as DRIVER
from controller.webhook import CertificateReloader, WebhookServer
from sharegpu.kube.telemetry import Telemetry


class Endpoint:
    def __init__(self, server: WebhookServer, ca: trustme.CA, telemetry: Telemetry) -> None:
        self.server = server
        self.telemetry = telemetry
        self.context = ssl.create_default_context()
        ca.configure_trust(self.context)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPSConnection(
            "localhost", self.server.port, context=self.context, timeout=30
        )
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if data else {}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            ctype = resp.getheader("Content-Type") or ""
            return resp.status, json.loads(raw) if "json" in ctype else raw.decode()
        finally:
            conn.close()

    def call_raw(self, path: str, data: bytes) -> tuple[int, Any]:
        """POST ``data`` as it is (for bodies no Python object can be dumped to)."""
        conn = http.client.HTTPSConnection(
            "localhost", self.server.port, context=self.context, timeout=30
        )
        try:
            conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def review(self, obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
        resource = {
            "ResourceClaim": "resourceclaims",
            "ResourceClaimTemplate": "resourceclaimtemplates",
            "DeviceClass": "deviceclasses",
        }[obj["kind"]]
        group, version = obj["apiVersion"].split("/")
        body: dict[str, Any] = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": group, "version": version, "kind": obj["kind"]},
                "resource": {"group": group, "version": version, "resource": resource},
                "operation": operation,
                "namespace": obj["metadata"].get("namespace"),
                "name": obj["metadata"]["name"],
                "object": obj if operation != "DELETE" else None,
                "oldObject": obj if operation == "DELETE" else None,
            },
        }
        status, answer = self.call("POST", f"/validate/{resource}", body)
        assert status == 200, answer
        assert answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == body["request"]["uid"]
        return dict(answer["response"])


def issue_certificate(ca: trustme.CA, tmp: Path) -> tuple[str, str]:
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp / "tls.crt"))
    cert.private_key_pem.write_to_path(str(tmp / "tls.key"))
    return str(tmp / "tls.crt"), str(tmp / "tls.key")


def claim(
    *requests: dict[str, Any], config: list[Any] | None = None, version: str = "v1"
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if config is not None:
        devices["config"] = config
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": devices},
    }


def exactly(
    capacity: dict[str, str] | None = None, selectors: Sequence[str] = (), cls: str = DRIVER
) -> dict[str, Any]:
    ex: dict[str, Any] = {"deviceClassName": cls}
    if capacity is not None:
        ex["capacity"] = {"requests": capacity}
    if selectors:
        ex["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": "gpu", "exactly": ex}


def gpu_config(params: dict[str, Any]) -> list[Any]:
    return [
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "resource.sharegpu.dev/v1alpha1",
                    "kind": "GpuConfig",
                    **params,
                },
            }
        }
    ]


def template(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"spec": spec},
    }


def device_class(selectors: list[str], config: list[Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in selectors]}
    if config is not None:
        spec["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": spec,
    }


@dataclass(frozen=True)
class WebhookTls:
    """A webhook's serving certificate (of ``serving_ca``, for ``localhost`` and 127.0.0.1) and
    the client CA it trusts as the API server's, as files under a directory, and their reloader."""

    serving_ca: trustme.CA
    client_ca: trustme.CA
    certs: CertificateReloader


def webhook_tls(directory: Path) -> WebhookTls:
    """New serving and client CAs, the leaf and CA files written under ``directory``."""
    serving_ca, client_ca = trustme.CA(), trustme.CA()
    leaf = serving_ca.issue_cert("localhost", "127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(directory / "tls.key"))
    client_ca.cert_pem.write_to_path(str(directory / "client-ca.crt"))
    certs = CertificateReloader(
        str(directory / "tls.crt"),
        str(directory / "tls.key"),
        0.0,
        client_ca_file=str(directory / "client-ca.crt"),
    )
    return WebhookTls(serving_ca, client_ca, certs)


def post_claim_review(
    port: int, context: ssl.SSLContext, body: Any, timeout: float
) -> dict[str, Any]:
    """POST the AdmissionReview ``body`` to the webhook on 127.0.0.1's ``port`` (as
    ``localhost``) with ``context``; the review's ``response`` (the answer must be a 200)."""
    conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=timeout)
    try:
        conn.request("POST", "/validate/resourceclaims", body=json.dumps(body).encode())
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        assert resp.status == 200, answer
        response: dict[str, Any] = answer["response"]
        return response
    finally:
        conn.close()
