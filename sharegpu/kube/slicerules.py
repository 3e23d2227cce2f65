"""resource.k8s.io/v1 ResourceSlice rules that the JSON schema does not express.

This module is the one place for these rules and their limits (Kubernetes 1.36 defaults:
DRAPartitionableDevices, DRAConsumableCapacity and DRADeviceTaints on; DRAListTypeAttributes off).
Every function returns messages of the form ``<field path>: <problem>`` (paths as the API server
writes them, e.g. ``spec.devices[3].attributes[gpu.sharegpu.dev/uuid]``); an empty list means the
input is valid. They never raise on malformed input: wrong types become messages.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any, Final

from api.quantity import QuantityError, parse_quantity

# --- limits -----------------------------------------------------------------------------------
MAX_DEVICES_PER_SLICE: Final = 128
#: Applies when any device of the slice has taints, consumesCounters or list-typed attributes
#: (:func:`takes_lower_device_limit`).
MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS: Final = 64
MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE: Final = 32
MAX_STRING_ATTRIBUTE_LENGTH: Final = 64
MAX_VERSION_LENGTH: Final = 64
MAX_TAINTS_PER_DEVICE: Final = 16
MAX_SHARED_COUNTER_SETS_PER_SLICE: Final = 8
MAX_COUNTERS_PER_SET: Final = 32
MAX_CONSUMES_COUNTERS_PER_DEVICE: Final = 2
MAX_COUNTERS_PER_CONSUMES_COUNTERS: Final = 32
MAX_VALID_VALUES: Final = 10
MAX_BINDING_CONDITIONS: Final = 4
MAX_DRIVER_NAME_LENGTH: Final = 63
MAX_POOL_NAME_LENGTH: Final = 253
MAX_DNS_LABEL_LENGTH: Final = 63
MAX_DNS_SUBDOMAIN_LENGTH: Final = 253
MAX_C_IDENTIFIER_LENGTH: Final = 32
MAX_ATTRIBUTE_DOMAIN_LENGTH: Final = 63
MAX_LABEL_VALUE_LENGTH: Final = 63
MAX_NODE_SELECTOR_TERMS: Final = 1

TAINT_EFFECTS: Final = ("None", "NoSchedule", "NoExecute")
ATTRIBUTE_VALUE_FIELDS: Final = ("int", "bool", "string", "version")
#: List-typed attribute values of the alpha DRAListTypeAttributes gate (off by default).
LIST_ATTRIBUTE_VALUE_FIELDS: Final = ("ints", "bools", "strings", "versions")
NODE_SELECTION_FIELDS: Final = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
DEVICE_NODE_SELECTION_FIELDS: Final = ("nodeName", "nodeSelector", "allNodes")

# --- predicates -------------------------------------------------------------------------------
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_C_IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


def utf8_length(value: str) -> int:
    """Length in bytes, as the API server measures string and version attribute values."""
    return len(value.encode("utf-8"))


def truncate_utf8(value: str, max_bytes: int) -> str:
    """The longest prefix of ``value`` whose UTF-8 encoding is at most ``max_bytes`` bytes
    (never ending in a partial character)."""
    return value.encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")


def is_dns_label(value: object) -> bool:
    """RFC 1123 label: lowercase alphanumerics and ``-``, ≤63, alphanumeric at both ends."""
    return (
        isinstance(value, str)
        and len(value) <= MAX_DNS_LABEL_LENGTH
        and bool(_DNS_LABEL_RE.match(value))
    )


def is_dns_subdomain(value: object, max_length: int = MAX_DNS_SUBDOMAIN_LENGTH) -> bool:
    """RFC 1123 subdomain: dot-separated DNS labels, ≤253 (or ``max_length``) in total."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= max_length
        and all(is_dns_label(part) for part in value.split("."))
    )


def is_c_identifier(value: object, max_length: int = MAX_C_IDENTIFIER_LENGTH) -> bool:
    """A C identifier (``[A-Za-z_][A-Za-z0-9_]*``) of at most ``max_length`` characters."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= max_length
        and bool(_C_IDENTIFIER_RE.match(value))
    )


def is_qualified_name(value: object) -> bool:
    """A device attribute/capacity name: a C identifier ≤32, or ``<DNS subdomain ≤63>/<C
    identifier ≤32>``."""
    if not isinstance(value, str):
        return False
    domain, sep, ident = value.partition("/")
    if not sep:
        return is_c_identifier(value)
    return is_dns_subdomain(domain, MAX_ATTRIBUTE_DOMAIN_LENGTH) and is_c_identifier(ident)


def is_strict_semver(value: object) -> bool:
    """Semantic Versioning 2.0.0 exactly (no ``v`` prefix, no missing parts, no leading zeros)."""
    return isinstance(value, str) and bool(_SEMVER_RE.match(value))


def is_label_value(value: object) -> bool:
    """A Kubernetes label value (≤63, alphanumerics, ``-_.``, alphanumeric at both ends)."""
    return (
        isinstance(value, str)
        and len(value) <= MAX_LABEL_VALUE_LENGTH
        and bool(_LABEL_VALUE_RE.match(value))
    )


def is_label_key(value: object) -> bool:
    """A label/taint key: ``[prefix/]name`` with a DNS-subdomain prefix and a ≤63 name."""
    if not isinstance(value, str):
        return False
    prefix, sep, name = value.rpartition("/")
    if sep and not is_dns_subdomain(prefix):
        return False
    return bool(name) and is_label_value(name)


def is_pool_name(value: object) -> bool:
    """A pool name: ≤253 characters, one or more DNS subdomains separated by ``/``."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_POOL_NAME_LENGTH
        and all(is_dns_subdomain(part) for part in value.split("/"))
    )


# --- helpers ----------------------------------------------------------------------------------


class _Messages:
    """Collects ``path: message`` strings."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{path}: {message}")


def _quantity(value: Any) -> Decimal | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return parse_quantity(value)
    except (QuantityError, ValueError, TypeError, ArithmeticError):
        return None


def _as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _is_set(obj: Mapping[str, Any], key: str) -> bool:
    """A pointer/slice/map field counts as set when present and not null."""
    return obj.get(key) is not None


def _qualify(driver: str, name: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


# --- ResourceSlice ----------------------------------------------------------------------------


def validate_resource_slice(obj: Mapping[str, Any]) -> list[str]:
    """All single-slice rules for a ResourceSlice (a JSON dict); see the module docstring."""
    msgs = _Messages()
    name = _as_mapping(obj.get("metadata")).get("name")
    if name is not None and not is_dns_subdomain(name):
        msgs.add("metadata.name", f"invalid name {name!r}: must be a DNS subdomain")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        msgs.add("spec", "Required value")
        return msgs.items
    driver = spec.get("driver")
    if not driver:
        msgs.add("spec.driver", "Required value")
    elif not is_dns_subdomain(driver, MAX_DRIVER_NAME_LENGTH):
        msgs.add(
            "spec.driver",
            f"invalid driver name {driver!r}: must be a DNS subdomain of at most "
            f"{MAX_DRIVER_NAME_LENGTH} characters",
        )
    _validate_pool_ref(spec.get("pool"), msgs)
    _validate_node_selection(spec, msgs)

    devices = spec.get("devices")
    counters = spec.get("sharedCounters")
    if devices and counters:
        msgs.add(
            "spec",
            "devices and sharedCounters must not be set in the same ResourceSlice "
            "(publish counter sets in their own slices)",
        )
    if devices is not None and not isinstance(devices, list):
        msgs.add("spec.devices", "must be a list")
    if counters is not None and not isinstance(counters, list):
        msgs.add("spec.sharedCounters", "must be a list")
    _validate_devices(_as_list(devices), str(driver or ""), spec, msgs)
    _validate_shared_counters(_as_list(counters), "spec.sharedCounters", msgs)
    return msgs.items


def _validate_pool_ref(pool: Any, msgs: _Messages) -> None:
    if not isinstance(pool, Mapping):
        msgs.add("spec.pool", "Required value")
        return
    name = pool.get("name")
    if not name:
        msgs.add("spec.pool.name", "Required value")
    elif not is_pool_name(name):
        msgs.add(
            "spec.pool.name",
            f"invalid pool name {name!r}: must be at most {MAX_POOL_NAME_LENGTH} characters of "
            "DNS subdomains separated by '/'",
        )
    generation = pool.get("generation")
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        msgs.add("spec.pool.generation", f"must be an integer >= 0, got {generation!r}")
    count = pool.get("resourceSliceCount")
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        msgs.add("spec.pool.resourceSliceCount", f"must be an integer > 0, got {count!r}")


def _validate_node_selection(spec: Mapping[str, Any], msgs: _Messages) -> None:
    present = [f for f in NODE_SELECTION_FIELDS if _is_set(spec, f)]
    if len(present) != 1:
        given = ", ".join(present) if present else "none"
        msgs.add(
            "spec",
            f"exactly one of {', '.join(NODE_SELECTION_FIELDS)} is required (set: {given})",
        )
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if _is_set(spec, flag) and spec[flag] is not True:
            msgs.add(f"spec.{flag}", "must be either unset or set to true")
    node_name = spec.get("nodeName")
    if node_name is not None and not is_dns_subdomain(node_name):
        msgs.add("spec.nodeName", f"invalid node name {node_name!r}: must be a DNS subdomain")
    if _is_set(spec, "nodeSelector"):
        _validate_node_selector(spec["nodeSelector"], "spec.nodeSelector", msgs)


def _validate_node_selector(selector: Any, path: str, msgs: _Messages) -> None:
    terms = _as_mapping(selector).get("nodeSelectorTerms")
    if not isinstance(terms, list) or len(terms) != MAX_NODE_SELECTOR_TERMS:
        msgs.add(f"{path}.nodeSelectorTerms", "must have exactly one node selector term")


def takes_lower_device_limit(device: Any) -> bool:
    """Whether ``device`` puts its slice under the lower device limit
    (:data:`MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS`): it has taints, ``consumesCounters``
    or a list-typed attribute (k8s.io/api v0.37 ``ResourceSliceMaxDevicesWithAdvancedFeatures``).
    A non-mapping counts as a plain device."""
    if not isinstance(device, Mapping):
        return False
    if device.get("taints") or device.get("consumesCounters"):
        return True
    return any(
        isinstance(a, Mapping) and any(a.get(f) is not None for f in LIST_ATTRIBUTE_VALUE_FIELDS)
        for a in _as_mapping(device.get("attributes")).values()
    )


def device_limit(devices: Iterable[Any]) -> int:
    """The most devices a slice holding ``devices`` may have (:func:`takes_lower_device_limit`)."""
    if any(takes_lower_device_limit(d) for d in devices):
        return MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
    return MAX_DEVICES_PER_SLICE


def _validate_devices(
    devices: list[Any], driver: str, spec: Mapping[str, Any], msgs: _Messages
) -> None:
    limit = device_limit(devices)
    if len(devices) > limit:
        why = (
            " when a device has taints, consumesCounters or list-typed attributes"
            if limit == MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
            else ""
        )
        msgs.add("spec.devices", f"Too many: {len(devices)}: must have at most {limit} items{why}")
    per_device_nodes = spec.get("perDeviceNodeSelection") is True
    seen: set[str] = set()
    for i, device in enumerate(devices):
        path = f"spec.devices[{i}]"
        if not isinstance(device, Mapping):
            msgs.add(path, "must be an object")
            continue
        name = device.get("name")
        if not name:
            msgs.add(f"{path}.name", "Required value")
        elif not is_dns_label(name):
            msgs.add(f"{path}.name", f"invalid device name {name!r}: must be a DNS label")
        elif name in seen:
            msgs.add(f"{path}.name", f"Duplicate value: {name!r}")
        else:
            seen.add(name)
        _validate_device(device, path, driver, per_device_nodes, msgs)


def _validate_device(
    device: Mapping[str, Any], path: str, driver: str, per_device_nodes: bool, msgs: _Messages
) -> None:
    attributes = device.get("attributes")
    capacity = device.get("capacity")
    if attributes is not None and not isinstance(attributes, Mapping):
        msgs.add(f"{path}.attributes", "must be a map")
    if capacity is not None and not isinstance(capacity, Mapping):
        msgs.add(f"{path}.capacity", "must be a map")
    attributes = _as_mapping(attributes)
    capacity = _as_mapping(capacity)
    total = len(attributes) + len(capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
        msgs.add(
            path,
            f"Too many: {total}: must have at most {MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE} "
            "attributes and capacities combined",
        )
    _validate_attributes(attributes, f"{path}.attributes", driver, msgs)
    shared = device.get("allowMultipleAllocations") is True
    _validate_capacities(capacity, f"{path}.capacity", driver, shared, msgs)
    _validate_consumes_counters(_as_list(device.get("consumesCounters")), path, msgs)
    _validate_taints(_as_list(device.get("taints")), f"{path}.taints", msgs)
    for field in ("bindingConditions", "bindingFailureConditions"):
        conditions = _as_list(device.get(field))
        if len(conditions) > MAX_BINDING_CONDITIONS:
            msgs.add(
                f"{path}.{field}",
                f"Too many: {len(conditions)}: must have at most {MAX_BINDING_CONDITIONS} items",
            )
    present = [f for f in DEVICE_NODE_SELECTION_FIELDS if _is_set(device, f)]
    if per_device_nodes:
        if len(present) != 1:
            msgs.add(
                path,
                f"exactly one of {', '.join(DEVICE_NODE_SELECTION_FIELDS)} is required when "
                "spec.perDeviceNodeSelection is true",
            )
        if _is_set(device, "allNodes") and device["allNodes"] is not True:
            msgs.add(f"{path}.allNodes", "must be either unset or set to true")
        node_name = device.get("nodeName")
        if node_name is not None and not is_dns_subdomain(node_name):
            msgs.add(f"{path}.nodeName", f"invalid node name {node_name!r}")
        if _is_set(device, "nodeSelector"):
            _validate_node_selector(device["nodeSelector"], f"{path}.nodeSelector", msgs)
    elif present:
        msgs.add(
            path,
            f"{', '.join(present)} may only be set when spec.perDeviceNodeSelection is true",
        )


def _validate_attributes(
    attributes: Mapping[str, Any], path: str, driver: str, msgs: _Messages
) -> None:
    qualified: set[str] = set()
    for key, value in attributes.items():
        apath = f"{path}[{key}]"
        if not is_qualified_name(key):
            msgs.add(
                apath,
                "invalid attribute name: must be a C identifier of at most "
                f"{MAX_C_IDENTIFIER_LENGTH} characters, optionally prefixed by a DNS subdomain "
                f"of at most {MAX_ATTRIBUTE_DOMAIN_LENGTH} characters and '/'",
            )
        else:
            full = _qualify(driver, key)
            if full in qualified:
                msgs.add(apath, f"Duplicate value: {full!r} (the same name qualified and not)")
            qualified.add(full)
        if not isinstance(value, Mapping):
            msgs.add(apath, f"must have exactly one of {', '.join(ATTRIBUTE_VALUE_FIELDS)}")
            continue
        lists = [f for f in LIST_ATTRIBUTE_VALUE_FIELDS if value.get(f) is not None]
        if lists:
            msgs.add(
                apath,
                f"{', '.join(lists)}: list-typed attributes need the DRAListTypeAttributes "
                "feature gate, which is off",
            )
        typed = [f for f in ATTRIBUTE_VALUE_FIELDS if value.get(f) is not None]
        if len(typed) != 1:
            msgs.add(apath, f"must have exactly one of {', '.join(ATTRIBUTE_VALUE_FIELDS)}")
            continue
        kind = typed[0]
        v = value[kind]
        if kind == "int" and (not isinstance(v, int) or isinstance(v, bool)):
            msgs.add(f"{apath}.int", f"must be an integer, got {v!r}")
        elif kind == "bool" and not isinstance(v, bool):
            msgs.add(f"{apath}.bool", f"must be a boolean, got {v!r}")
        elif kind == "string":
            if not isinstance(v, str):
                msgs.add(f"{apath}.string", f"must be a string, got {v!r}")
            elif utf8_length(v) > MAX_STRING_ATTRIBUTE_LENGTH:
                msgs.add(
                    f"{apath}.string",
                    f"Too long: may not be more than {MAX_STRING_ATTRIBUTE_LENGTH} bytes "
                    f"(got {utf8_length(v)})",
                )
        elif kind == "version":
            if not isinstance(v, str):
                msgs.add(f"{apath}.version", f"must be a string, got {v!r}")
            elif utf8_length(v) > MAX_VERSION_LENGTH:
                msgs.add(
                    f"{apath}.version",
                    f"Too long: may not be more than {MAX_VERSION_LENGTH} bytes "
                    f"(got {utf8_length(v)})",
                )
            elif not is_strict_semver(v):
                msgs.add(
                    f"{apath}.version",
                    f"invalid version {v!r}: must be a semantic version 2.0.0 (e.g. 1.2.3)",
                )


def _validate_capacities(
    capacity: Mapping[str, Any], path: str, driver: str, shared: bool, msgs: _Messages
) -> None:
    qualified: set[str] = set()
    for key, entry in capacity.items():
        cpath = f"{path}[{key}]"
        if not is_qualified_name(key):
            msgs.add(
                cpath,
                "invalid capacity name: must be a C identifier of at most "
                f"{MAX_C_IDENTIFIER_LENGTH} characters, optionally prefixed by a DNS subdomain "
                f"of at most {MAX_ATTRIBUTE_DOMAIN_LENGTH} characters and '/'",
            )
        else:
            full = _qualify(driver, key)
            if full in qualified:
                msgs.add(cpath, f"Duplicate value: {full!r} (the same name qualified and not)")
            qualified.add(full)
        entry = _as_mapping(entry)
        value = _quantity(entry.get("value"))
        if value is None:
            msgs.add(f"{cpath}.value", f"Required value: a quantity, got {entry.get('value')!r}")
            continue
        if value < 0:
            msgs.add(f"{cpath}.value", "must be greater than or equal to 0")
        policy = entry.get("requestPolicy")
        if policy is None:
            continue
        if not shared:
            msgs.add(
                f"{cpath}.requestPolicy",
                "may only be set when allowMultipleAllocations is true",
            )
            continue
        _validate_request_policy(_as_mapping(policy), value, f"{cpath}.requestPolicy", msgs)


def _validate_request_policy(
    policy: Mapping[str, Any], capacity: Decimal, path: str, msgs: _Messages
) -> None:
    default = _quantity(policy.get("default"))
    if policy.get("default") is not None and default is None:
        msgs.add(f"{path}.default", f"invalid quantity {policy.get('default')!r}")
        return
    if default is not None and not 0 <= default <= capacity:
        msgs.add(f"{path}.default", f"must be between 0 and the capacity value {capacity}")
    has_values = policy.get("validValues") is not None
    has_range = policy.get("validRange") is not None
    if has_values and has_range:
        msgs.add(path, "validValues and validRange are mutually exclusive")
        return
    if (has_values or has_range) and default is None:
        msgs.add(f"{path}.default", "Required value: needed with validValues or validRange")
        return
    if has_values:
        _validate_valid_values(policy.get("validValues"), default, capacity, path, msgs)
    elif has_range:
        _validate_valid_range(
            _as_mapping(policy.get("validRange")), default, capacity, f"{path}.validRange", msgs
        )


def _validate_valid_values(
    raw: Any, default: Decimal | None, capacity: Decimal, path: str, msgs: _Messages
) -> None:
    vpath = f"{path}.validValues"
    items = _as_list(raw)
    if not items:
        msgs.add(vpath, "Required value: must not be empty")
        return
    if len(items) > MAX_VALID_VALUES:
        msgs.add(vpath, f"Too many: {len(items)}: must have at most {MAX_VALID_VALUES} items")
    values: list[Decimal] = []
    for i, item in enumerate(items):
        q = _quantity(item)
        if q is None:
            msgs.add(f"{vpath}[{i}]", f"invalid quantity {item!r}")
            return
        if q > capacity:
            msgs.add(
                f"{vpath}[{i}]", f"must be less than or equal to the capacity value {capacity}"
            )
        if values and q <= values[-1]:
            msgs.add(f"{vpath}[{i}]", "must be sorted in ascending order without duplicates")
        values.append(q)
    if default is not None and default not in values:
        msgs.add(f"{path}.default", "must be one of validValues")


def _validate_valid_range(
    rng: Mapping[str, Any],
    default: Decimal | None,
    capacity: Decimal,
    path: str,
    msgs: _Messages,
) -> None:
    minimum = _quantity(rng.get("min"))
    if minimum is None:
        msgs.add(f"{path}.min", "Required value")
        return
    if not 0 <= minimum <= capacity:
        msgs.add(f"{path}.min", f"must be between 0 and the capacity value {capacity}")
    maximum = _quantity(rng.get("max"))
    if rng.get("max") is not None:
        if maximum is None:
            msgs.add(f"{path}.max", f"invalid quantity {rng.get('max')!r}")
        elif maximum > capacity:
            msgs.add(f"{path}.max", f"must be less than or equal to the capacity value {capacity}")
        elif maximum < minimum:
            msgs.add(f"{path}.max", "must be greater than or equal to min")
    if default is not None:
        if default < minimum:
            msgs.add(f"{path.rsplit('.', 1)[0]}.default", "must be greater than or equal to min")
        if maximum is not None and default > maximum:
            msgs.add(f"{path.rsplit('.', 1)[0]}.default", "must be less than or equal to max")
    step = _quantity(rng.get("step"))
    if rng.get("step") is None:
        return
    if step is None or step <= 0:
        msgs.add(f"{path}.step", f"must be a quantity greater than 0, got {rng.get('step')!r}")
        return
    if minimum + step > capacity:
        msgs.add(
            f"{path}.step",
            f"min + step must be less than or equal to the capacity value {capacity}",
        )
    if maximum is not None and (maximum - minimum) % step != 0:
        msgs.add(f"{path}.max", "must be min plus a multiple of step")
    if default is not None and (default - minimum) % step != 0:
        msgs.add(f"{path.rsplit('.', 1)[0]}.default", "must be min plus a multiple of step")


def _validate_counter_map(counters: Any, path: str, limit: int, msgs: _Messages) -> None:
    if not isinstance(counters, Mapping) or not counters:
        msgs.add(path, "Required value: at least one counter")
        return
    if len(counters) > limit:
        msgs.add(path, f"Too many: {len(counters)}: must have at most {limit} counters")
    for cname, counter in counters.items():
        cpath = f"{path}[{cname}]"
        if not is_dns_label(cname):
            msgs.add(cpath, f"invalid counter name {cname!r}: must be a DNS label")
        value = _quantity(_as_mapping(counter).get("value"))
        if value is None:
            msgs.add(f"{cpath}.value", "Required value: a quantity")
        elif value < 0:
            msgs.add(f"{cpath}.value", "must be greater than or equal to 0")


def _validate_consumes_counters(entries: list[Any], path: str, msgs: _Messages) -> None:
    cpath = f"{path}.consumesCounters"
    if len(entries) > MAX_CONSUMES_COUNTERS_PER_DEVICE:
        msgs.add(
            cpath,
            f"Too many: {len(entries)}: must have at most {MAX_CONSUMES_COUNTERS_PER_DEVICE} items",
        )
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        epath = f"{cpath}[{i}]"
        entry = _as_mapping(entry)
        name = entry.get("counterSet")
        if not name:
            msgs.add(f"{epath}.counterSet", "Required value")
        elif not is_dns_label(name):
            msgs.add(
                f"{epath}.counterSet", f"invalid counter set name {name!r}: must be a DNS label"
            )
        elif name in seen:
            msgs.add(f"{epath}.counterSet", f"Duplicate value: {name!r}")
        else:
            seen.add(name)
        _validate_counter_map(
            entry.get("counters"), f"{epath}.counters", MAX_COUNTERS_PER_CONSUMES_COUNTERS, msgs
        )


def taint_problems(taint: Any, path: str) -> list[str]:
    """``path: message`` for each problem of one device taint (key, value, effect), as a
    slice's ``devices[].taints[]`` and a DeviceTaintRule's ``spec.taint`` are checked."""
    msgs = _Messages()
    _validate_taint(_as_mapping(taint), path, msgs)
    return msgs.items


def _validate_taints(taints: list[Any], path: str, msgs: _Messages) -> None:
    if len(taints) > MAX_TAINTS_PER_DEVICE:
        msgs.add(path, f"Too many: {len(taints)}: must have at most {MAX_TAINTS_PER_DEVICE} items")
    for i, taint in enumerate(taints):
        _validate_taint(_as_mapping(taint), f"{path}[{i}]", msgs)


def _validate_taint(taint: Mapping[str, Any], tpath: str, msgs: _Messages) -> None:
    key = taint.get("key")
    if not key:
        msgs.add(f"{tpath}.key", "Required value")
    elif not is_label_key(key):
        msgs.add(f"{tpath}.key", f"invalid taint key {key!r}: must be a qualified name")
    value = taint.get("value")
    if value is not None and not is_label_value(value):
        msgs.add(f"{tpath}.value", f"invalid taint value {value!r}: must be a label value")
    effect = taint.get("effect")
    if effect not in TAINT_EFFECTS:
        msgs.add(
            f"{tpath}.effect",
            f"Unsupported value: {effect!r}: supported values: {', '.join(TAINT_EFFECTS)}",
        )


def _validate_shared_counters(sets: list[Any], path: str, msgs: _Messages) -> None:
    if len(sets) > MAX_SHARED_COUNTER_SETS_PER_SLICE:
        msgs.add(
            path,
            f"Too many: {len(sets)}: must have at most {MAX_SHARED_COUNTER_SETS_PER_SLICE} items",
        )
    seen: set[str] = set()
    for i, counter_set in enumerate(sets):
        spath = f"{path}[{i}]"
        counter_set = _as_mapping(counter_set)
        name = counter_set.get("name")
        if not name:
            msgs.add(f"{spath}.name", "Required value")
        elif not is_dns_label(name):
            msgs.add(f"{spath}.name", f"invalid counter set name {name!r}: must be a DNS label")
        elif name in seen:
            msgs.add(f"{spath}.name", f"Duplicate value: {name!r}")
        else:
            seen.add(name)
        _validate_counter_map(
            counter_set.get("counters"), f"{spath}.counters", MAX_COUNTERS_PER_SET, msgs
        )


# --- pools ------------------------------------------------------------------------------------


def _slice_label(obj: Mapping[str, Any], index: int) -> str:
    name = _as_mapping(obj.get("metadata")).get("name")
    return f"slices[{index}]({name})" if name else f"slices[{index}]"


def newest_generation(slices: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The slices that carry the highest ``spec.pool.generation`` (the ones that count)."""
    items = list(slices)
    generations = [
        _as_mapping(_as_mapping(s.get("spec")).get("pool")).get("generation") for s in items
    ]
    numeric = [g for g in generations if isinstance(g, int) and not isinstance(g, bool)]
    if not numeric:
        return items
    top = max(numeric)
    return [s for s, g in zip(items, generations, strict=True) if g == top]


def validate_pool(slices: list[Mapping[str, Any]]) -> list[str]:
    """Cross-slice rules of one pool, over the slices of its newest generation: one driver and
    pool name, one resourceSliceCount, device names unique across slices, counter set names
    unique, and every consumesCounters entry naming an existing counter set and counter."""
    msgs = _Messages()
    current = newest_generation(slices)
    index_of = {id(s): i for i, s in enumerate(slices)}
    identities = {
        (
            _as_mapping(s.get("spec")).get("driver"),
            _as_mapping(_as_mapping(s.get("spec")).get("pool")).get("name"),
        )
        for s in current
    }
    if len(identities) > 1:
        msgs.add(
            "slices", f"must all belong to one driver and pool, got {sorted(map(str, identities))}"
        )
    counts = {
        _as_mapping(_as_mapping(s.get("spec")).get("pool")).get("resourceSliceCount")
        for s in current
    }
    if len(counts) > 1:
        msgs.add("slices", f"disagree on spec.pool.resourceSliceCount: {sorted(map(str, counts))}")

    counter_sets: dict[str, dict[str, Decimal | None]] = {}
    device_owner: dict[str, str] = {}
    for s in current:
        label = _slice_label(s, index_of[id(s)])
        spec = _as_mapping(s.get("spec"))
        for j, cs in enumerate(_as_list(spec.get("sharedCounters"))):
            name = _as_mapping(cs).get("name")
            if not isinstance(name, str):
                continue
            if name in counter_sets:
                msgs.add(
                    f"{label}.spec.sharedCounters[{j}].name", f"Duplicate value in pool: {name!r}"
                )
                continue
            counter_sets[name] = {
                str(k): _quantity(_as_mapping(v).get("value"))
                for k, v in _as_mapping(_as_mapping(cs).get("counters")).items()
            }
        for j, device in enumerate(_as_list(spec.get("devices"))):
            name = _as_mapping(device).get("name")
            if not isinstance(name, str):
                continue
            if name in device_owner:
                msgs.add(
                    f"{label}.spec.devices[{j}].name",
                    f"Duplicate value in pool: {name!r} (also in {device_owner[name]})",
                )
            else:
                device_owner[name] = label
    for s in current:
        label = _slice_label(s, index_of[id(s)])
        for j, device in enumerate(_as_list(_as_mapping(s.get("spec")).get("devices"))):
            for k, entry in enumerate(_as_list(_as_mapping(device).get("consumesCounters"))):
                epath = f"{label}.spec.devices[{j}].consumesCounters[{k}]"
                set_name = _as_mapping(entry).get("counterSet")
                if set_name not in counter_sets:
                    msgs.add(
                        f"{epath}.counterSet",
                        f"counter set {set_name!r} does not exist in the pool",
                    )
                    continue
                for counter in _as_mapping(_as_mapping(entry).get("counters")):
                    if counter not in counter_sets[str(set_name)]:
                        msgs.add(
                            f"{epath}.counters[{counter}]",
                            f"counter {counter!r} does not exist in counter set {set_name!r}",
                        )
    return msgs.items
