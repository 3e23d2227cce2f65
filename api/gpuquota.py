"""The ``GpuQuota`` custom resource (``resource.sharegpu.dev/v1alpha1``): a per-namespace limit
on the GPU capacity that this driver's ResourceClaims may ask for.

Kubernetes' ResourceQuota counts DRA devices per DeviceClass; a GpuQuota counts *capacity*: the
``cores`` (percent of one GPU; a whole GPU counts 100), the ``memory`` and the number of devices
(whole GPUs, partitions or shares) of the claims in its namespace. Each limit in ``spec.hard``
is optional (an absent limit is no limit); ``spec.deviceClassNames`` restricts the quota to the
requests of those DeviceClasses (absent: every request of this driver).

The controller's admission webhook charges a claim on CREATE and the controller keeps
``status`` equal to the charges of the live claims (see ``docs/quota.md``).

Invariants of a status the controller writes:

- ``status.used`` is the sum of ``status.claims[*]`` (cores, memory bytes, devices);
- ``status.claims`` maps a claim's UID to its charge (the claim's name is in the entry), so a
  claim created under the name of a live one never replaces or releases the live one's charge;
- memory amounts are canonical quantities (:func:`api.quantity.format_quantity`);
- the ``*Summary`` fields are ``<used>/<hard>`` (``-`` for an absent limit), for kubectl.

:func:`parse_gpu_quota` is the one decoder of a stored object: every problem comes back as a
:class:`GpuQuotaError` naming each field path, never as a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails, PydanticCustomError

from api.jsontypes import json_type
from api.names import (
    GPU_QUOTA_KIND,
    GROUP_VERSION,
)
from api.quantity import (
    MAX_QUANTITY,
    QUANTITY_PATTERN,
    QuantityError,
    format_quantity,
    parse_quantity,
)

#: The largest ``devices`` limit accepted (far beyond any cluster; a bigger number is a typo).
MAX_QUOTA_DEVICES: Final = 1_000_000
#: The largest ``cores`` limit accepted: 100 for each of :data:`MAX_QUOTA_DEVICES` GPUs.
MAX_QUOTA_CORES: Final = 100 * MAX_QUOTA_DEVICES
#: At most this many DeviceClass names in ``spec.deviceClassNames``.
MAX_DEVICE_CLASS_NAMES: Final = 32
#: A DeviceClass name is a DNS subdomain: at most this many characters.
MAX_NAME_LENGTH: Final = 253
#: Written in a summary for an absent limit.
NO_LIMIT: Final = "-"


class GpuQuotaError(ValueError):
    """An invalid GpuQuota. ``messages`` lists every problem as ``<field path>: <problem>``."""

    def __init__(self, messages: Sequence[str]) -> None:
        self.messages: tuple[str, ...] = tuple(messages)
        super().__init__("; ".join(self.messages))


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else json_type(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def quantity_bytes(value: Any) -> int:
    """The whole number of bytes of a memory quantity (fractions round up, as
    ``Quantity.Value()``); raises ``ValueError`` naming the problem for a negative amount,
    a value that is no quantity, or one above int64."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f'must be a quantity such as "80Gi" (got {_show(value)})')
    try:
        amount = parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(f"{exc}") from None
    if amount < 0:
        raise ValueError(f"must not be negative (got {_show(value)})")
    whole = int(amount) + (1 if amount != int(amount) else 0)
    if whole > MAX_QUANTITY:
        raise ValueError(f"must be at most {MAX_QUANTITY} bytes (got {_show(value)})")
    return whole


def _memory(value: Any) -> str:
    try:
        return format_quantity(quantity_bytes(value))
    except ValueError as exc:
        raise PydanticCustomError("quantity", "{problem}", {"problem": str(exc)}) from None


def _bounded_int(high: int) -> Any:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise PydanticCustomError(
                "bounded_int",
                "must be an integer between 0 and {high} (got {got})",
                {"high": high, "got": _show(value)},
            )
        return value

    return check


def _class_names(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise PydanticCustomError(
            "names", "must be a list of DeviceClass names (got {got})", {"got": json_type(value)}
        )
    if len(value) > MAX_DEVICE_CLASS_NAMES:
        raise PydanticCustomError(
            "names",
            "must list at most {n} names (got {got})",
            {"n": MAX_DEVICE_CLASS_NAMES, "got": len(value)},
        )
    for i, name in enumerate(value):
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_LENGTH:
            raise PydanticCustomError(
                "names",
                "[{i}] must be a DeviceClass name of 1 to {n} characters (got {got})",
                {"i": i, "n": MAX_NAME_LENGTH, "got": _show(name)},
            )
    return list(value)


Memory = Annotated[
    str,
    PlainValidator(_memory),
    WithJsonSchema(
        {
            "anyOf": [{"type": "string"}, {"type": "integer"}],
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
            "description": "Memory (a Kubernetes quantity such as 80Gi).",
        }
    ),
]
Cores = Annotated[
    int,
    PlainValidator(_bounded_int(MAX_QUOTA_CORES)),
    WithJsonSchema({"type": "integer", "minimum": 0, "maximum": MAX_QUOTA_CORES}),
]
Devices = Annotated[
    int,
    PlainValidator(_bounded_int(MAX_QUOTA_DEVICES)),
    WithJsonSchema({"type": "integer", "minimum": 0, "maximum": MAX_QUOTA_DEVICES}),
]
ClassNames = Annotated[
    list[str],
    PlainValidator(_class_names),
    WithJsonSchema(
        {
            "type": "array",
            "maxItems": MAX_DEVICE_CLASS_NAMES,
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_LENGTH},
        }
    ),
]


class _Model(BaseModel):
    """Base: camelCase JSON names, unknown fields rejected, instances immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON shape (camelCase keys, unset optional fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class QuotaLimits(_Model):
    """Limits; each is optional (absent: not limited)."""

    cores: Cores | None = Field(
        default=None, description="Cores: percent of one GPU's SMs; a whole GPU counts 100."
    )
    memory: Memory | None = Field(default=None, description="GPU memory (quantity).")
    devices: Devices | None = Field(
        default=None, description="Devices allocated: whole GPUs, partitions or shares."
    )
    limits_cores: Cores | None = Field(
        default=None,
        description="Sum of the claims' cores limits (a burstable share's burstLimit, else its "
        "request), as ResourceQuota's limits.*.",
    )
    limits_memory: Memory | None = Field(
        default=None,
        description="Sum of the claims' memory limits (a burstable share's burstLimit, else "
        "its request), as ResourceQuota's limits.*.",
    )


class GpuQuotaSpec(_Model):
    """What the namespace may use."""

    hard: QuotaLimits = Field(description="The limits; an absent limit is no limit.")
    device_class_names: ClassNames | None = Field(
        default=None,
        description="Only requests of these DeviceClasses count (absent: every request of "
        "this driver).",
    )


class Usage(_Model):
    """An amount charged: cores, memory and devices, and the limits where they differ from
    cores and memory (a burstable share; absent: equal to them)."""

    cores: Cores = 0
    memory: Memory = "0"
    devices: Devices = 0
    limits_cores: Cores | None = Field(
        default=None, description="Cores limits charged (absent: equal to cores)."
    )
    limits_memory: Memory | None = Field(
        default=None, description="Memory limits charged (absent: equal to memory)."
    )


class ClaimCharge(Usage):
    """The charge of one claim: what it may consume, then (once allocated) what it does."""

    uid: str | None = Field(default=None, description="The claim's UID, when known.")
    name: str | None = Field(default=None, description="The claim's name.")
    allocated: bool = Field(
        default=False, description="Whether the charge is the allocation's consumed capacity."
    )
    admitted_at: str | None = Field(
        default=None,
        description="When admission charged a claim that the controller has not seen yet "
        "(RFC 3339); such a charge is released when no claim appears within the grace period.",
    )


class GpuQuotaStatus(_Model):
    """Usage, kept by the controller."""

    used: Usage = Field(default_factory=Usage)
    claims: dict[str, ClaimCharge] = Field(default_factory=dict)
    cores_summary: str | None = Field(default=None, description="'<used>/<hard>' cores.")
    memory_summary: str | None = Field(default=None, description="'<used>/<hard>' memory.")
    devices_summary: str | None = Field(default=None, description="'<used>/<hard>' devices.")
    limits_summary: str | None = Field(
        default=None,
        description="'<used>/<hard>' cores and memory limits (only when the quota sets one).",
    )


class GpuQuota(_Model):
    """A decoded GpuQuota object: its name, namespace, spec and status (if any)."""

    name: str
    namespace: str
    resource_version: str = ""
    spec: GpuQuotaSpec
    status: GpuQuotaStatus = Field(default_factory=GpuQuotaStatus)


def _path(error: ErrorDetails) -> str:
    return ".".join(str(p) for p in error["loc"]) or "(root)"


def _message(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        problem = "unknown field"
    elif kind == "missing":
        problem = "required"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        problem = f"must be an object (got {json_type(error.get('input'))})"
    elif kind in ("string_type", "bool_type"):
        problem = f"must be a {'string' if kind == 'string_type' else 'boolean'} " + (
            f"(got {_show(error.get('input'))})"
        )
    else:
        problem = error["msg"]
    return f"{_path(error)}: {problem}"


def parse_gpu_quota(obj: Any) -> GpuQuota:
    """Decode a stored GpuQuota object (JSON as a dict).

    Raises :class:`GpuQuotaError` listing every problem (``spec.hard.cores: must be an integer
    between 0 and 100000000 (got -1)``) for anything that is not a valid GpuQuota.
    """
    if not isinstance(obj, Mapping):
        raise GpuQuotaError([f"(root): must be an object (got {json_type(obj)})"])
    problems: list[str] = []
    if obj.get("apiVersion") not in (None, GROUP_VERSION):
        problems.append(f"apiVersion: must be {GROUP_VERSION} (got {_show(obj.get('apiVersion'))})")
    if obj.get("kind") not in (None, GPU_QUOTA_KIND):
        problems.append(f"kind: must be {GPU_QUOTA_KIND} (got {_show(obj.get('kind'))})")
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    fields = {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "resource_version": meta.get("resourceVersion", ""),
        "spec": obj.get("spec"),
    }
    status = obj.get("status")
    if status is not None:
        fields["status"] = status
    try:
        quota = GpuQuota.model_validate(fields)
    except ValidationError as exc:
        problems += [
            _message(e).replace("resource_version", "metadata.resourceVersion", 1)
            for e in exc.errors()
        ]
        quota = None
    if problems or quota is None:
        raise GpuQuotaError(problems)
    return quota


def summary(used: int, hard: int | None) -> str:
    """``<used>/<hard>`` for a printer column (``-`` for an absent limit)."""
    return f"{used}/{NO_LIMIT if hard is None else hard}"


def memory_summary(used: int, hard: str | None) -> str:
    """``<used>/<hard>`` of memory, both canonical quantities."""
    return f"{format_quantity(used)}/{NO_LIMIT if hard is None else hard}"
