"""ResourceClaims and pods the end-to-end steps create: a 30-core share of the driver's class,
with or without a GpuConfig, and busybox pods (the image imported into the node, never pulled)
that may use claims."""

from __future__ import annotations

from typing import Any

from tests.controller.webhook_helpers import DRIVER, gpu_config
from tests.e2e.kubelet import BUSYBOX_IMAGE

__all__ = ["busybox_pod", "gpu_config", "share_claim"]


def share_claim(name: str, namespace: str, config: list[Any] | None = None) -> dict[str, Any]:
    """A claim of 30 cores and 4Gi of one GPU, with ``config`` as its ``spec.devices.config``."""
    devices: dict[str, Any] = {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": DRIVER,
                    "capacity": {"requests": {"cores": "30", "memory": "4Gi"}},
                },
            }
        ]
    }
    if config is not None:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": devices},
    }


def busybox_pod(
    name: str,
    namespace: str,
    node: str,
    command: list[str],
    *,
    claims: dict[str, str] | None = None,
    run_as_user: int | None = None,
) -> dict[str, Any]:
    """A pod on ``node`` whose one container runs ``command`` from the busybox image; each
    ``claims`` entry (pod claim name -> ResourceClaim name) is used by the container."""
    container: dict[str, Any] = {
        "name": "c",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": command,
    }
    spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    if claims:
        spec["resourceClaims"] = [{"name": k, "resourceClaimName": v} for k, v in claims.items()]
        container["resources"] = {"claims": [{"name": k} for k in claims]}
    if run_as_user is not None:
        spec["securityContext"] = {"runAsUser": run_as_user}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
