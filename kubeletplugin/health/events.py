"""Health events reported by a checker, and the rule that turns an event into a fault reason.

The rules live here only: an XID in the ignore list (application-caused errors by default) is
not a fault; every other XID, a double-bit ECC error and a lost GPU are. A fault *needs a GPU
reset* (:func:`needs_reset`) when NVIDIA's XID catalogue says the GPU must be reset (or the node
rebooted) to recover: the XIDs of :data:`RESET_REQUIRED_XIDS`, a double-bit ECC error (XID 48),
a lost GPU (XID 79), and a pending row remap or page retirement reported by a checker
(:attr:`EventKind.RESET_REQUIRED`). The reason of such a fault starts with
:data:`RESET_REQUIRED_PREFIX`, which survives the cut to a taint value, so a restarted plugin
recognises it in the published taint.
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
    154: "GPU recovery action changed",
}

#: XIDs after which the GPU needs a reset (or a node reboot) before it can be trusted again
#: (NVIDIA's XID catalogue, "resolution: reset GPU"): 48 double-bit ECC, 63/64 row remapping or
#: page retirement (pending until reset), 74 NVLink, 79 fallen off the bus, 94/95 contained and
#: uncontained ECC, 119/120 GSP, 154 recovery action changed (the driver asks for a reset).
RESET_REQUIRED_XIDS: Final = frozenset({48, 63, 64, 74, 79, 94, 95, 119, 120, 154})

#: Start of the reason of every fault that needs a GPU reset (and of its taint value).
RESET_REQUIRED_PREFIX: Final = "reset required"


class EventKind(enum.Enum):
    """What a checker observed."""

    #: A critical XID error; ``HealthEvent.xid`` holds its number.
    XID = "xid"
    #: A double-bit (uncorrectable) ECC error.
    DOUBLE_BIT_ECC = "double-bit-ecc"
    #: The GPU is unreachable (fell off the bus, lost).
    GPU_LOST = "gpu-lost"
    #: A condition that only a GPU reset clears (pending row remap, pending page retirement);
    #: ``HealthEvent.detail`` names it.
    RESET_REQUIRED = "reset-required"
    #: Any other fault with a ready-made reason (``HealthEvent.detail``).
    FAULT = "fault"


@dataclass(frozen=True)
class HealthEvent:
    """One observation. ``uuid`` None means the event could not be tied to a GPU: all GPUs.

    ``gpu_instance``/``compute_instance``: the MIG instance NVML names in the event, if any
    (``compute_instance`` is None when the event names a GPU instance only). Such a fault is the
    fault of that instance's device only (:mod:`kubeletplugin.health.instances` finds it); the
    instance is also named in the reason, so the taint says where it happened.
    """

    uuid: str | None
    kind: EventKind
    xid: int | None = None
    detail: str = ""
    gpu_instance: int | None = None
    compute_instance: int | None = None


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


def needs_reset(event: HealthEvent) -> bool:
    """True when the fault of ``event`` is cleared only by a GPU reset (see the module doc)."""
    if event.kind is EventKind.XID:
        return event.xid in RESET_REQUIRED_XIDS
    return event.kind in (EventKind.DOUBLE_BIT_ECC, EventKind.GPU_LOST, EventKind.RESET_REQUIRED)


def is_reset_reason(reason: str) -> bool:
    """True for the reason of a reset-required fault, also as a taint value
    (``reset-required-XID-79-...``)."""
    return reason.replace("-", " ").startswith(RESET_REQUIRED_PREFIX)


def _base_reason(event: HealthEvent) -> str:
    if event.kind is EventKind.XID:
        return xid_reason(event.xid) if event.xid is not None else "XID error (number unknown)"
    if event.kind is EventKind.DOUBLE_BIT_ECC:
        return "double-bit ECC error"
    if event.kind is EventKind.GPU_LOST:
        return f"GPU lost: {event.detail}" if event.detail else "GPU lost"
    return event.detail or "fault"


def _instance_suffix(event: HealthEvent) -> str:
    """`` on MIG GI 9 CI 0`` (GPU and compute instance) when the event names a MIG instance;
    short, so it survives the cut of the reason to a taint value."""
    if event.gpu_instance is None:
        return ""
    where = f" on MIG GI {event.gpu_instance}"
    if event.compute_instance is not None:
        where += f" CI {event.compute_instance}"
    return where


def event_reason(event: HealthEvent, ignored_xids: Iterable[int]) -> str | None:
    """The fault reason of ``event``, or None when it is not a fault (an ignored XID).
    Reasons of faults that need a reset start with :data:`RESET_REQUIRED_PREFIX`."""
    if event.kind is EventKind.XID and event.xid in frozenset(ignored_xids):
        return None
    reason = _base_reason(event) + _instance_suffix(event)
    return f"{RESET_REQUIRED_PREFIX}: {reason}" if needs_reset(event) else reason
