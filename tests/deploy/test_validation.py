"""The strict validation helper the chart and example tests rely on catches what it must."""

from __future__ import annotations

from typing import Any

from tests.deploy.helpers import CERT_MANAGER_GROUPS, OWN_GROUPS, validation_errors

CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "c"},
    "spec": {
        "devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.sharegpu.dev"}}]
        }
    },
}


def test_a_valid_claim_passes_for_both_versions() -> None:
    assert validation_errors(CLAIM, "1.34") == []
    assert validation_errors(CLAIM, "1.36") == []


def test_an_unknown_field_is_an_error() -> None:
    bad = {**CLAIM, "spec": {"devices": {"requests": [{"name": "gpu", "exactlyy": {}}]}}}
    (error,) = validation_errors(bad, "1.36")
    assert error.startswith("ResourceClaim/c: Kubernetes 1.36: spec/devices/requests/0")
    assert "exactlyy" in error


def test_a_kind_without_schema_fails_unless_allowed() -> None:
    gpu = {"apiVersion": "resource.sharegpu.dev/v1alpha1", "kind": "GPU", "metadata": {"name": "g"}}
    cert = {"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": {"name": "x"}}
    assert validation_errors(gpu, "1.36") == []
    assert validation_errors(cert, "1.36") == [
        "Certificate/x: no schema for cert-manager.io/v1 in Kubernetes 1.36"
    ]
    assert validation_errors(cert, "1.36", OWN_GROUPS | CERT_MANAGER_GROUPS) == []
    typo = {**CLAIM, "apiVersion": "resource.k8s.io/v2"}
    assert validation_errors(typo, "1.34") == [
        "ResourceClaim/c: no schema for resource.k8s.io/v2 in Kubernetes 1.34"
    ]
