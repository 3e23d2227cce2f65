"""Claims for the bench scripts: allocated as kube-scheduler writes them, one share on one GPU.

A module of bench/ (the scripts run as ``python bench/<name>.py``, so this directory is on the
path). ``api`` is imported when a claim is made, so a script may first point ``sys.path`` at
another source tree.
"""

from __future__ import annotations

import uuid
from typing import Any


def allocated_claim(
    name: str, driver: str, pool: str, device: str, cores: int, memory: int
) -> dict[str, Any]:
    """A ResourceClaim in ``default`` with a fresh UID, allocated one consumable-capacity share
    (a fresh share ID) of ``cores`` and ``memory`` bytes on ``pool``/``device``."""
    from api import names
    from api.quantity import format_quantity

    result = {
        "request": "gpu",
        "driver": driver,
        "pool": pool,
        "device": device,
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"cores": str(cores), "memory": format_quantity(memory)},
    }
    return {
        "apiVersion": names.RESOURCE_GROUP_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }
