"""``GpuConfig`` (``resource.sharegpu.dev/v1alpha1``): how an allocated GPU or GPU share is used.

A GpuConfig travels as the opaque ``parameters`` of a DeviceClass or ResourceClaim ``config``
entry for this driver. This module is the single place that

- decodes and validates it (:func:`parse_gpu_config`): unknown fields, wrong types and
  out-of-range values raise one :class:`GpuConfigError` whose ``messages`` name the field path and
  the allowed values, e.g. ``sharing.strategy: must be one of Exclusive, TimeSlicing, MPS, Limits
  (got "Mps")``;
- decodes this driver's config entries of an object once (:func:`decode_driver_configs`, the one
  JSON parse the kubelet plugin, the admission webhook and the CLI share) and decides which
  configuration applies to an allocated device (:meth:`DriverConfigs.resolve`): DeviceClass
  entries first, then the claim's, the last applicable entry wins as a whole (no field merging);
  entries for other drivers are ignored, so the precedence rule exists once;
- holds the defaults: a whole-GPU allocation is ``Exclusive``; a share (a result with a shareID, or
  a partition device) is ``MPS``.

Sections (``timeSlicing``, ``mps``, ``limits``) are only accepted next to the strategy they tune,
so a config never carries settings that silently do nothing.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal, get_args, get_origin

import annotated_types
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticCustomError

from api import names
from api.jsontypes import json_type
from api.names import GROUP_VERSION
from api.quantity import (
    MAX_QUANTITY,
    QuantityError,
    QuantityRangeError,
    parse_quantity,
    quantity_hint,
)

GPU_CONFIG_KIND: Final = "GpuConfig"

Strategy = Literal["Exclusive", "TimeSlicing", "MPS", "Limits"]
STRATEGY_EXCLUSIVE: Final = "Exclusive"
STRATEGY_TIME_SLICING: Final = "TimeSlicing"
STRATEGY_MPS: Final = "MPS"
STRATEGY_LIMITS: Final = "Limits"

TimeSliceInterval = Literal["Default", "Short", "Medium", "Long"]

#: Smallest memory limit accepted anywhere in a GpuConfig (limits are applied in MiB).
MIN_MEMORY_LIMIT_BYTES: Final = 1024 * 1024

#: Which section tunes which strategy (JSON name -> strategy).
_SECTION_STRATEGY: Final = {"timeSlicing": "TimeSlicing", "mps": "MPS", "limits": "Limits"}
#: The same, read-only, for schemas that restate the rule (the chart's values schema).
SECTION_STRATEGY: Final[Mapping[str, str]] = MappingProxyType(_SECTION_STRATEGY)


class GpuConfigError(ValueError):
    """An invalid GpuConfig. ``messages`` lists every problem as ``<field path>: <problem>``."""

    def __init__(self, messages: Sequence[str]) -> None:
        self.messages: tuple[str, ...] = tuple(messages)
        super().__init__("; ".join(self.messages))

    def prefixed(self, prefix: str) -> GpuConfigError:
        """The same error with ``prefix`` (e.g. ``config[2]: ``) before every message."""
        return GpuConfigError([f"{prefix}{m}" for m in self.messages])


def _validate_quantity(value: Any) -> str:
    """A Kubernetes quantity of at least 1Mi, given as a string (``"10Gi"``) or an integer."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise PydanticCustomError(
            "quantity_type", 'must be a quantity such as "10Gi" (got {got})', {"got": _show(value)}
        )
    try:
        amount = parse_quantity(value)
    except QuantityRangeError:
        raise PydanticCustomError(
            "quantity_range",
            "must be at most {max} bytes (got {got})",
            {"max": MAX_QUANTITY, "got": _show(value)},
        ) from None
    except QuantityError:
        hint = quantity_hint(value)
        raise PydanticCustomError(
            "quantity_parsing",
            'must be a quantity such as "10Gi" (got {got}){hint}',
            {"got": _show(value), "hint": f"; {hint}" if hint else ""},
        ) from None
    if amount < MIN_MEMORY_LIMIT_BYTES:
        raise PydanticCustomError(
            "quantity_too_small", "must be at least 1Mi (got {got})", {"got": _show(value)}
        )
    return str(value)


Quantity = Annotated[
    str,
    PlainValidator(_validate_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "string"}, {"type": "integer"}],
            "x-kubernetes-int-or-string": True,
            "description": "A Kubernetes quantity of at least 1Mi, e.g. 10Gi.",
        }
    ),
]
Percentage = Annotated[int, Field(ge=1, le=100)]


class _Strict(BaseModel):
    """Base: camelCase JSON names only, strict types, unknown fields rejected, immutable."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
    )


class TimeSlicingSettings(_Strict):
    """Settings of the ``TimeSlicing`` strategy."""

    interval: TimeSliceInterval = Field(
        default="Default",
        description="GPU time slice length (nvidia-smi compute-policy --set-timeslice).",
    )


class MpsSettings(_Strict):
    """Optional overrides of the ``MPS`` strategy; by default both derive from the share."""

    active_thread_percentage: Percentage | None = Field(
        default=None,
        description="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; at most the share's cores.",
    )
    pinned_memory_limit: Quantity | None = Field(
        default=None,
        description="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; at most the share's memory.",
    )

    def pinned_memory_limit_bytes(self) -> int | None:
        """The pinned memory limit in bytes, or None when not overridden."""
        return _bytes(self.pinned_memory_limit)


class LimitsSettings(_Strict):
    """Optional overrides of the ``Limits`` strategy (an interception library following
    HAMi-core's environment contract); by default both derive from the share."""

    device_memory_limit: Quantity | None = Field(
        default=None,
        description="CUDA_DEVICE_MEMORY_LIMIT_<i>; at most the share's memory.",
    )
    sm_limit: Percentage | None = Field(
        default=None, description="CUDA_DEVICE_SM_LIMIT; at most the share's cores."
    )

    def device_memory_limit_bytes(self) -> int | None:
        """The device memory limit in bytes, or None when not overridden."""
        return _bytes(self.device_memory_limit)


class Sharing(_Strict):
    """How the device is shared. Each section is only allowed with its own strategy."""

    strategy: Strategy | None = Field(
        default=None,
        description="Exclusive | TimeSlicing | MPS | Limits. Default: Exclusive for a whole GPU, "
        "MPS for a share.",
    )
    time_slicing: TimeSlicingSettings | None = None
    mps: MpsSettings | None = None
    limits: LimitsSettings | None = None

    @model_validator(mode="after")
    def _sections_match_strategy(self) -> Sharing:
        present = {
            "timeSlicing": self.time_slicing,
            "mps": self.mps,
            "limits": self.limits,
        }
        for section, value in present.items():
            wanted = _SECTION_STRATEGY[section]
            if value is not None and self.strategy != wanted:
                actual = "not set" if self.strategy is None else self.strategy
                raise PydanticCustomError(
                    "section_strategy",
                    "only allowed with strategy {wanted} (strategy is {actual})",
                    {"wanted": wanted, "actual": actual, "subfield": section},
                )
        return self


class GpuConfig(_Strict):
    """The opaque configuration of this driver (``kind: GpuConfig``)."""

    api_version: Literal["resource.sharegpu.dev/v1alpha1"]
    kind: Literal["GpuConfig"]
    sharing: Sharing | None = None

    @property
    def strategy(self) -> Strategy | None:
        """The configured strategy (always set on what :meth:`DriverConfigs.resolve` returns)."""
        return self.sharing.strategy if self.sharing else None

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON shape (camelCase keys, unset fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _bytes(quantity: str | None) -> int | None:
    if quantity is None:
        return None
    value = parse_quantity(quantity)
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def _show(value: Any) -> str:
    """How a rejected input value is quoted in messages (JSON text where possible)."""
    if isinstance(value, Decimal):
        return str(value)
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def _field_at(loc: Sequence[int | str]) -> FieldInfo | None:
    """The FieldInfo the error location points at, walking the models by JSON name."""
    model: Any = GpuConfig
    found: FieldInfo | None = None
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        found = next(
            (f for name, f in model.model_fields.items() if (f.alias or name) == part), None
        )
        if found is None:
            return None
        model = _unwrap_optional(found.annotation)
    return found


def _unwrap_optional(annotation: Any) -> Any:
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is not Literal and len(args) == 1:
        return args[0]
    return annotation


def _allowed_literals(field: FieldInfo | None) -> tuple[str, ...]:
    if field is None:
        return ()
    annotation = _unwrap_optional(field.annotation)
    if get_origin(annotation) is Literal:
        return tuple(str(a) for a in get_args(annotation))
    return ()


def _constraints(field: FieldInfo | None) -> list[Any]:
    """Constraint metadata of a field, also from an ``Annotated`` type inside ``X | None``."""
    if field is None:
        return []
    found = list(field.metadata)
    for meta in getattr(_unwrap_optional(field.annotation), "__metadata__", ()):
        found.extend(meta.metadata if isinstance(meta, FieldInfo) else [meta])
    return found


def _range(field: FieldInfo | None) -> tuple[int | None, int | None]:
    low: int | None = None
    high: int | None = None
    for meta in _constraints(field):
        if isinstance(meta, annotated_types.Ge):
            low = int(meta.ge)  # type: ignore[call-overload]
        elif isinstance(meta, annotated_types.Le):
            high = int(meta.le)  # type: ignore[call-overload]
    return low, high


def _closest(got: Any, allowed: Sequence[str]) -> str | None:
    """The allowed name ``got`` is a near miss of: equal but for case, else close (difflib)."""
    if not isinstance(got, str) or got in allowed:
        return None
    match = {a.lower(): a for a in allowed}.get(got.lower())
    if match is None:
        close = difflib.get_close_matches(got, list(allowed), n=1, cutoff=0.6)
        match = close[0] if close else None
    return match


def _field_names(loc: Sequence[int | str]) -> tuple[str, ...]:
    """The JSON names of the fields of the model at ``loc`` (empty when not a model)."""
    model: Any = GpuConfig
    if loc:
        parent = _field_at(loc)
        model = _unwrap_optional(parent.annotation) if parent is not None else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return ()
    return tuple(f.alias or name for name, f in model.model_fields.items())


def _message(error: ErrorDetails) -> str:
    """One ``<path>: <problem>`` line for a pydantic error."""
    loc = [str(p) for p in error["loc"]]
    ctx = error.get("ctx") or {}
    if "subfield" in ctx:
        loc.append(str(ctx["subfield"]))
    path = ".".join(loc) or "(root)"
    kind = error["type"]
    got = _show(error.get("input"))
    field = _field_at(error["loc"])
    if kind == "extra_forbidden":
        known = _field_names(error["loc"][:-1])
        match = _closest(str(error["loc"][-1]), known)
        problem = "unknown field"
        if match is not None:
            problem += f"; did you mean {match}?"
        if known:
            problem += f" (fields here: {', '.join(known)})"
    elif kind == "missing":
        allowed = _allowed_literals(field)
        problem = f"required (must be {allowed[0]})" if len(allowed) == 1 else "required"
    elif kind == "literal_error":
        allowed = _allowed_literals(field)
        if len(allowed) == 1:
            problem = f"must be {allowed[0]} (got {got})"
        else:
            problem = f"must be one of {', '.join(allowed)} (got {got})"
        match = _closest(error.get("input"), allowed)
        if len(allowed) == 1 and match is not None and match.lower() == str(got).strip('"').lower():
            problem += " (names are case-sensitive)"
    elif kind in ("greater_than_equal", "less_than_equal"):
        low, high = _range(field)
        problem = f"must be between {low} and {high} (got {got})"
    elif kind in ("int_type", "int_parsing", "int_from_float"):
        low, high = _range(field)
        bounds = f" between {low} and {high}" if low is not None else ""
        problem = f"must be an integer{bounds} (got {got})"
    elif kind in ("string_type", "literal_type"):
        problem = f"must be a string (got {got})"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        problem = f"must be an object (got {json_type(error.get('input'))})"
    else:
        problem = error["msg"]
    return f"{path}: {problem}"


def parse_gpu_config(parameters: Any) -> GpuConfig:
    """Decode the opaque ``parameters`` of a config entry (a JSON object as a dict).

    Raises :class:`GpuConfigError` listing every problem, in document order.
    """
    if not isinstance(parameters, Mapping):
        raise GpuConfigError([f"(root): must be an object (got {json_type(parameters)})"])
    try:
        return GpuConfig.model_validate(dict(parameters))
    except ValidationError as exc:
        raise GpuConfigError([_message(e) for e in exc.errors()]) from None


def default_strategy(shared: bool) -> Strategy:
    """The strategy when no config names one: MPS for a share, Exclusive for a whole GPU."""
    return STRATEGY_MPS if shared else STRATEGY_EXCLUSIVE


def default_config(shared: bool) -> GpuConfig:
    """The configuration of a device that no config entry applies to."""
    return GpuConfig.model_validate(
        {
            "apiVersion": GROUP_VERSION,
            "kind": GPU_CONFIG_KIND,
            "sharing": {"strategy": default_strategy(shared)},
        }
    )


SOURCE_FROM_CLASS: Final = "FromClass"
SOURCE_FROM_CLAIM: Final = "FromClaim"
#: Precedence of config sources: DeviceClass configs before the claim's.
_SOURCE_ORDER: Final = {SOURCE_FROM_CLASS: 0, SOURCE_FROM_CLAIM: 1}


def config_applies(requests: Sequence[str], request_name: str) -> bool:
    """Whether a config entry listing ``requests`` (empty: every request) applies to
    ``request_name`` (listing ``req`` also covers ``req/sub``)."""
    return (
        not requests
        or request_name in requests
        or names.base_request_name(request_name) in requests
    )


@dataclass(frozen=True)
class ConfigEntry:
    """One of this driver's config entries, decoded once.

    ``position`` is the entry's index in the list it came from (messages name it as
    ``config[position]``); ``requests`` are those it applies to (empty: every request).
    """

    position: int
    source: str | None
    requests: tuple[str, ...]
    config: GpuConfig

    def applies_to(self, request_name: str) -> bool:
        return config_applies(self.requests, request_name)


@dataclass(frozen=True)
class ConfigProblem:
    """One of this driver's config entries whose ``parameters`` are not a valid GpuConfig;
    ``messages`` are :class:`GpuConfigError`'s, not yet prefixed with the position."""

    position: int
    requests: tuple[str, ...]
    messages: tuple[str, ...]

    def applies_to(self, request_name: str) -> bool:
        return config_applies(self.requests, request_name)


@dataclass(frozen=True)
class DriverConfigs:
    """This driver's opaque config entries of one object, each decoded once
    (:func:`decode_driver_configs`).

    ``entries`` are in precedence order: FromClass before FromClaim, each group in the order
    given (entries without a source count as the claim's). ``problems`` are in the order given.
    """

    entries: tuple[ConfigEntry, ...] = ()
    problems: tuple[ConfigProblem, ...] = ()

    def error(self) -> GpuConfigError | None:
        """Every problem as one error, each message prefixed with ``config[<position>]: ``."""
        if not self.problems:
            return None
        return GpuConfigError(
            [f"config[{p.position}]: {m}" for p in self.problems for m in p.messages]
        )

    def chosen(self, request_name: str) -> GpuConfig | None:
        """The GpuConfig as written of the last entry that applies to ``request_name`` (it wins
        as a whole, no field merging); None when none applies.

        Raises :class:`GpuConfigError` (:meth:`error`) when any entry is invalid: a claim with
        a broken config is refused whatever request it concerns.
        """
        error = self.error()
        if error is not None:
            raise error
        chosen: GpuConfig | None = None
        for entry in self.entries:
            if entry.applies_to(request_name):
                chosen = entry.config
        return chosen

    def resolve(self, request_name: str, *, shared: bool = False) -> GpuConfig:
        """The GpuConfig that applies to a device allocated for ``request_name``
        (:meth:`chosen`); none applies: the default for a share or a whole GPU. A missing
        strategy is filled with :func:`default_strategy`. Raises like :meth:`chosen`.
        """
        chosen = self.chosen(request_name)
        if chosen is None:
            return default_config(shared)
        if chosen.strategy is not None:
            return chosen
        sharing = (chosen.sharing or Sharing()).model_copy(
            update={"strategy": default_strategy(shared)}
        )
        return chosen.model_copy(update={"sharing": sharing})


def decode_driver_configs(config_entries: Sequence[Any], driver: str) -> DriverConfigs:
    """Decode ``driver``'s entries of a ``config[]`` list, each once: the one JSON parse shared
    by the admission webhook, ``sharegpu validate``/``explain`` and the kubelet plugin.

    ``config_entries`` have the shape of ``status.allocation.devices.config[]`` (or a class's or
    claim's ``config[]``): ``{source?: FromClass|FromClaim, requests?: [...], opaque?: {driver,
    parameters}}``. Entries that are not objects, or belong to other drivers, are skipped;
    pure and deterministic.
    """
    decoded: list[ConfigEntry] = []
    problems: list[ConfigProblem] = []
    for position, entry in enumerate(config_entries):
        if not isinstance(entry, Mapping):
            continue
        opaque = entry.get("opaque")
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        listed = entry.get("requests") or []
        requests = (
            tuple(r for r in listed if isinstance(r, str)) if isinstance(listed, list) else ()
        )
        try:
            config = parse_gpu_config(opaque.get("parameters"))
        except GpuConfigError as exc:
            problems.append(ConfigProblem(position, requests, exc.messages))
            continue
        source = entry.get("source")
        decoded.append(
            ConfigEntry(position, source if isinstance(source, str) else None, requests, config)
        )
    decoded.sort(key=lambda e: _SOURCE_ORDER.get(e.source or SOURCE_FROM_CLAIM, 1))
    return DriverConfigs(tuple(decoded), tuple(problems))
