"""The driver's admission webhook, called by the demo's API server in-process.

:func:`webhook_admission` turns the controller's :class:`~controller.webhook.AdmissionHandler`
(the same checks and GpuQuota charging the chart's webhook runs) into the API server's
admission hook: each create or update of a ResourceClaim, ResourceClaimTemplate or DeviceClass
is sent as an ``admission.k8s.io/v1`` AdmissionReview, as kube-apiserver sends it (with the
defaulted object, the operation and ``dryRun``); a denial is answered with the status the
webhook gave, worded as kube-apiserver words it (``admission webhook "<name>" denied the
request: ...``), and its warnings become ``Warning`` headers that kubectl prints.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

from api import names
from controller.webhook import AdmissionHandler
from sharegpuctl.local.apiserver.errors import ApiError
from sharegpuctl.local.apiserver.resources import ResourceType
from sharegpuctl.local.apiserver.server import Admission

#: The kinds the chart registers the webhook for.
REVIEWED: Final = frozenset({"ResourceClaim", "ResourceClaimTemplate", "DeviceClass"})


def webhook_admission(handler: AdmissionHandler, driver: str) -> Admission:
    """The API server's admission hook calling ``handler`` (see the module docstring)."""

    def reviews(rt: ResourceType) -> bool:
        return rt.group == names.RESOURCE_GROUP and rt.kind in REVIEWED

    def admit(operation: str, rt: ResourceType, obj: dict[str, Any], dry_run: bool) -> list[str]:
        md = obj.get("metadata") or {}
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
                "resource": {"group": rt.group, "version": rt.version, "resource": rt.plural},
                "name": md.get("name", ""),
                "namespace": md.get("namespace", ""),
                "operation": operation,
                "object": obj,
                "dryRun": dry_run,
                "userInfo": {"username": "kubectl"},
            },
        }
        response = handler.review(review, from_api_server=True)["response"]
        if not response.get("allowed"):
            status = response.get("status") or {}
            webhook = f"{rt.singular_name}.{driver}"
            raise ApiError(
                int(status.get("code") or 403),
                f'admission webhook "{webhook}" denied the request: {status.get("message", "")}',
                reason=status.get("reason") or None,
            )
        return [str(w) for w in response.get("warnings") or []]

    return Admission(reviews, admit)
