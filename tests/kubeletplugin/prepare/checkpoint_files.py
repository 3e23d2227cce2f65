"""The checkpoint's file as tests see it: the document in use in the two-slot file, and the
older format a previous plugin wrote."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kubeletplugin.prepare.checkpoint import CHECKPOINT_FILE
from kubeletplugin.prepare.slotfile import scan


def read_document(data_dir: Path) -> dict[str, Any]:
    """The JSON document of the newest valid slot of ``<data_dir>/checkpoint.dat`` (its
    checksum unchecked: tests check it)."""
    fd = os.open(data_dir / CHECKPOINT_FILE, os.O_RDONLY | os.O_CLOEXEC)
    try:
        found = scan(fd)
    finally:
        os.close(fd)
    assert found.valid, f"no valid slot: {found.problems}"
    doc: dict[str, Any] = json.loads(found.valid[0].body)
    return doc


def as_format1(doc: dict[str, Any]) -> None:
    """Rewrite a format-2 document in place into format 1, as that plugin wrote it: no
    ``enforcement`` in the devices, the claim's ``sharing.grants`` instead (one per device
    without adminAccess, on the GPU enforced)."""
    doc["version"] = 1
    for claim in doc["claims"].values():
        grants = []
        for d in claim["devices"]:
            e = d.pop("enforcement", None)
            if e is None:
                continue
            grants.append(
                {
                    "gpu_uuid": d.get("migUUID") or d["gpuUUID"],
                    "device": d["device"],
                    "requests": d["requests"],
                    "strategy": e["strategy"],
                    "cores": d["cores"],
                    "memory": d["memory"],
                    "limit_cores": e["limitCores"],
                    "limit_memory": e["limitMemory"],
                    "interval": e.get("interval"),
                }
            )
        claim["sharing"] = {"grants": grants} if grants else {}
