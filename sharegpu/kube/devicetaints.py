"""DeviceTaintRules (``resource.k8s.io/v1``, GA in Kubernetes 1.37): one taint for every device
its selector matches.

A rule's ``spec.deviceSelector`` names a ``driver``, ``pool`` and ``device``; each one set must
equal the device's, an empty selector matches every device and a rule without a selector
matches none. A matching rule's ``spec.taint`` counts exactly as a taint the device carries in
its ResourceSlice: :func:`with_rule_taints` appends it to the device's ``taints`` (the slices
given are never changed), marked with the rule's name under :data:`RULE_FIELD` so that
explanations can name the rule. Only well-formed rules count (:func:`validate_device_taint_rule`
finds nothing wrong); the API server refuses the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from api.jsontypes import ObjView as Obj
from sharegpu.kube.slicerules import (
    MAX_DRIVER_NAME_LENGTH,
    is_dns_label,
    is_dns_subdomain,
    is_pool_name,
    taint_problems,
)

DEVICE_TAINT_RULE_KIND: Final = "DeviceTaintRule"
#: The field of an applied taint that names the DeviceTaintRule it comes from.
RULE_FIELD: Final = "deviceTaintRule"
#: The selector's fields, each compared with the device's driver, pool and name.
SELECTOR_FIELDS: Final = ("driver", "pool", "device")
#: Most status conditions a rule may carry (as upstream bounds them).
MAX_RULE_CONDITIONS: Final = 8


def _is_driver_name(value: object) -> bool:
    return is_dns_subdomain(value, MAX_DRIVER_NAME_LENGTH)


#: Per selector field: its check and what it must be.
_SELECTOR_CHECKS: Final[tuple[tuple[str, Callable[[object], bool], str], ...]] = (
    ("driver", _is_driver_name, "a DNS subdomain of at most 63 characters"),
    ("pool", is_pool_name, "a pool name (DNS subdomains separated by slashes)"),
    ("device", is_dns_label, "a DNS label"),
)


def rule_name(rule: Obj) -> str:
    """``metadata.name`` of a rule ("" when absent)."""
    name = (rule.get("metadata") or {}).get("name")
    return name if isinstance(name, str) else ""


def validate_device_taint_rule(rule: Obj) -> list[str]:
    """``path: message`` for each problem of a DeviceTaintRule's spec and status, as the API
    server reports them: selector fields (driver a DNS subdomain of at most 63 characters, pool
    a pool name, device a DNS label), the taint (qualified key, label value, effect one of None,
    NoSchedule, NoExecute) and at most 8 status conditions."""
    problems: list[str] = []
    spec = rule.get("spec")
    if not isinstance(spec, Mapping):
        return ["spec: Required value"]
    selector = spec.get("deviceSelector")
    if selector is not None and not isinstance(selector, Mapping):
        problems.append("spec.deviceSelector: must be an object")
    elif isinstance(selector, Mapping):
        for field, ok, what in _SELECTOR_CHECKS:
            value = selector.get(field)
            if value is not None and not ok(value):
                problems.append(
                    f"spec.deviceSelector.{field}: invalid value {value!r}: must be {what}"
                )
    taint = spec.get("taint")
    if not isinstance(taint, Mapping):
        problems.append("spec.taint: Required value")
    else:
        problems += taint_problems(taint, "spec.taint")
    conditions = (rule.get("status") or {}).get("conditions")
    if isinstance(conditions, list) and len(conditions) > MAX_RULE_CONDITIONS:
        problems.append(
            f"status.conditions: Too many: {len(conditions)}: must have at most "
            f"{MAX_RULE_CONDITIONS} items"
        )
    return problems


def selector_matches(selector: Mapping[str, Any], driver: str, pool: str, device: str) -> bool:
    """Whether a ``deviceSelector`` matches the device ``driver``/``pool``/``device``: every
    field it sets is equal to the device's."""
    wanted = dict(zip(SELECTOR_FIELDS, (driver, pool, device), strict=True))
    return all(selector.get(f) in (None, wanted[f]) for f in SELECTOR_FIELDS)


def rule_matches(rule: Obj, driver: str, pool: str, device: str) -> bool:
    """Whether ``rule``'s selector matches the device ``driver``/``pool``/``device`` (a rule
    without a selector matches none)."""
    selector = (rule.get("spec") or {}).get("deviceSelector")
    return isinstance(selector, Mapping) and selector_matches(selector, driver, pool, device)


def valid_rules(rules: Iterable[Obj]) -> list[Obj]:
    """The well-formed rules among ``rules``, in order."""
    return [r for r in rules if isinstance(r, Mapping) and not validate_device_taint_rule(r)]


def rule_taints(rules: Sequence[Obj], driver: str, pool: str, device: str) -> list[dict[str, Any]]:
    """The taints the (well-formed) ``rules`` put on one device, each naming its rule under
    :data:`RULE_FIELD`, in rule order."""
    return [
        {**r["spec"]["taint"], RULE_FIELD: rule_name(r)}
        for r in rules
        if rule_matches(r, driver, pool, device)
    ]


def with_rule_taints(slices: Iterable[Obj], rules: Iterable[Obj]) -> list[Obj]:
    """``slices`` with the taints of the well-formed ``rules`` appended to every device they
    match. Slices and devices that no rule matches are returned as they are; the others are
    copies (the inputs are never changed)."""
    usable = valid_rules(rules)
    out: list[Obj] = []
    for s in slices:
        spec = s.get("spec") if isinstance(s, Mapping) else None
        devices = spec.get("devices") if isinstance(spec, Mapping) else None
        if not usable or not isinstance(spec, Mapping) or not isinstance(devices, list):
            out.append(s)
            continue
        driver = str(spec.get("driver") or "")
        pool = str((spec.get("pool") or {}).get("name") or "")
        changed = False
        new_devices: list[Any] = []
        for d in devices:
            added = (
                rule_taints(usable, driver, pool, str(d.get("name")))
                if isinstance(d, Mapping)
                else []
            )
            if added:
                changed = True
                d = {**d, "taints": [*(d.get("taints") or []), *added]}
            new_devices.append(d)
        out.append({**s, "spec": {**spec, "devices": new_devices}} if changed else s)
    return out
