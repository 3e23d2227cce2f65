"""The optional device taints of the usage stage, each off by default.

- ``--usage-taint``: key ``<driver>/overcommitted`` (:func:`api.names.overcommitted_taint_key`)
  on a GPU with an overcommitted share, value the resources exceeded (``memory``, ``compute``
  or ``memory.compute``).
- ``--usage-escape-taint``: key ``<driver>/mps-escape`` (:func:`api.names.mps_escape_taint_key`)
  on a GPU where a compute process runs outside MPS, no value.

Both have effect NoSchedule (new claims stay away; running pods are never evicted) and
``timeAdded`` when the GPU got the taint, so a taint stays byte-identical while it lasts. They
are put on the GPU's whole device name (``gpu-<index>``), which the slice publisher applies to
every device of the GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from api import names
from kubeletplugin.model import GpuInfo
from kubeletplugin.usage.model import Escape, ShareMeasurement
from sharegpu.kube.clock import rfc3339


class _GpuTaint:
    """One taint key: keeps when each GPU got it and renders the taint map."""

    def __init__(self, key: str, gpus: Sequence[GpuInfo]) -> None:
        self._key = key
        self._index = {g.uuid: g.index for g in gpus}
        self._since: dict[str, float] = {}

    def render(self, values: Mapping[str, str], now: float) -> dict[str, list[dict[str, Any]]]:
        """Device name -> [taint] for the GPUs in ``values`` (GPU UUID -> taint value, "" for
        none); GPUs of another node are ignored."""
        tainted = {gpu: v for gpu, v in values.items() if gpu in self._index}
        self._since = {gpu: self._since.get(gpu, now) for gpu in tainted}
        out: dict[str, list[dict[str, Any]]] = {}
        for gpu, value in sorted(tainted.items()):
            taint: dict[str, Any] = {"key": self._key}
            if value:
                taint["value"] = value
            taint.update(effect="NoSchedule", timeAdded=rfc3339(self._since[gpu]))
            out[names.device_name(self._index[gpu])] = [taint]
        return out


class OvercommitTaints:
    """The ``<driver>/overcommitted`` taints."""

    def __init__(self, driver_name: str, gpus: Sequence[GpuInfo]) -> None:
        self._taint = _GpuTaint(names.overcommitted_taint_key(driver_name), gpus)

    def taints(
        self, usage: Iterable[ShareMeasurement], now: float
    ) -> dict[str, list[dict[str, Any]]]:
        """Device name -> taints for the GPUs with an overcommitted share now."""
        over: dict[str, set[str]] = {}
        for u in usage:
            if u.overcommitted:
                over.setdefault(u.share.gpu_uuid, set()).update(u.overcommitted)
        values = {
            gpu: ".".join(r for r in names.OVERCOMMIT_RESOURCES if r in what)
            for gpu, what in over.items()
        }
        return self._taint.render(values, now)


class EscapeTaints:
    """The ``<driver>/mps-escape`` taints."""

    def __init__(self, driver_name: str, gpus: Sequence[GpuInfo]) -> None:
        self._taint = _GpuTaint(names.mps_escape_taint_key(driver_name), gpus)

    def taints(self, escapes: Iterable[Escape], now: float) -> dict[str, list[dict[str, Any]]]:
        """Device name -> taints for the GPUs where a process runs outside MPS now."""
        return self._taint.render({e.gpu_uuid: "" for e in escapes}, now)
