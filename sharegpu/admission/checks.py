"""Static checks of DeviceClass, ResourceClaim and ResourceClaimTemplate objects for this driver.

The admission webhook (``controller.webhook``) and ``sharegpu validate`` both call these
functions, so a claim is judged the same way before and at admission. Each check returns
:class:`Finding` s (``error`` refuses, ``warning`` informs) with the field path of the problem;
objects are dicts in their JSON shape (``resource.k8s.io`` v1 and v1beta2, and v1beta1's flat
request). "This driver's" is a config entry whose ``opaque.driver`` is the driver, a selector
naming it, or a request whose class (:func:`is_driver_class`), selectors or qualified capacity
keys are the driver's; everything else is left to its own driver. Invariants:

- GpuConfig parameters decode with the plugin's own code (:func:`api.gpuconfig.parse_gpu_config`);
  CEL selectors compile as in Kubernetes (:mod:`sharegpu.cel`) and name only what the driver
  publishes; capacity requests fit the published ``requestPolicy`` (warnings state what the
  scheduler reserves after rounding; an amount finer than a thousandth is an error, as
  Kubernetes 1.37 cannot allocate it); a share naming only one of ``cores``/``memory`` is
  warned that the scheduler reserves the policy's default of the other (the whole GPU's memory;
  the node's ``--default-share-cores``); an MPS or Limits override above what the request
  reserves (or its ``burstLimit``) is an error (the plugin would refuse to prepare it); a
  ``burstLimit`` is judged by :func:`api.burst.limit_problems` against the request and the
  DeviceClass's ``burstPolicy`` where the caller knows the class (:data:`ClassConfigs`), and a
  claim's own ``burstPolicy`` is an error;
- the object's shape is checked first (:mod:`sharegpu.admission.shape`): wrong JSON types and
  lists, selectors or parameters past Kubernetes' limits are errors marked ``malformed`` and
  the rules are not run, so a check accepts any decoded JSON value and raises only on a defect;
- the selectors compiled per object are bounded (:data:`MAX_SELECTORS_PER_OBJECT`,
  :data:`MAX_SELECTOR_BYTES_PER_OBJECT`); past that they are not checked, with a warning
  (Kubernetes accepts such an object, so admission must not deny it).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Literal

from api import burst, names
from api.gpuconfig import DriverConfigs, GpuConfig, decode_driver_configs
from api.quantity import QuantityError, format_quantity, parse_quantity, quantity_hint
from api.sharepolicy import capacity_of_unknown_gpu
from sharegpu.admission import shape
from sharegpu.allocator.capacity import PolicyViolation, consumed_amount
from sharegpu.cel import CelCompileError, compile_selector, is_compiled
from sharegpu.cel.environment import NESTED_TOO_DEEPLY

Severity = Literal["error", "warning"]
ERROR: Final = "error"
WARNING: Final = "warning"

#: DeviceClass name -> its decoded config entries for this driver, None for a class not known
#: to the caller (then what it allows is judged when the claim is prepared).
ClassConfigs = Callable[[str], DriverConfigs | None]
#: The largest usable memory of the cluster's GPUs, None where none is known; asked only for a
#: claim with a ``burstLimit``.
LargestGpuMemory = Callable[[], int | None]

#: Attribute names this driver publishes (unqualified, under the driver's domain).
KNOWN_ATTRIBUTES: Final = frozenset(
    value
    for key, value in vars(names).items()
    if key.startswith("ATTR_") and isinstance(value, str) and "/" not in value
)
#: Capacity names this driver publishes.
KNOWN_CAPACITIES: Final = frozenset(
    value for key, value in vars(names).items() if key.startswith("CAP_") and isinstance(value, str)
)

#: Unknown capacities of one request reported each (the rest are counted in one finding).
MAX_UNKNOWN_CAPACITIES: Final = 8
#: At most this many distinct selectors naming the driver are compiled for one object.
MAX_SELECTORS_PER_OBJECT: Final = 64
#: At most this many bytes of distinct selectors naming the driver are compiled for one object
#: (compiling takes up to about 0.1 ms per byte, so about two seconds at most).
MAX_SELECTOR_BYTES_PER_OBJECT: Final = 16 * 1024

_STRING = r"""(?:'([^'\\]*)'|"([^"\\]*)")"""
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
#: ``device.attributes['domain'].name`` / ``device.capacity["domain"]["name"]``
_MEMBER_REF = re.compile(
    rf"device\s*\.\s*(attributes|capacity)\s*\[\s*{_STRING}\s*\]\s*"
    rf"(?:\.\s*({_IDENT})|\[\s*{_STRING}\s*\])"
)
#: ``'name' in device.attributes['domain']``
_IN_REF = re.compile(rf"{_STRING}\s+in\s+device\s*\.\s*(attributes|capacity)\s*\[\s*{_STRING}\s*\]")


def not_checked_reason(exc: CelCompileError) -> str | None:
    """Why a compile error may not be one in Kubernetes (None: a real compile error).

    Every function of Kubernetes' CEL environment is implemented by :mod:`sharegpu.cel`, so
    the only such case left is a selector nested deeper than the compiler follows.
    """
    if exc.message == NESTED_TOO_DEEPLY:
        return "the selector is nested deeper than this check follows"
    return None


@dataclass(frozen=True)
class Finding:
    """One problem: ``path`` is the field path in the object (``spec.devices.requests[0]...``).

    ``malformed`` marks an error about the object's shape (a field of the wrong JSON type, or
    beyond one of Kubernetes' limits): no API server sends such an object.
    """

    severity: Severity
    path: str
    message: str
    malformed: bool = False

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def errors(findings: Iterable[Finding]) -> list[Finding]:
    """Only the errors."""
    return [f for f in findings if f.severity == ERROR]


def warnings(findings: Iterable[Finding]) -> list[Finding]:
    """Only the warnings."""
    return [f for f in findings if f.severity == WARNING]


def is_driver_class(class_name: str | None, driver: str, classes: Iterable[str] = ()) -> bool:
    """Whether a DeviceClass name is this driver's: listed in ``classes``, or named like the
    driver (``gpu.sharegpu.dev``, ``gpu.sharegpu.dev-shared``, ...)."""
    if not isinstance(class_name, str) or not class_name:
        return False
    return driver in class_name or class_name in (
        classes if isinstance(classes, (set, frozenset)) else set(classes)
    )


def class_selects_driver(device_class: Any, driver: str) -> bool:
    """Whether a DeviceClass object (any JSON value) is this driver's by what it selects: one
    of its ``spec.selectors`` names the driver (``device.driver == '<driver>'`` or an attribute
    of the driver's domain), whatever the class is called."""
    spec = device_class.get("spec") if isinstance(device_class, Mapping) else None
    selectors = spec.get("selectors") if isinstance(spec, Mapping) else None
    return any(selector_mentions_driver(e, driver) for e in _cel_expressions(selectors))


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    choices = sorted(known)
    match = _closest(name, choices)
    hint = f"; did you mean {match!r}?" if match else ""
    return f"{hint} (known: {', '.join(choices)})"


# --- GpuConfig -------------------------------------------------------------------------------


def check_config_entries(
    entries: Any, path: str, driver: str, decoded: DriverConfigs | None = None
) -> list[Finding]:
    """GpuConfig parameters of this driver's ``config[]`` entries (DeviceClass or claim);
    ``decoded`` is :func:`decode_driver_configs` of ``entries`` when the caller has it."""
    if not isinstance(entries, list):
        return []
    if decoded is None:
        decoded = decode_driver_configs(entries, driver)
    return [
        Finding(ERROR, f"{path}[{problem.position}].opaque.parameters", message)
        for problem in decoded.problems
        for message in problem.messages
    ]


# --- CEL selectors ---------------------------------------------------------------------------


def selector_mentions_driver(expression: str, driver: str) -> bool:
    """Whether the expression names the driver (as ``device.driver`` value or a domain)."""
    return driver in expression


def referenced_names(expression: str, driver: str) -> list[tuple[str, str]]:
    """``(kind, name)`` of every attribute/capacity of ``driver``'s domain the text names;
    ``kind`` is ``attributes`` or ``capacity``."""
    refs: list[tuple[str, str]] = []
    for m in _MEMBER_REF.finditer(expression):
        domain = m.group(2) if m.group(2) is not None else m.group(3)
        name = m.group(4) or (m.group(5) if m.group(5) is not None else m.group(6))
        if domain == driver and name:
            refs.append((m.group(1), name))
    for m in _IN_REF.finditer(expression):
        name = m.group(1) if m.group(1) is not None else m.group(2)
        domain = m.group(4) if m.group(4) is not None else m.group(5)
        if domain == driver and name:
            refs.append((m.group(3), name))
    return refs


#: A comparison operator applied to a quantity and a literal (the compile error's text).
_QUANTITY_COMPARISON = re.compile(
    r"no matching overload for '_(?:<|<=|>|>=|==|!=)_' applied to "
    r"'\((?:Quantity, (?:string|int|uint|double)|(?:string|int|uint|double), Quantity)\)'"
)
_CAPACITY_REF = (
    rf"device\s*\.\s*capacity\s*\[\s*{_STRING}\s*\]\s*(?:\.\s*{_IDENT}|\[\s*{_STRING}\s*\])"
)
_LITERAL = r"""'[^'\\]*'|"[^"\\]*"|[0-9]+(?:\.[0-9]+)?"""
_OPERATOR = r"<=|>=|==|!=|<|>"
#: ``<capacity> <op> <literal>`` and ``<literal> <op> <capacity>``.
_CAPACITY_VS_LITERAL = re.compile(
    rf"(?P<cap>{_CAPACITY_REF})\s*(?P<op>{_OPERATOR})\s*(?P<lit>{_LITERAL})"
    rf"|(?P<lit2>{_LITERAL})\s*(?P<op2>{_OPERATOR})\s*(?P<cap2>{_CAPACITY_REF})"
)
_MIRRORED: Final = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


def _compare_to(match: re.Match[str]) -> str:
    """One capacity comparison rewritten with ``compareTo(quantity(...))``."""
    if match.group("cap") is not None:
        cap, op, literal = match.group("cap"), match.group("op"), match.group("lit")
    else:
        cap, op, literal = match.group("cap2"), _MIRRORED[match.group("op2")], match.group("lit2")
    text = literal if literal[0] in "'\"" else f"'{literal}'"
    return f"{cap}.compareTo(quantity({text})) {op} 0"


def quantity_comparison_hint(expression: str, message: str) -> str | None:
    """The rewrite of a selector that compares a capacity (a quantity) with a string or number
    (``device.capacity['d'].memory >= '70Gi'``), which CEL has no operator for:
    ``device.capacity['d'].memory.compareTo(quantity('70Gi')) >= 0``. Only offered for such a
    compile error, and only when the rewritten selector compiles; else None."""
    if _QUANTITY_COMPARISON.search(message) is None:
        return None
    rewritten = _CAPACITY_VS_LITERAL.sub(_compare_to, expression)
    if rewritten == expression:
        return None
    try:
        compile_selector(rewritten)
    except CelCompileError:
        return None
    return f"capacities are quantities; compare them with compareTo: {rewritten}"


def compile_findings(expression: str, path: str) -> list[Finding]:
    """The compile error of a CEL selector, if any: an error, or a not-checked warning where
    Kubernetes' CEL accepts what the compiler here does not (:func:`not_checked_reason`). An
    error gets the rewrite of :func:`quantity_comparison_hint` where one applies. A selector
    whose estimated cost is above Kubernetes' limit is an error, as the API server refuses it.
    The selector compiles in the StoredExpressions environment (every feature gate on), so no
    gate of the cluster makes the check refuse what the API server accepts."""
    try:
        compile_selector(expression).check_cost()
    except CelCompileError as exc:
        where = f"{exc.line}:{exc.column}: " if exc.line is not None else ""
        unchecked = not_checked_reason(exc)
        if unchecked is not None:
            return [Finding(WARNING, path, f"not checked: {unchecked} ({where}{exc.message})")]
        hint = quantity_comparison_hint(expression, exc.message)
        tail = f"; {hint}" if hint else ""
        return [Finding(ERROR, path, f"CEL compile error: {where}{exc.message}{tail}")]
    return []


def check_selector(expression: Any, path: str, driver: str) -> list[Finding]:
    """Compile errors and unknown names of a CEL selector that mentions this driver."""
    if not isinstance(expression, str) or not selector_mentions_driver(expression, driver):
        return []
    compiled = compile_findings(expression, path)
    if compiled:
        return compiled
    findings: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    for kind, name in referenced_names(expression, driver):
        if (kind, name) in seen:
            continue
        seen.add((kind, name))
        known = KNOWN_ATTRIBUTES if kind == "attributes" else KNOWN_CAPACITIES
        if name not in known:
            what = "attribute" if kind == "attributes" else "capacity"
            findings.append(
                Finding(
                    ERROR,
                    path,
                    f"{driver} publishes no {what} {name!r}{_did_you_mean(name, known)}",
                )
            )
    return findings


def _expressions(selectors: Any) -> Iterator[tuple[int, str]]:
    """``(index, expression)`` of the CEL selectors of a ``selectors[]`` list."""
    for i, selector in enumerate(selectors if isinstance(selectors, list) else []):
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        if isinstance(expression, str):
            yield i, expression


def check_selectors(selectors: Any, path: str, driver: str) -> list[Finding]:
    """:func:`check_selector` over a ``selectors[]`` list."""
    findings: list[Finding] = []
    for i, expression in _expressions(selectors):
        findings += check_selector(expression, f"{path}[{i}].cel.expression", driver)
    return findings


# --- capacity requests -----------------------------------------------------------------------


def _capacity_name(key: str, driver: str) -> str | None:
    """The unqualified name of a capacity key of this driver (None: another domain)."""
    if "/" not in key:
        return key
    domain, _, name = key.partition("/")
    return name if domain == driver else None


def check_capacity_requests(requests: Any, path: str, driver: str) -> list[Finding]:
    """``capacity.requests`` of one of this driver's requests, against the requestPolicy."""
    if not isinstance(requests, Mapping) or not requests:
        return []
    findings: list[Finding] = []
    asked: dict[str, Any] = {}
    #: Capacities requested with a text that is not a quantity: asked for, but not readable.
    unreadable: set[str] = set()
    unknown = 0
    for key, raw in requests.items():
        name = _capacity_name(str(key), driver)
        if name is None:
            continue
        where = f"{path}[{key}]"
        if name != key and name in KNOWN_CAPACITIES:
            # kube-scheduler looks capacity names up exactly as the device publishes them.
            findings.append(
                Finding(
                    WARNING,
                    where,
                    f"{driver} devices publish the capacity {name!r}, not {key!r}: kube-scheduler "
                    f"matches capacity names exactly, so no device of {driver} can be allocated "
                    f"for this request; write {name!r}",
                )
            )
        if name not in KNOWN_CAPACITIES:
            unknown += 1
            if unknown > MAX_UNKNOWN_CAPACITIES:
                continue
            findings.append(
                Finding(
                    ERROR,
                    where,
                    f"{driver} devices have no capacity {name!r}"
                    f"{_did_you_mean(name, KNOWN_CAPACITIES)}",
                )
            )
            continue
        try:
            value = parse_quantity(raw)
        except QuantityError as exc:
            findings.append(Finding(ERROR, where, quantity_hint(raw) or str(exc)))
            unreadable.add(name)
            continue
        asked[name] = value
        if value * 1000 != int(value * 1000):
            findings.append(
                Finding(
                    ERROR,
                    where,
                    f"{raw} is finer than a thousandth: Kubernetes 1.37 rounds {name} to the "
                    "GPU's request policy in thousandths (milli-units) and refuses to allocate "
                    "a request it cannot round; use at most three decimals (or the m suffix)",
                )
            )
        elif name == names.CAP_CORES:
            findings += _check_cores(value, where)
        elif name == names.CAP_MEMORY:
            findings += _check_memory(value, where)
    if unknown > MAX_UNKNOWN_CAPACITIES:
        findings.append(
            Finding(
                ERROR,
                path,
                f"and {unknown - MAX_UNKNOWN_CAPACITIES} more capacities {driver} devices do "
                "not have",
            )
        )
    requested = asked.keys() | unreadable
    if (names.CAP_CORES in requested) != (names.CAP_MEMORY in requested):
        given, missing = (
            (names.CAP_CORES, names.CAP_MEMORY)
            if names.CAP_CORES in requested
            else (names.CAP_MEMORY, names.CAP_CORES)
        )
        reserved = (
            "the GPU's default cores (all 100 unless the node's plugin runs with "
            "--default-share-cores)"
            if missing == names.CAP_CORES
            else f"the whole GPU's {missing}"
        )
        findings.append(
            Finding(
                WARNING,
                path,
                f"{given} requested without {missing}: the scheduler reserves {reserved}, so no "
                f"other share may fit on that GPU; request {missing} too",
            )
        )
    return findings


def _check_cores(value: Any, where: str) -> list[Finding]:
    top = names.CORES_PER_GPU
    if value <= 0:
        return [Finding(ERROR, where, f"cores must be positive (got {value})")]
    if value > top:
        return [Finding(ERROR, where, f"cores must be between 1 and {top} (got {value})")]
    reserved = reserved_cores(value)
    if reserved is not None and reserved != value:
        return [
            Finding(
                WARNING,
                where,
                f"cores are whole percent of the GPU, at least 1: {value} is reserved as "
                f"{reserved}",
            )
        ]
    return []


def reserved_memory(requested: Decimal | int) -> int:
    """Bytes the scheduler reserves for a memory request of ``requested`` bytes (exact,
    fractions included) on any GPU: the request policy's rounding
    (:func:`~api.sharepolicy.capacity_of_unknown_gpu`), at least one 256Mi step."""
    memory = capacity_of_unknown_gpu()[names.CAP_MEMORY]
    got = consumed_amount(names.CAP_MEMORY, memory, requested, "memory")
    assert not isinstance(got, PolicyViolation)  # a range without max allows every rounding
    return int(got)


def reserved_cores(requested: Decimal | int) -> int | None:
    """Cores the scheduler reserves for a cores request (exact, fractions included): the
    request policy's rounding, a whole core and at least 1 (``150m`` is 1); None above the
    most one share may ask."""
    cores = capacity_of_unknown_gpu()[names.CAP_CORES]
    got = consumed_amount(names.CAP_CORES, cores, requested, "cores")
    return None if isinstance(got, PolicyViolation) else int(got)


def _check_memory(value: Any, where: str) -> list[Finding]:
    if value <= 0:
        return [Finding(ERROR, where, f"memory must be positive (got {value})")]
    reserved = reserved_memory(value)
    if reserved != value:
        shown = format_quantity(int(value)) if value == int(value) else str(value)
        return [
            Finding(
                WARNING,
                where,
                f"memory is granted in 256Mi steps: {shown} is reserved "
                f"as {format_quantity(reserved)}",
            )
        ]
    return []


# --- GpuConfig overrides against the share ------------------------------------------------


def _reserved_share(requests: Mapping[str, Any], driver: str) -> tuple[int | None, int | None]:
    """(cores, memory bytes) a request's capacity asks reserve; None where not asked."""
    cores: int | None = None
    memory: int | None = None
    for key, raw in requests.items():
        name = _capacity_name(str(key), driver)
        if name not in (names.CAP_CORES, names.CAP_MEMORY):
            continue
        try:
            value = parse_quantity(raw)
        except QuantityError:
            continue
        if value <= 0:
            continue  # check_capacity_requests reports it
        if name == names.CAP_CORES:
            cores = reserved_cores(value)
        else:
            memory = reserved_memory(value)
    return cores, memory


def _applicable_entry(decoded: DriverConfigs, request: str) -> tuple[int, GpuConfig] | None:
    """Position and decoded config of the claim's last own config entry for ``request``; None
    when none applies or an applicable entry is invalid (check_config_entries reports it)."""
    if any(p.applies_to(request) for p in decoded.problems):
        return None
    applicable = [e for e in decoded.entries if e.applies_to(request)]
    if not applicable:
        return None
    last = max(applicable, key=lambda e: e.position)
    return last.position, last.config


def check_overrides_fit_share(
    request: str,
    capacity: Any,
    entries: Any,
    path: str,
    driver: str,
    decoded: DriverConfigs | None = None,
) -> list[Finding]:
    """Errors for MPS/Limits overrides in the claim's config above the request's share;
    ``decoded`` is :func:`decode_driver_configs` of ``entries`` when the caller has it."""
    if not isinstance(capacity, Mapping) or not isinstance(entries, list):
        return []
    cores, memory = _reserved_share(capacity, driver)
    if decoded is None:
        decoded = decode_driver_configs(entries, driver)
    applicable = _applicable_entry(decoded, request)
    if applicable is None or applicable[1].sharing is None:
        return []
    position, config = applicable
    sharing = config.sharing
    assert sharing is not None
    where = f"{path}[{position}].opaque.parameters"
    limit = sharing.burst_limit
    limited = " (its burstLimit)" if limit is not None else ""
    if limit is not None and cores is not None:
        cores = burst.share_caps(sharing, cores, 0)[0]
    if limit is not None and memory is not None:
        memory = burst.share_caps(sharing, names.CORES_PER_GPU, memory)[1]
    checks: list[tuple[str, int | None, int | None, str]] = []
    if sharing.mps is not None:
        checks += [
            (
                "sharing.mps.activeThreadPercentage",
                sharing.mps.active_thread_percentage,
                cores,
                "cores",
            ),
            (
                "sharing.mps.pinnedMemoryLimit",
                sharing.mps.pinned_memory_limit_bytes(),
                memory,
                "memory",
            ),
        ]
    if sharing.limits is not None:
        checks += [
            ("sharing.limits.smLimit", sharing.limits.sm_limit, cores, "cores"),
            (
                "sharing.limits.deviceMemoryLimit",
                sharing.limits.device_memory_limit_bytes(),
                memory,
                "memory",
            ),
        ]
    findings: list[Finding] = []
    for field, value, reserved, what in checks:
        if value is None or reserved is None or value <= reserved:
            continue
        shown = (
            (str(value), str(reserved))
            if what == "cores"
            else (format_quantity(value), format_quantity(reserved))
        )
        findings.append(
            Finding(
                ERROR,
                where,
                f"{field} {shown[0]} is above the {shown[1]} {what} request {request!r} "
                f"reserves{limited}; the kubelet plugin would refuse to prepare the claim",
            )
        )
    return findings


# --- burstable shares -----------------------------------------------------------------------


def check_burst_limit(
    request: str,
    req: Mapping[str, Any],
    path: str,
    driver: str,
    decoded: DriverConfigs,
    class_configs: ClassConfigs | None = None,
    largest_gpu_memory: LargestGpuMemory | None = None,
) -> list[Finding]:
    """The ``burstLimit`` of the claim's config entry for ``request`` (``req``: its exact
    request or subrequest) against what the request reserves, the largest GPU's usable memory
    (where ``largest_gpu_memory`` knows it) and what its DeviceClass allows
    (:func:`api.burst.limit_problems`). A class ``class_configs`` does not know gets a warning:
    the node judges its ``burstPolicy`` at prepare."""
    applicable = _applicable_entry(decoded, request)
    if applicable is None or applicable[1].sharing is None:
        return []
    position, config = applicable
    sharing = config.sharing
    if sharing is None or sharing.burst_limit is None:
        return []
    capacity = _capacity_requests(req)
    cores, memory = _reserved_share(capacity if isinstance(capacity, Mapping) else {}, driver)
    name = req.get("deviceClassName")
    class_name = name if isinstance(name, str) and name else None
    known = class_configs(class_name) if class_configs is not None and class_name else None
    where = f"{path}[{position}].opaque.parameters"
    largest = largest_gpu_memory() if largest_gpu_memory is not None else None
    if known is None:
        problems = burst.limit_problems(
            sharing,
            burst.ClassPolicy(compute=True, memory=True),
            cores=cores,
            memory=memory,
            gpu_memory=largest,
            gpu="the largest GPU's",
        )
        findings = [Finding(ERROR, where, p) for p in problems]
        if not findings:
            shown = f"DeviceClass {class_name!r}" if class_name else "the request's DeviceClass"
            findings.append(
                Finding(
                    WARNING,
                    where,
                    f"{burst.FIELD_LIMIT}: {shown} is not known here, so whether it allows "
                    f"the burst of request {request!r} is checked when the claim is prepared",
                )
            )
        return findings
    policy = burst.class_policy(known.entries, request)
    problems = burst.limit_problems(
        sharing,
        policy,
        cores=cores,
        memory=memory,
        gpu_memory=largest,
        gpu="the largest GPU's",
        class_name=class_name,
    )
    return [Finding(ERROR, where, p) for p in problems]


def check_claim_burst_policy(decoded: DriverConfigs, path: str) -> list[Finding]:
    """Errors for a claim's own config entries that set ``burstPolicy``."""
    return [
        Finding(ERROR, f"{path}[{position}].opaque.parameters", message)
        for position, message in burst.claim_policy_problems(decoded.entries)
    ]


def check_class_burst(
    entries: Any, path: str, driver: str, class_name: str | None
) -> list[Finding]:
    """A DeviceClass whose config sets a ``burstLimit`` its own ``burstPolicy`` does not
    allow (every request of the class would be refused at prepare)."""
    if not isinstance(entries, list):
        return []
    decoded = decode_driver_configs(entries, driver)
    findings: list[Finding] = []
    policy = burst.class_policy(decoded.entries, "")
    for entry in decoded.entries:
        for problem in burst.limit_problems(
            entry.config.sharing, policy, cores=None, memory=None, class_name=class_name
        ):
            findings.append(Finding(ERROR, f"{path}[{entry.position}].opaque.parameters", problem))
    return findings


# --- request fields in the wrong place (for ``sharegpu validate``) -------------------------

#: The fields of an ``exactly`` request (``ExactDeviceRequest``, resource.k8s.io v1/v1beta2).
EXACT_REQUEST_FIELDS: Final = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)
#: The fields of a request in resource.k8s.io v1 and v1beta2 (``DeviceRequest``).
REQUEST_FIELDS: Final = ("name", "exactly", "firstAvailable")
#: The fields of a ``firstAvailable`` subrequest (``DeviceSubRequest``).
SUBREQUEST_FIELDS: Final = ("name", *(f for f in EXACT_REQUEST_FIELDS if f != "adminAccess"))
#: The fields of a request in resource.k8s.io v1beta1 (the flat request).
V1BETA1_REQUEST_FIELDS: Final = ("name", "firstAvailable", *EXACT_REQUEST_FIELDS)
#: API versions of resource.k8s.io whose requests put the exact fields under ``exactly``.
EXACTLY_VERSIONS: Final = ("resource.k8s.io/v1", "resource.k8s.io/v1beta2")
_EXACTLY_LIST: Final = "deviceClassName, count, selectors and capacity"


def _closest(name: str, known: Iterable[str]) -> str | None:
    """The known name equal to ``name`` but for case, else the closest one (difflib), else
    None: the one did-you-mean rule of the checks."""
    choices = sorted(known)
    match = {c.lower(): c for c in choices}.get(name.lower())
    if match is None:
        close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
        match = close[0] if close else None
    return match


def _unknown_field_hints(
    value: Any, path: str, known: tuple[str, ...], what: str, misplaced: str | None = None
) -> list[Finding]:
    """One error per key of ``value`` that ``known`` lacks; ``misplaced`` (when given) is the
    message for keys that belong to an ``exactly`` request."""
    if not isinstance(value, Mapping):
        return []
    findings: list[Finding] = []
    moved = [str(k) for k in value if k in EXACT_REQUEST_FIELDS and k not in known]
    if moved and misplaced is not None:
        findings.append(Finding(ERROR, path, f"{', '.join(moved)}: {misplaced}"))
    for key in (str(k) for k in value):
        if key in known or key in moved:
            continue
        match = _closest(key, known)
        hint = f"; did you mean {match!r}?" if match else ""
        findings.append(
            Finding(
                ERROR,
                path,
                f"{key!r} is not a field of {what}{hint} (fields: {', '.join(known)})",
            )
        )
    return findings


def request_field_hints(obj: Mapping[str, Any]) -> list[Finding]:
    """Errors for request fields that the ``resource.k8s.io`` version of a ResourceClaim or
    ResourceClaimTemplate does not have, saying where they belong: v1beta1's flat request in a
    v1 or v1beta2 object (``deviceClassName``, ``count``, ... directly in the request) must go
    under ``exactly``; a near miss (``exact``, ``Exactly``) gets a did-you-mean.

    These fields are unknown to the API server, which refuses them (strict field validation)
    or drops them before a webhook sees the object, so only ``sharegpu validate`` calls this,
    to explain its schema error; the admission webhook never does. Objects of other versions
    and kinds, and fields of the wrong shape, have no hints."""
    version = obj.get("apiVersion")
    kind = obj.get("kind")
    spec = obj.get("spec")
    path = "spec"
    if kind == "ResourceClaimTemplate" and isinstance(spec, Mapping):
        spec, path = spec.get("spec"), "spec.spec"
    elif kind != "ResourceClaim":
        return []
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    if not isinstance(requests, list):
        return []
    flat = version not in EXACTLY_VERSIONS
    known = V1BETA1_REQUEST_FIELDS if flat else REQUEST_FIELDS
    misplaced = None if flat else f"in {version}, put {_EXACTLY_LIST} under `exactly:`"
    findings: list[Finding] = []
    for i, req in enumerate(requests):
        where = f"{path}.devices.requests[{i}]"
        findings += _unknown_field_hints(req, where, known, "a request", misplaced)
        if not isinstance(req, Mapping):
            continue
        if not flat:
            findings += _unknown_field_hints(
                req.get("exactly"), f"{where}.exactly", EXACT_REQUEST_FIELDS, "`exactly`"
            )
        subrequests = req.get("firstAvailable")
        for j, sub in enumerate(subrequests if isinstance(subrequests, list) else []):
            findings += _unknown_field_hints(
                sub, f"{where}.firstAvailable[{j}]", SUBREQUEST_FIELDS, "a subrequest"
            )
    return findings


# --- requests and whole objects --------------------------------------------------------------


def _capacity_requests(req: Mapping[str, Any]) -> Any:
    """``capacity.requests`` of a request (None where absent or not an object)."""
    capacity = req.get("capacity")
    return capacity.get("requests") if isinstance(capacity, Mapping) else None


def _request_is_ours(req: Mapping[str, Any], driver: str, classes: Iterable[str]) -> bool:
    if is_driver_class(req.get("deviceClassName"), driver, classes):
        return True
    if any(selector_mentions_driver(e, driver) for _, e in _expressions(req.get("selectors"))):
        return True
    caps = _capacity_requests(req)
    return isinstance(caps, Mapping) and any(str(k).startswith(f"{driver}/") for k in caps)


def check_exact_request(
    req: Any, path: str, driver: str, classes: Iterable[str] = ()
) -> list[Finding]:
    """Selectors and capacity of one ``exactly`` request or ``firstAvailable`` subrequest."""
    if not isinstance(req, Mapping):
        return []
    findings = check_selectors(req.get("selectors"), f"{path}.selectors", driver)
    if _request_is_ours(req, driver, classes):
        findings += check_capacity_requests(
            _capacity_requests(req), f"{path}.capacity.requests", driver
        )
    return findings


def _exact_requests(spec: Mapping[str, Any], path: str) -> Iterator[tuple[str, str, Any]]:
    """``(request name, path, request)`` of every ``exactly`` request, ``firstAvailable``
    subrequest (named ``request/subrequest``) and flat v1beta1 request of a claim spec."""
    devices = spec.get("devices")
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    for i, req in enumerate(requests if isinstance(requests, list) else []):
        if not isinstance(req, Mapping):
            continue
        where = f"{path}.devices.requests[{i}]"
        name = req.get("name")
        name = name if isinstance(name, str) else ""
        if req.get("exactly") is not None:
            yield name, f"{where}.exactly", req["exactly"]
        subrequests = req.get("firstAvailable")
        for j, sub in enumerate(subrequests if isinstance(subrequests, list) else []):
            sub_name = sub.get("name") if isinstance(sub, Mapping) else None
            full_name = f"{name}/{sub_name}" if isinstance(sub_name, str) else f"{name}/"
            yield full_name, f"{where}.firstAvailable[{j}]", sub
        if "deviceClassName" in req:  # v1beta1: the request itself
            yield name, where, req


def _claim_spec_selectors(spec: Mapping[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """``(path, expression)`` of every CEL selector of a claim spec's requests."""
    for _, where, req in _exact_requests(spec, path):
        if isinstance(req, Mapping):
            for i, expression in _expressions(req.get("selectors")):
                yield f"{where}.selectors[{i}].cel.expression", expression


def selector_budget_findings(
    selectors: Iterable[tuple[str, str]], path: str, driver: str
) -> list[Finding]:
    """A "not checked" warning at ``path`` when the distinct selectors naming ``driver`` (those
    the checks compile) are more than :data:`MAX_SELECTORS_PER_OBJECT` or longer than
    :data:`MAX_SELECTOR_BYTES_PER_OBJECT` bytes in total; nothing is compiled to find out, and
    the caller then skips the checks that compile them."""
    distinct = {e for _, e in selectors if selector_mentions_driver(e, driver)}
    total = sum(shape.utf8_length(e) for e in distinct)
    if len(distinct) <= MAX_SELECTORS_PER_OBJECT and total <= MAX_SELECTOR_BYTES_PER_OBJECT:
        return []
    return [
        Finding(
            WARNING,
            path,
            f"not checked: the object has {len(distinct)} distinct selectors naming {driver}, "
            f"{total} bytes in all; the admission check compiles at most "
            f"{MAX_SELECTORS_PER_OBJECT} selectors and {MAX_SELECTOR_BYTES_PER_OBJECT} bytes of "
            "them per object (share selectors through a DeviceClass or split the object to have "
            "them checked)",
        )
    ]


def _cel_expressions(value: Any) -> Iterator[str]:
    """Every string at ``cel.expression`` anywhere in a decoded JSON value, whatever its
    shape (iterative, so any depth the decoder allowed)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            cel = node.get("cel")
            if isinstance(cel, Mapping) and isinstance(cel.get("expression"), str):
                yield cel["expression"]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def uncompiled_selector_bytes(obj: Any, driver: str) -> int:
    """The bytes of the distinct selectors naming ``driver`` in ``obj`` (any JSON value) that
    are not compiled yet: the compile work a check of ``obj`` may cost (0: the checks only
    read cached programs). Reads no more than the object; compiles nothing."""
    distinct = {e for e in _cel_expressions(obj) if selector_mentions_driver(e, driver)}
    return sum(shape.utf8_length(e) for e in distinct if not is_compiled(e))


def _malformed(node: shape.Node, value: Any, path: str) -> list[Finding]:
    """The shape problems of ``value`` as malformed errors."""
    return [
        Finding(ERROR, p.path, p.message, malformed=True) for p in shape.problems(node, value, path)
    ]


def _claim_spec_rules(
    spec: Mapping[str, Any],
    path: str,
    driver: str,
    classes: Iterable[str],
    class_configs: ClassConfigs | None = None,
    largest_gpu_memory: LargestGpuMemory | None = None,
) -> list[Finding]:
    """The rules of a claim spec whose shape is right."""
    budget = selector_budget_findings(_claim_spec_selectors(spec, path), path, driver)
    if budget:
        return budget
    devices = spec.get("devices")
    entries = devices.get("config") if isinstance(devices, Mapping) else None
    config_path = f"{path}.devices.config"
    decoded = decode_driver_configs(entries, driver) if isinstance(entries, list) else None
    findings: list[Finding] = []
    for request_name, sub_path, sub_req in _exact_requests(spec, path):
        findings += check_exact_request(sub_req, sub_path, driver, classes)
        if isinstance(sub_req, Mapping) and _request_is_ours(sub_req, driver, classes):
            findings += check_overrides_fit_share(
                request_name, _capacity_requests(sub_req), entries, config_path, driver, decoded
            )
            if decoded is not None:
                findings += check_burst_limit(
                    request_name,
                    sub_req,
                    config_path,
                    driver,
                    decoded,
                    class_configs,
                    largest_gpu_memory,
                )
    findings += check_config_entries(entries, config_path, driver, decoded)
    if decoded is not None:
        findings += check_claim_burst_policy(decoded, config_path)
    return findings


def _checked(
    obj: Any, node: shape.Node, rules: Callable[[Mapping[str, Any]], list[Finding]]
) -> list[Finding]:
    """The shape problems of ``obj`` if it has any, else ``rules(obj)`` (which may then read
    every field ``node`` describes as having its type)."""
    malformed = _malformed(node, obj, "")
    if malformed or not isinstance(obj, Mapping):
        return malformed
    return rules(obj)


def check_resource_claim(
    obj: Mapping[str, Any],
    driver: str,
    classes: Iterable[str] = (),
    class_configs: ClassConfigs | None = None,
    largest_gpu_memory: LargestGpuMemory | None = None,
) -> list[Finding]:
    """A ResourceClaim (``class_configs``: the DeviceClasses the caller knows;
    ``largest_gpu_memory``: the largest usable memory of the cluster's GPUs)."""

    def rules(claim: Mapping[str, Any]) -> list[Finding]:
        spec = claim.get("spec")
        if not isinstance(spec, Mapping):
            return []
        return _claim_spec_rules(spec, "spec", driver, classes, class_configs, largest_gpu_memory)

    return _checked(obj, shape.RESOURCE_CLAIM, rules)


def check_resource_claim_template(
    obj: Mapping[str, Any],
    driver: str,
    classes: Iterable[str] = (),
    class_configs: ClassConfigs | None = None,
    largest_gpu_memory: LargestGpuMemory | None = None,
) -> list[Finding]:
    """A ResourceClaimTemplate (its ``spec.spec`` is a ResourceClaimSpec)."""

    def rules(template: Mapping[str, Any]) -> list[Finding]:
        spec = template.get("spec")
        inner = spec.get("spec") if isinstance(spec, Mapping) else None
        if not isinstance(inner, Mapping):
            return []
        return _claim_spec_rules(
            inner, "spec.spec", driver, classes, class_configs, largest_gpu_memory
        )

    return _checked(obj, shape.RESOURCE_CLAIM_TEMPLATE, rules)


def check_device_class(obj: Mapping[str, Any], driver: str) -> list[Finding]:
    """A DeviceClass: selectors and this driver's config entries."""

    def rules(device_class: Mapping[str, Any]) -> list[Finding]:
        spec = device_class.get("spec")
        if not isinstance(spec, Mapping):
            return []
        selectors = spec.get("selectors")
        located = ((f"spec.selectors[{i}].cel.expression", e) for i, e in _expressions(selectors))
        budget = selector_budget_findings(located, "spec.selectors", driver)
        if budget:
            return budget
        metadata = device_class.get("metadata")
        name = metadata.get("name") if isinstance(metadata, Mapping) else None
        return (
            check_selectors(selectors, "spec.selectors", driver)
            + check_config_entries(spec.get("config"), "spec.config", driver)
            + check_class_burst(
                spec.get("config"), "spec.config", driver, name if isinstance(name, str) else None
            )
        )

    return _checked(obj, shape.DEVICE_CLASS, rules)


def check_object(
    obj: Mapping[str, Any],
    driver: str,
    classes: Iterable[str] = (),
    class_configs: ClassConfigs | None = None,
    largest_gpu_memory: LargestGpuMemory | None = None,
) -> list[Finding]:
    """Dispatch on ``kind``; other kinds have nothing to check here."""
    kind = obj.get("kind") if isinstance(obj, Mapping) else None
    if kind == "ResourceClaim":
        return check_resource_claim(obj, driver, classes, class_configs, largest_gpu_memory)
    if kind == "ResourceClaimTemplate":
        return check_resource_claim_template(
            obj, driver, classes, class_configs, largest_gpu_memory
        )
    if kind == "DeviceClass":
        return check_device_class(obj, driver)
    return []
