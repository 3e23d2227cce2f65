"""ResourceClaims the end-to-end steps create: a 30-core share of the driver's class, with or
without a GpuConfig."""

from __future__ import annotations

from typing import Any

#: The driver's DeviceClass and opaque-config driver name (the chart's defaults).
DRIVER = "gpu.sharegpu.dev"


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


def gpu_config(parameters: dict[str, Any]) -> list[Any]:
    """A ``spec.devices.config`` of one GpuConfig with ``parameters``."""
    return [
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "resource.sharegpu.dev/v1alpha1",
                    "kind": "GpuConfig",
                    **parameters,
                },
            }
        }
    ]
