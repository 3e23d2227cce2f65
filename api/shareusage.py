"""The measured usage of one share: one value type and the one codec of its two wire shapes.

The node plugin measures a share and writes :func:`usage_data` into the ``data`` of the claim's
``status.devices[]`` entry (``apiVersion`` and ``kind`` :data:`api.names.SHARE_USAGE_KIND`
added); the controller reads it back with :func:`read_usage_data` and copies it into the
allocation's ``usage`` of the GPU object with :func:`usage_json`. Both shapes are what
:class:`api.gpu.ShareUsage` validates; the codecs here build and read plain dicts because the
tracker decodes every claim event and encodes every GPU status.

Invariants of :class:`MeasuredUsage`: amounts are bytes (``used_memory``, written as a canonical
quantity); ``sm_utilization`` is 0..100 or None where the GPU does not report it (never written
as zero); ``overcommitted`` holds names of :data:`api.names.OVERCOMMIT_RESOURCES` in that order;
``escaped_pods`` is sorted and at most :data:`MAX_ESCAPED_PODS` long.

Two readers: :func:`read_usage` refuses what the pydantic model refuses, and a quantity that is
not one, with a :class:`UsageError` naming the field path; :func:`read_usage_data` is the
tracker's tolerant reader of claims written by any plugin version (an entry whose required
fields are wrong reads as no measurement, an optional field that is wrong reads as absent).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Final, NamedTuple

from api.names import GROUP_VERSION, OVERCOMMIT_RESOURCES, SHARE_USAGE_KIND
from api.quantity import QuantityError, format_quantity, quantity_int

#: Most escaped pods one entry holds (a claim reserves at most 256 pods), and the longest UID
#: the tolerant reader keeps.
MAX_ESCAPED_PODS: Final = 256
MAX_UID: Final = 64
#: Longest ``sampledAt`` the tolerant reader keeps (an RFC 3339 time is 20 to 35 characters).
MAX_SAMPLED_AT: Final = 64

#: The JSON names of the fields, in the order they are written.
FIELDS: Final = (
    "usedMemory",
    "processes",
    "smUtilization",
    "sampledAt",
    "overcommitted",
    "processesOutsideMPS",
    "escapedPods",
)
#: Fields the claim's ``data`` adds.
DATA_HEADER: Final = ("apiVersion", "kind")


class MeasuredUsage(NamedTuple):
    """What one share's processes used at one sample (see the module docstring).

    A named tuple rather than a frozen dataclass: immutable and compact alike, and built three
    times faster, which the tracker does on every claim event."""

    used_memory: int
    sm_utilization: int | None
    processes: int
    sampled_at: str | None
    overcommitted: tuple[str, ...]
    #: MPS shares: the share's compute processes outside MPS (None: not judged).
    outside_mps: int | None = None
    #: MPS shares: UIDs of the share's pods that run them.
    escaped_pods: tuple[str, ...] = ()


class UsageError(ValueError):
    """Usage JSON that :class:`api.gpu.ShareUsage` refuses; ``path`` names the field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


def usage_json(u: MeasuredUsage) -> dict[str, Any]:
    """The allocation's ``usage`` in the GPU object (unset optional fields left out)."""
    out: dict[str, Any] = {"usedMemory": format_quantity(u.used_memory), "processes": u.processes}
    if u.sm_utilization is not None:
        out["smUtilization"] = u.sm_utilization
    if u.sampled_at is not None:
        out["sampledAt"] = u.sampled_at
    if u.overcommitted:
        out["overcommitted"] = list(u.overcommitted)
    if u.outside_mps is not None:
        out["processesOutsideMPS"] = u.outside_mps
    if u.escaped_pods:
        out["escapedPods"] = list(u.escaped_pods)
    return out


def usage_data(u: MeasuredUsage) -> dict[str, Any]:
    """The ``data`` of the share's entry in the claim's ``status.devices``."""
    return {"apiVersion": GROUP_VERSION, "kind": SHARE_USAGE_KIND, **usage_json(u)}


def _plain_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@lru_cache(maxsize=4096)
def _quantity_text(value: str | int) -> int | None:
    try:
        return quantity_int(value)
    except QuantityError:
        return None


def _quantity(value: Any) -> int | None:
    """Integer value of a quantity (None when absent or invalid); texts repeat, so cached."""
    if not isinstance(value, str | int) or isinstance(value, bool):
        return None
    return _quantity_text(value)


# --- the strict reader ------------------------------------------------------------------------


def _int_field(obj: Mapping[str, Any], key: str, path: str, high: int | None = None) -> int | None:
    if key not in obj or obj[key] is None:
        return None
    value = _plain_int(obj[key])
    if value is None:
        raise UsageError(f"{path}{key}", f"must be an integer, not {type(obj[key]).__name__}")
    if value < 0 or (high is not None and value > high):
        bound = f"0..{high}" if high is not None else ">= 0"
        raise UsageError(f"{path}{key}", f"must be {bound}, not {value}")
    return value


def _str_list(obj: Mapping[str, Any], key: str, path: str) -> list[str]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise UsageError(f"{path}{key}", f"must be a list, not {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise UsageError(f"{path}{key}[{i}]", f"must be a string, not {type(item).__name__}")
    return value


def read_usage(obj: Any, path: str = "") -> MeasuredUsage:
    """Decode an allocation's ``usage`` (or a claim's ``data``, whose ``apiVersion`` and
    ``kind`` must then be :data:`api.names.GROUP_VERSION` and ShareUsage); raises
    :class:`UsageError` with the path of the first wrong field (``path`` is its prefix, e.g.
    ``status.allocations[0].usage.``)."""
    if not isinstance(obj, Mapping):
        raise UsageError(path.rstrip(".") or "usage", "must be an object")
    for key in obj:
        if key not in FIELDS and key not in DATA_HEADER:
            raise UsageError(f"{path}{key}", f"unknown field (known: {', '.join(FIELDS)})")
    if "kind" in obj and obj["kind"] != SHARE_USAGE_KIND:
        raise UsageError(f"{path}kind", f"must be {SHARE_USAGE_KIND}")
    if "apiVersion" in obj and obj["apiVersion"] != GROUP_VERSION:
        raise UsageError(f"{path}apiVersion", f"must be {GROUP_VERSION}")
    if "usedMemory" not in obj:
        raise UsageError(f"{path}usedMemory", "required")
    raw = obj["usedMemory"]
    if not isinstance(raw, str):
        raise UsageError(f"{path}usedMemory", f"must be a string, not {type(raw).__name__}")
    used = _quantity(raw)
    if used is None or used < 0:
        raise UsageError(f"{path}usedMemory", f"must be a non-negative quantity, not {raw!r}")
    if "processes" not in obj:
        raise UsageError(f"{path}processes", "required")
    processes = _int_field(obj, "processes", path)
    if processes is None:
        raise UsageError(f"{path}processes", "must be an integer, not null")
    sm = _int_field(obj, "smUtilization", path, high=100)
    sampled = obj.get("sampledAt")
    if sampled is not None and not isinstance(sampled, str):
        raise UsageError(f"{path}sampledAt", f"must be a string, not {type(sampled).__name__}")
    over = _str_list(obj, "overcommitted", path)
    for i, name in enumerate(over):
        if name not in OVERCOMMIT_RESOURCES:
            allowed = ", ".join(OVERCOMMIT_RESOURCES)
            raise UsageError(f"{path}overcommitted[{i}]", f"must be one of {allowed}")
    outside = _int_field(obj, "processesOutsideMPS", path)
    pods = _str_list(obj, "escapedPods", path)
    if len(pods) > MAX_ESCAPED_PODS:
        raise UsageError(f"{path}escapedPods", f"at most {MAX_ESCAPED_PODS} items")
    return MeasuredUsage(
        used_memory=used,
        processes=processes,
        sm_utilization=sm,
        sampled_at=sampled,
        overcommitted=tuple(r for r in OVERCOMMIT_RESOURCES if r in over),
        outside_mps=outside,
        escaped_pods=tuple(sorted(set(pods))),
    )


# --- the tolerant reader ----------------------------------------------------------------------


def _escaped_pods(value: Any) -> tuple[str, ...]:
    """The ``escapedPods`` of an entry, bounded; malformed items dropped."""
    if not isinstance(value, list):
        return ()
    uids = {v for v in value[:MAX_ESCAPED_PODS] if isinstance(v, str) and 0 < len(v) <= MAX_UID}
    return tuple(sorted(uids))


def read_usage_data(data: Any) -> MeasuredUsage | None:
    """The usage in one claim ``status.devices[].data``, or None when it holds none (another
    kind, or a required field of the wrong type: an entry is taken whole or not at all); an
    optional field of the wrong type or out of range reads as absent, unknown overcommit names
    are dropped."""
    if (type(data) is not dict and not isinstance(data, Mapping)) or data.get(
        "kind"
    ) != SHARE_USAGE_KIND:
        return None
    used = _quantity(data.get("usedMemory"))
    processes = _plain_int(data.get("processes"))
    if used is None or used < 0 or processes is None or processes < 0:
        return None
    sm = _plain_int(data.get("smUtilization"))
    sampled = data.get("sampledAt")
    if not isinstance(sampled, str) or len(sampled) > MAX_SAMPLED_AT:
        sampled = None
    over = data.get("overcommitted")
    overcommitted: tuple[str, ...] = ()
    if over and isinstance(over, list) and all(isinstance(o, str) for o in over):
        overcommitted = tuple(r for r in OVERCOMMIT_RESOURCES if r in over)
    outside = _plain_int(data.get("processesOutsideMPS"))
    pods = data.get("escapedPods")
    return MeasuredUsage(
        used,
        sm if sm is not None and 0 <= sm <= 100 else None,
        processes,
        sampled,
        overcommitted,
        outside if outside is not None and outside >= 0 else None,
        _escaped_pods(pods) if pods else (),
    )
