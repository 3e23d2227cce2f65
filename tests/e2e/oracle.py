"""The oracle cases: requests a real kube-apiserver refuses (or prunes), and how its answers are
recorded under ``tests/data/apiserver-oracle/`` (one JSON file per case, naming the Kubernetes
version that answered). ``tests/e2e/test_oracle.py`` sends them to a real API server; the same
cases and files can be replayed against the embedded one (sharegpuctl.local.apiserver).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from tests.paths import DATA_DIR

ORACLE_DIR: Final = DATA_DIR / "apiserver-oracle"
#: Metadata that differs from run to run and is left out of a recorded object.
VOLATILE_METADATA: Final = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "managedFields",
    "generation",
)


@dataclasses.dataclass(frozen=True)
class OracleCase:
    """One request: what it sends and, for a PATCH, the object stored before (``setup``)."""

    name: str
    description: str
    method: str
    path: str
    body: Any
    content_type: str = "application/json"
    setup: dict[str, Any] | None = None

    def record(self, version: str, code: int, answer: Any) -> dict[str, Any]:
        """The JSON document kept for this case."""
        return {
            "case": self.name,
            "description": self.description,
            "kubernetesVersion": version,
            "request": {
                "method": self.method,
                "path": self.path,
                "contentType": self.content_type,
                "body": self.body,
                **({"storedBefore": self.setup} if self.setup is not None else {}),
            },
            "response": {"code": code, "body": answer},
        }


def normalized(body: Any) -> Any:
    """``body`` without what changes between runs: an object's uid, resourceVersion, timestamps
    and managed fields, and the order of a Status's causes (the API server validates a schema's
    properties in map order, so two errors come in either order; causes are sorted by field, and
    the message's ``[...]`` list is rebuilt in that order when it lists exactly those causes)."""
    if not isinstance(body, dict):
        return body
    if isinstance(body.get("metadata"), dict):
        meta = {k: v for k, v in body["metadata"].items() if k not in VOLATILE_METADATA}
        body = {**body, "metadata": meta}
    causes = (body.get("details") or {}).get("causes") if body.get("kind") == "Status" else None
    if isinstance(causes, list) and len(causes) > 1 and all(isinstance(c, dict) for c in causes):
        ordered = sorted(causes, key=lambda c: (str(c.get("field")), str(c.get("message"))))
        body = {**body, "details": {**body["details"], "causes": ordered}}
        message = body.get("message")
        parts = [f"{c.get('field')}: {c.get('message')}" for c in causes]
        listed = f"[{', '.join(parts)}]"
        if isinstance(message, str) and message.endswith(listed):
            rebuilt = ", ".join(f"{c.get('field')}: {c.get('message')}" for c in ordered)
            body["message"] = f"{message[: -len(listed)]}[{rebuilt}]"
    return body


CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
QUOTAS = "/apis/resource.sharegpu.dev/v1alpha1/namespaces/default/gpuquotas"
GPUS = "/apis/resource.sharegpu.dev/v1alpha1/gpus"
PODS = "/api/v1/namespaces/default/pods"


def _claim(name: str, requests: dict[str, str], **extra: Any) -> dict[str, Any]:
    """A claim of one request; ``extra`` fields go into the request's ``exactly``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.sharegpu.dev",
                            "capacity": {"requests": requests},
                            **extra,
                        },
                    }
                ]
            }
        },
    }


def _quota(name: str, hard: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.sharegpu.dev/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"hard": hard, **extra},
    }


CASES = (
    OracleCase(
        "claim-memory-10GB",
        "a claim asking memory '10GB' (no such quantity suffix)",
        "POST",
        CLAIMS,
        _claim("memory-10gb", {"cores": "30", "memory": "10GB"}),
    ),
    OracleCase(
        "claim-cores-percent",
        "a claim asking cores '30%' (no quantity)",
        "POST",
        CLAIMS,
        _claim("cores-percent", {"cores": "30%", "memory": "4Gi"}),
    ),
    OracleCase(
        "gpuquota-negative-cores",
        "a GpuQuota with cores -5 (the CRD schema's minimum is 0)",
        "POST",
        QUOTAS,
        _quota("negative", {"cores": -5, "memory": "40Gi"}),
    ),
    OracleCase(
        "gpuquota-patched-cores-and-memory",
        "a merge patch of a stored GpuQuota to cores -5 and memory 'lots'",
        "PATCH",
        QUOTAS + "/patched",
        {"spec": {"hard": {"cores": -5, "memory": "lots"}}},
        content_type="application/merge-patch+json",
        setup=_quota("patched", {"cores": 100, "memory": "40Gi"}),
    ),
    OracleCase(
        "gpuquota-memory-not-a-quantity",
        "a GpuQuota with memory 'lots' (the CRD schema types it int-or-string only)",
        "POST",
        QUOTAS,
        _quota("memory-lots", {"cores": 100, "memory": "lots"}),
    ),
    OracleCase(
        "gpuquota-unknown-field-strict",
        "a GpuQuota with an unknown field, strict field validation",
        "POST",
        QUOTAS + "?fieldValidation=Strict",
        _quota("unknown-strict", {"cores": 100}, colour="blue"),
    ),
    OracleCase(
        "gpuquota-field-validation-unknown-value",
        "a GpuQuota created with fieldValidation=Bogus (no such directive)",
        "POST",
        QUOTAS + "?fieldValidation=Bogus",
        _quota("bogus-validation", {"cores": 100}),
    ),
    OracleCase(
        "gpuquota-unknown-field-pruned",
        "a GpuQuota with an unknown field, default field validation (pruned)",
        "POST",
        QUOTAS,
        _quota("unknown-pruned", {"cores": 100}, colour="blue"),
    ),
    OracleCase(
        "pod-unknown-field-strict",
        "a Pod with an unknown field, strict field validation (the decoder refuses it)",
        "POST",
        PODS + "?fieldValidation=Strict",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "unknown-strict", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "bogusField": 1},
        },
    ),
    OracleCase(
        "claim-unknown-field-strict",
        "a ResourceClaim with an unknown field in a request, strict field validation",
        "POST",
        CLAIMS + "?fieldValidation=Strict",
        _claim("unknown-strict", {"cores": "30", "memory": "4Gi"}, colour="blue"),
    ),
    OracleCase(
        "gpu-negative-index",
        "a GPU object with spec.index -1 (the CRD schema's minimum is 0)",
        "POST",
        GPUS,
        {
            "apiVersion": "resource.sharegpu.dev/v1alpha1",
            "kind": "GPU",
            "metadata": {"name": "oracle-gpu"},
            "spec": {"node": "n", "index": -1},
        },
    ),
)
