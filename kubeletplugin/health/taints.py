"""The device taint that marks an unhealthy GPU in the node's ResourceSlices.

Key ``<driver>/unhealthy`` (:func:`api.names.unhealthy_taint_key`), effect NoSchedule (or
NoExecute when configured), the reason squeezed into a label value (at most 63 characters of
``[A-Za-z0-9-_.]``, starting and ending alphanumeric), ``timeAdded`` = when the GPU turned
unhealthy, so the taint stays byte-identical while the fault lasts (no needless rewrites).
"""

from __future__ import annotations

import re
from typing import Any, Final

from api import names
from sharegpu.kube import slicerules
from sharegpu.kube.clock import rfc3339

TAINT_EFFECTS: Final = ("NoSchedule", "NoExecute")
DEFAULT_TAINT_EFFECT: Final = "NoSchedule"

_INVALID_RUN = re.compile(r"[^A-Za-z0-9_.-]+")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


def taint_value(reason: str) -> str:
    """``"XID 79: GPU has fallen off the bus"`` -> ``"XID-79-GPU-has-fallen-off-the-bus"``.

    The result is always a valid label value (possibly empty).
    """
    value = _INVALID_RUN.sub("-", reason)
    value = _EDGE.sub("", value)[: slicerules.MAX_LABEL_VALUE_LENGTH]
    return _EDGE.sub("", value)


def unhealthy_taint(driver_name: str, reason: str, since: float, effect: str) -> dict[str, Any]:
    """The taint of a device whose GPU has been unhealthy since ``since`` (Unix seconds)."""
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"taint effect {effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
    taint: dict[str, Any] = {"key": names.unhealthy_taint_key(driver_name), "effect": effect}
    value = taint_value(reason)
    if value:
        taint["value"] = value
    taint["timeAdded"] = rfc3339(since)
    return taint
