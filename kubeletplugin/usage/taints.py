"""The optional device taint of a GPU with an overcommitted share (``--usage-taint``).

Key ``<driver>/overcommitted`` (:func:`api.names.overcommitted_taint_key`), effect NoSchedule
(new claims stay away; running pods are never evicted), value the resources exceeded
(``memory``, ``compute`` or ``memory.compute``), ``timeAdded`` when the GPU became
overcommitted, so the taint stays byte-identical while it lasts. It is put on the GPU's whole
device name (``gpu-<index>``), which the slice publisher applies to every device of the GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from api import names
from kubeletplugin.model import GpuInfo
from kubeletplugin.usage.model import ShareUsage


def rfc3339(timestamp: float) -> str:
    """Unix seconds as RFC 3339 in UTC with second precision."""
    return datetime.fromtimestamp(int(timestamp), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class OvercommitTaints:
    """Keeps when each GPU became overcommitted and renders the taint map."""

    def __init__(self, driver_name: str, gpus: Sequence[GpuInfo]) -> None:
        self._driver = driver_name
        self._index = {g.uuid: g.index for g in gpus}
        self._since: dict[str, float] = {}

    def taints(self, usage: Iterable[ShareUsage], now: float) -> dict[str, list[dict[str, Any]]]:
        """Device name -> taints for the GPUs with an overcommitted share now."""
        over: dict[str, set[str]] = {}
        for u in usage:
            if u.overcommitted and u.share.gpu_uuid in self._index:
                over.setdefault(u.share.gpu_uuid, set()).update(u.overcommitted)
        self._since = {gpu: self._since.get(gpu, now) for gpu in over}
        return {
            names.device_name(self._index[gpu]): [self._taint(what, self._since[gpu])]
            for gpu, what in sorted(over.items())
        }

    def _taint(self, what: set[str], since: float) -> dict[str, Any]:
        return {
            "key": names.overcommitted_taint_key(self._driver),
            "value": ".".join(r for r in names.OVERCOMMIT_RESOURCES if r in what),
            "effect": "NoSchedule",
            "timeAdded": rfc3339(since),
        }
