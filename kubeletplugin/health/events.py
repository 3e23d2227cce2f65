"""Health events reported by a checker, and the rule that turns an event into a fault reason.

The rule lives here only: an XID in the ignore list (application-caused errors by default) is
not a fault; every other XID, a double-bit ECC error and a lost GPU are.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

#: XIDs caused by applications, not by the GPU (NVIDIA's XID catalogue): 13 graphics engine
#: exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup,
#: 68 NVDEC0 exception, 109 context switch timeout.
DEFAULT_IGNORED_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})

#: Short descriptions of frequent hardware XIDs, used in reasons.
XID_DESCRIPTIONS: Final = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping",
    64: "ECC page retirement or row remapper failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


class EventKind(enum.Enum):
    """What a checker observed."""

    #: A critical XID error; ``HealthEvent.xid`` holds its number.
    XID = "xid"
    #: A double-bit (uncorrectable) ECC error.
    DOUBLE_BIT_ECC = "double-bit-ecc"
    #: The GPU is unreachable (fell off the bus, lost).
    GPU_LOST = "gpu-lost"
    #: Any other fault with a ready-made reason (``HealthEvent.detail``).
    FAULT = "fault"


@dataclass(frozen=True)
class HealthEvent:
    """One observation. ``uuid`` None means the event could not be tied to a GPU: all GPUs."""

    uuid: str | None
    kind: EventKind
    xid: int | None = None
    detail: str = ""


def parse_xid_list(text: str) -> frozenset[int]:
    """``"13,31, 43"`` -> ``{13, 31, 43}``; an empty string is the empty set.

    Raises :class:`ValueError` naming the bad item.
    """
    result: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            value = int(item)
        except ValueError:
            raise ValueError(f"XID {item!r} is not an integer") from None
        if value < 0:
            raise ValueError(f"XID {value} is negative")
        result.add(value)
    return frozenset(result)


def xid_reason(xid: int) -> str:
    """``XID 79: GPU has fallen off the bus`` (the description when one is known)."""
    description = XID_DESCRIPTIONS.get(xid)
    return f"XID {xid}: {description}" if description else f"XID {xid}"


def event_reason(event: HealthEvent, ignored_xids: Iterable[int]) -> str | None:
    """The fault reason of ``event``, or None when it is not a fault (an ignored XID)."""
    if event.kind is EventKind.XID:
        if event.xid is None:
            return "XID error (number unknown)"
        if event.xid in frozenset(ignored_xids):
            return None
        return xid_reason(event.xid)
    if event.kind is EventKind.DOUBLE_BIT_ECC:
        return "double-bit ECC error"
    if event.kind is EventKind.GPU_LOST:
        return f"GPU lost: {event.detail}" if event.detail else "GPU lost"
    return event.detail or "fault"
