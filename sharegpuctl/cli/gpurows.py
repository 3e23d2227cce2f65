"""Rows of the per-GPU table ``sharegpu status`` prints, from GPU objects (the columns ``kubectl
get gpus`` shows, plus the claims and pods)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from api.gpu import GpuObject

#: Column names, in order, of :func:`gpu_rows`.
COLUMNS: Final = ("NODE", "GPU", "MODEL", "HEALTH", "CORES", "MEMORY", "CLAIMS", "PODS")


def _as_json(obj: GpuObject | Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.manifest() if isinstance(obj, GpuObject) else obj


def gpu_rows(gpu_objects: Iterable[GpuObject | Mapping[str, Any]]) -> list[dict[str, str]]:
    """One row per GPU (keys: :data:`COLUMNS`), sorted by node and index.

    Accepts :class:`GpuObject` s or GPU objects as the API serves them (dicts). CORES and
    MEMORY read ``allocated/capacity``; CLAIMS lists ``namespace/name``; PODS lists
    ``pod(container,...)`` of every allocation.
    """
    rows: list[tuple[tuple[str, int], dict[str, str]]] = []
    for obj in gpu_objects:
        j = _as_json(obj)
        spec, status = j.get("spec") or {}, j.get("status") or {}
        allocations = status.get("allocations") or []
        claims = sorted({f"{a['claimNamespace']}/{a['claimName']}" for a in allocations})
        pods: list[str] = []
        for a in allocations:
            for p in a.get("pods") or []:
                label = p["name"] + (
                    f"({','.join(p['containers'])})" if p.get("containers") else ""
                )
                if label not in pods:
                    pods.append(label)
        health = str(status.get("health", "Unknown"))
        if status.get("healthReason"):
            health += f" ({status['healthReason']})"
        row = {
            "NODE": str(spec.get("node", "")),
            "GPU": str(spec.get("index", "")),
            "MODEL": str(spec.get("model", "")),
            "HEALTH": health,
            "CORES": str(status.get("coresSummary", "")),
            "MEMORY": str(status.get("memorySummary", "")),
            "CLAIMS": ",".join(claims) or "-",
            "PODS": ",".join(sorted(pods)) or "-",
        }
        rows.append(((row["NODE"], int(spec.get("index") or 0)), row))
    return [row for _, row in sorted(rows, key=lambda r: r[0])]
