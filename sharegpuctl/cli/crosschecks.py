"""Checks of ``sharegpu validate`` that need more than one object, or what only the CLI knows (the
webhook judges one object at a time: :mod:`sharegpu.admission.checks`): manifests that would pass
admission and then fail quietly.

Each finding is a warning (it may be intended) except a gated field sharegpu does not implement
that ``--feature-gates`` turns on, an error: near-miss class, claim and template names
(:func:`near_miss`; a name far from every known one is left alone); opaque configs no driver
reads; memory larger than every known GPU grants (decided by
:func:`sharegpu.allocator.capacity.consumed_amount` on the device the plugin publishes; for
``firstAvailable`` only when every subrequest is too large); a claim used by several UIDs whose
requests get MPS (:data:`controller.mpsclients.QUEUE_RULE`); fields whose feature gate is off at
the version checked (:mod:`api.gates`). Objects of any shape are accepted; parts of the wrong type
are skipped. docs/troubleshooting.md lists what each warning means."""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from api import gates, names
from api.gpuconfig import STRATEGY_MPS, DriverConfigs, config_applies, decode_driver_configs
from api.quantity import QuantityError, format_bytes_human, quantity_int
from api.sharepolicy import memory_policy_max
from controller.mpsclients import QUEUE_RULE
from controller.records import run_as_users
from kubeletplugin.model import GpuInfo
from kubeletplugin.preview import consumable_memory, reference_gpus
from sharegpu.admission import checks
from sharegpu.allocator.capacity import PolicyViolation, consumed_amount
from sharegpuctl.cli.common import chart_device_class_names
from sharegpuctl.cli.loading import Manifest

#: The feature gate that makes the API server keep ``capacity.requests`` of a device request.
CONSUMABLE_CAPACITY_GATE: Final = gates.CONSUMABLE_CAPACITY
#: Kinds whose pod spec lives at ``spec.template.spec``.
POD_TEMPLATE_KINDS: Final = frozenset(
    {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController"}
)
#: Longest Kubernetes object name (a DNS subdomain); longer names are never near misses.
MAX_NAME_LENGTH: Final = 253
#: Work one validate run spends on did-you-mean hints at most, in cells of the edit-distance
#: band (:func:`comparison_cost`; about a second), so that hundreds of distinct, nearly equal
#: long names cannot make it slow. Typical names cost about 100 cells per comparison.
MAX_NAME_WORK: Final = 1_000_000


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _warning(path: str, message: str) -> checks.Finding:
    return checks.Finding(checks.WARNING, path, message)


# --- near misses ------------------------------------------------------------------------------


def max_edits(known: str) -> int:
    """Edits allowed for a near miss of ``known``: 1 per 5 characters, between 1 and 3."""
    return max(1, min(3, len(known) // 5))


def edit_distance(a: str, b: str, bound: int) -> int:
    """Levenshtein distance of ``a`` and ``b`` when it is at most ``bound``, else ``bound + 1``.

    Only the diagonal band of width ``2 * bound + 1`` is computed, and the computation stops as
    soon as a whole row exceeds the bound, so the cost is O(bound * length) at most."""
    if abs(len(a) - len(b)) > bound:
        return bound + 1
    over = bound + 1
    previous = [j if j <= bound else over for j in range(len(b) + 1)]
    for i in range(1, len(a) + 1):
        current = [over] * (len(b) + 1)
        if i <= bound:
            current[0] = i
        for j in range(max(1, i - bound), min(len(b), i + bound) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost, over)
        if min(current) > bound:
            return over
        previous = current
    return min(previous[len(b)], over)


def comparison_cost(name: str, edits: int) -> int:
    """Cells :func:`edit_distance` computes at most for ``name`` and a band of ``edits``."""
    return (2 * edits + 1) * (len(name) + 1)


@dataclass
class ComparisonBudget:
    """What is left of :data:`MAX_NAME_WORK` for one run."""

    left: int = MAX_NAME_WORK


def near_miss(
    name: str, known: Iterable[str], budget: ComparisonBudget | None = None
) -> str | None:
    """The known name closest to ``name`` when it differs by at most :func:`max_edits` edits
    (ties: the first in sorted order); None when ``name`` is known, longer than a Kubernetes
    name, or nothing is that close. Candidates whose length alone rules them out cost nothing;
    each other one costs :func:`comparison_cost` of ``budget``, and none is made once the
    budget cannot pay for it."""
    candidates = sorted(set(known))
    if name in candidates or len(name) > MAX_NAME_LENGTH:
        return None
    best: tuple[int, str] | None = None
    for candidate in candidates:
        edits = max_edits(candidate)
        if abs(len(name) - len(candidate)) > edits:
            continue
        if budget is not None:
            cost = comparison_cost(name, edits)
            if budget.left < cost:
                break
            budget.left -= cost
        distance = edit_distance(name, candidate, edits)
        if distance <= edits and (best is None or distance < best[0]):
            best = (distance, candidate)
    return best[1] if best else None


# --- requests --------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Request:
    """One ``exactly`` request, ``firstAvailable`` subrequest or flat v1beta1 request.

    ``name`` is the name configs use (``req`` or ``req/sub``); ``index`` is the position of the
    top-level request; ``first_available`` marks subrequests."""

    name: str
    index: int
    path: str
    spec: Mapping[str, Any]
    first_available: bool = False


def claim_spec(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """``(path, ResourceClaimSpec)`` of a ResourceClaim or ResourceClaimTemplate."""
    if obj.get("kind") == "ResourceClaim":
        return "spec", _map(obj.get("spec"))
    if obj.get("kind") == "ResourceClaimTemplate":
        return "spec.spec", _map(_map(obj.get("spec")).get("spec"))
    return None


def requests_of(spec: Mapping[str, Any], base: str) -> list[Request]:
    """Every request of a ResourceClaimSpec, in order."""
    out: list[Request] = []
    for i, req in enumerate(_list(_map(spec.get("devices")).get("requests"))):
        if not isinstance(req, Mapping):
            continue
        name = str(req.get("name", ""))
        where = f"{base}.devices.requests[{i}]"
        if isinstance(req.get("exactly"), Mapping):
            out.append(Request(name, i, f"{where}.exactly", req["exactly"]))
        for j, sub in enumerate(_list(req.get("firstAvailable"))):
            if isinstance(sub, Mapping):
                sub_name = f"{name}/{sub.get('name', '')}"
                out.append(Request(sub_name, i, f"{where}.firstAvailable[{j}]", sub, True))
        if "deviceClassName" in req:  # v1beta1: the request itself
            out.append(Request(name, i, where, req))
    return out


def class_name(request: Request) -> str | None:
    value = request.spec.get("deviceClassName")
    return value if isinstance(value, str) and value else None


def is_ours(request: Request, driver: str, classes: Iterable[str]) -> bool:
    """Whether the request is allocated from this driver's devices, as far as the files tell:
    its DeviceClass is the driver's (:func:`sharegpu.admission.checks.is_driver_class`), or one
    of its own selectors names the driver."""
    if checks.is_driver_class(class_name(request), driver, classes):
        return True
    for selector in _list(request.spec.get("selectors")):
        expr = _map(_map(selector).get("cel")).get("expression")
        if isinstance(expr, str) and checks.selector_mentions_driver(expr, driver):
            return True
    return False


def capacity_requests(request: Request) -> Mapping[str, Any]:
    return _map(_map(request.spec.get("capacity")).get("requests"))


# --- what the checks know ---------------------------------------------------------------------


def known_gpus() -> tuple[GpuInfo, ...]:
    """The GPU models this project knows: the mock backend's default (an H100 80GB HBM3)."""
    return reference_gpus("validate", 1)


@functools.cache
def _published_memory() -> tuple[tuple[GpuInfo, Mapping[str, Any]], ...]:
    """Per known GPU (smallest first), the ``memory`` capacity the kubelet plugin publishes for
    it in consumable mode (value and request policy)."""
    gpus = sorted(known_gpus(), key=lambda g: g.memory_usable)
    return tuple((g, consumable_memory(g)) for g in gpus)


def pod_spec(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """``(path, pod spec)`` of a Pod, PodTemplate, CronJob or workload with a pod template."""
    kind = obj.get("kind")
    spec = _map(obj.get("spec"))
    if kind == "Pod":
        return "spec", spec
    if kind == "PodTemplate":
        return "template.spec", _map(_map(obj.get("template")).get("spec"))
    if kind == "CronJob":
        job = _map(_map(spec.get("jobTemplate")).get("spec"))
        return "spec.jobTemplate.spec.template.spec", _map(_map(job.get("template")).get("spec"))
    if kind in POD_TEMPLATE_KINDS:
        return "spec.template.spec", _map(_map(spec.get("template")).get("spec"))
    return None


@dataclass(frozen=True)
class Context:
    """Everything the checks know beyond the object itself."""

    driver: str
    version: str
    #: The feature gates set with ``--feature-gates`` (the others have their defaults).
    gates: Mapping[str, bool]
    #: DeviceClasses of the files that are the driver's.
    classes: tuple[str, ...]
    #: Names defined by the files (and, for classes, by the chart).
    class_names: frozenset[str]
    template_names: frozenset[str]
    claim_names: frozenset[str]
    #: Known effective UIDs of the files' containers that use each ``(namespace, claim name)``
    #: that may be an MPS share (:func:`claim_users`), in file order.
    claim_users: Mapping[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)
    #: Shared by every did-you-mean of the run; results are memoized per (what, name).
    budget: ComparisonBudget = field(default_factory=ComparisonBudget)
    hints: dict[tuple[str, str], str | None] = field(default_factory=dict)
    #: ``group/version`` strings the cluster enables beyond its defaults (``--runtime-config``).
    enabled_api_versions: frozenset[str] = frozenset()
    #: The driver's config entries of each DeviceClass of the files, by name (what a claim's
    #: ``burstLimit`` is judged against).
    class_configs: Mapping[str, DriverConfigs] = field(default_factory=dict)

    def near_miss(self, what: str, name: str, known: frozenset[str]) -> str | None:
        """:func:`near_miss` of a ``what`` (``DeviceClass``, ...) name, memoized."""
        key = (what, name)
        if key not in self.hints:
            self.hints[key] = near_miss(name, known, self.budget)
        return self.hints[key]

    @classmethod
    def of(
        cls,
        manifests: Sequence[Manifest],
        driver: str,
        version: str,
        feature_gates: Mapping[str, bool],
        classes: Sequence[str],
        enabled_api_versions: Collection[str] = (),
    ) -> Context:
        def defined(kind: str) -> frozenset[str]:
            return frozenset(m.name for m in manifests if m.kind == kind)

        return cls(
            driver=driver,
            version=version,
            gates=dict(feature_gates),
            classes=tuple(classes),
            class_names=defined("DeviceClass") | set(chart_device_class_names(driver)),
            template_names=defined("ResourceClaimTemplate"),
            claim_names=defined("ResourceClaim"),
            claim_users=claim_users([m.obj for m in manifests], driver),
            enabled_api_versions=frozenset(enabled_api_versions),
            class_configs={
                m.name: decode_driver_configs(
                    _list(_map(_map(m.obj).get("spec")).get("config")), driver
                )
                for m in manifests
                if m.kind == "DeviceClass"
            },
        )


def _namespace(obj: Mapping[str, Any]) -> str:
    namespace = _map(obj.get("metadata")).get("namespace")
    return namespace if isinstance(namespace, str) else ""


def _never_mps(obj: Mapping[str, Any], driver: str) -> bool:
    """Whether this driver's configs of a ResourceClaim give none of its requests MPS (as a
    share: a whole GPU never defaults to MPS); invalid configs count as not deciding."""
    located = claim_spec(obj)
    if located is None:
        return False
    base, spec = located
    configs = decode_driver_configs(_list(_map(spec.get("devices")).get("config")), driver)
    if configs.problems:
        return False
    requests = requests_of(spec, base)
    return bool(requests) and all(
        configs.resolve(r.name, shared=True).strategy != STRATEGY_MPS for r in requests
    )


def claim_users(
    objs: Iterable[Mapping[str, Any]], driver: str
) -> dict[tuple[str, str], tuple[int, ...]]:
    """``(namespace, claim name)`` -> the known effective UIDs, each once in file order, of the
    containers of the objects' pod specs that use that ResourceClaim; claims that the files'
    ResourceClaims configure as never MPS are left out."""
    objs = list(objs)
    never = {
        (_namespace(o), str(_map(o.get("metadata")).get("name")))
        for o in objs
        if o.get("kind") == "ResourceClaim" and _never_mps(o, driver)
    }
    found: dict[tuple[str, str], dict[int, None]] = {}
    for obj in objs:
        located = pod_spec(obj)
        if located is None:
            continue
        _, spec = located
        claims: dict[str, str] = {}
        for e in map(_map, _list(spec.get("resourceClaims"))):
            name, claim_name = e.get("name"), e.get("resourceClaimName")
            if isinstance(name, str) and isinstance(claim_name, str):
                claims[name] = claim_name
        containers = [
            _map(c) for c in [*_list(spec.get("initContainers")), *_list(spec.get("containers"))]
        ]
        for entry, claim in claims.items():
            key = (_namespace(obj), claim)
            if key in never:
                continue
            users = [
                c
                for c in containers
                if any(
                    _map(r).get("name") == entry
                    for r in _list(_map(c.get("resources")).get("claims"))
                )
            ]
            for _, uid in run_as_users(spec, users):
                if uid is not None:
                    found.setdefault(key, {})[uid] = None
    return {k: tuple(v) for k, v in found.items()}


def mps_user_findings(obj: Mapping[str, Any], ctx: Context) -> list[checks.Finding]:
    """A warning on each ``resourceClaims`` entry of a pod spec whose claim's containers (over
    the files) run as more than one known UID."""
    located = pod_spec(obj)
    if located is None:
        return []
    base, spec = located
    findings: list[checks.Finding] = []
    for i, entry in enumerate(_list(spec.get("resourceClaims"))):
        claim = _map(entry).get("resourceClaimName")
        users = ctx.claim_users.get((_namespace(obj), claim)) if isinstance(claim, str) else None
        if users is None or len(users) < 2:
            continue
        shown = ", ".join(str(u) for u in users)
        findings.append(
            _warning(
                f"{base}.resourceClaims[{i}]",
                f"the checked files' containers that use ResourceClaim {claim!r} run as UIDs "
                f"{shown}: if its devices are MPS shares (the default for a share), {QUEUE_RULE}",
            )
        )
    return findings


def parse_version(version: str) -> gates.Version | None:
    """``(major, minor)`` of ``1.37``, ``v1.37`` or ``1.37.2``; None for anything else."""
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


# --- the checks ------------------------------------------------------------------------------


def name_findings(
    path: str, what: str, name: Any, known: frozenset[str], where: str, ctx: Context
) -> list[checks.Finding]:
    """A did-you-mean warning for a reference ``name`` that is a near miss of a known one."""
    if not isinstance(name, str):
        return []
    match = ctx.near_miss(what, name, known)
    if match is None:
        return []
    return [_warning(path, f"{what} {name!r} is not defined {where}; did you mean {match!r}?")]


def class_name_findings(requests: Sequence[Request], ctx: Context) -> list[checks.Finding]:
    """Near misses of DeviceClass names."""
    where = "in the checked files or by the sharegpu chart"
    return [
        f
        for r in requests
        for f in name_findings(
            f"{r.path}.deviceClassName", "DeviceClass", class_name(r), ctx.class_names, where, ctx
        )
    ]


def pod_reference_findings(obj: Mapping[str, Any], ctx: Context) -> list[checks.Finding]:
    """Near misses of the claim and template names a pod's ``resourceClaims`` use."""
    located = pod_spec(obj)
    if located is None:
        return []
    base, spec = located
    findings: list[checks.Finding] = []
    for i, entry in enumerate(_list(spec.get("resourceClaims"))):
        entry = _map(entry)
        for key, what, known in (
            ("resourceClaimTemplateName", "ResourceClaimTemplate", ctx.template_names),
            ("resourceClaimName", "ResourceClaim", ctx.claim_names),
        ):
            findings += name_findings(
                f"{base}.resourceClaims[{i}].{key}",
                what,
                entry.get(key),
                known,
                "in the checked files",
                ctx,
            )
    return findings


def _request_list(requests: Sequence[Request]) -> str:
    shown = ", ".join(
        f"{r.name!r} (DeviceClass {class_name(r)!r})" if class_name(r) else repr(r.name)
        for r in requests
    )
    return f"request {shown}" if len(requests) == 1 else f"requests {shown}"


def config_findings(
    entries: Any, path: str, requests: Sequence[Request] | None, ctx: Context
) -> list[checks.Finding]:
    """Opaque configs that their driver never reads (``requests`` None: a DeviceClass's)."""
    driver = ctx.driver
    findings: list[checks.Finding] = []
    for i, entry in enumerate(_list(entries)):
        entry = _map(entry)
        named = _map(entry.get("opaque")).get("driver")
        if not isinstance(named, str):
            continue
        where = f"{path}[{i}].opaque.driver"
        if named != driver and near_miss(named, [driver]) is not None:
            findings.append(
                _warning(
                    where,
                    f"config for driver {named!r}, which {driver} ignores; "
                    f"did you mean {driver!r}?",
                )
            )
            continue
        wanted = [r for r in _list(entry.get("requests")) if isinstance(r, str)]
        targeted = [r for r in requests or () if config_applies(wanted, r.name)]
        if not targeted:
            continue
        ours = [r for r in targeted if is_ours(r, driver, ctx.classes)]
        if named == driver and not ours:
            findings.append(
                _warning(
                    where,
                    f"config for {driver}, but no request it applies to "
                    f"({_request_list(targeted)}) uses a DeviceClass known to be {driver}'s "
                    "(named like the driver, or defined in the checked files with a selector "
                    f"that names it): unless that class selects {driver} devices, no driver "
                    "reads this config",
                )
            )
        elif named != driver and len(ours) == len(targeted):
            findings.append(
                _warning(
                    where,
                    f"config for driver {named!r} applies only to {_request_list(targeted)}, "
                    f"allocated from {driver} devices: {named} never sees it and {driver} "
                    "ignores other drivers' configs",
                )
            )
    return findings


def _too_large(raw: Any) -> PolicyViolation | None:
    """The violation on the largest known GPU when ``raw`` fits none of them, else None."""
    try:
        requested = quantity_int(raw)
    except QuantityError:
        return None  # sharegpu.admission.checks reports it
    if requested <= 0:
        return None
    violation: PolicyViolation | None = None
    for gpu, capacity in _published_memory():
        where = f"{gpu.product_name}: capacity[{names.CAP_MEMORY}]"
        consumed = consumed_amount(names.CAP_MEMORY, capacity, requested, where)
        if not isinstance(consumed, PolicyViolation):
            return None
        violation = consumed
    return violation


def memory_findings(requests: Sequence[Request], ctx: Context) -> list[checks.Finding]:
    """This driver's memory requests that no known GPU model can grant."""
    largest = _published_memory()[-1][0]
    too_large: list[tuple[Request, str, str]] = []  # (request, capacity key, why)
    for r in requests:
        if not is_ours(r, ctx.driver, ctx.classes):
            continue
        for key, raw in capacity_requests(r).items():
            if str(key) not in (names.CAP_MEMORY, names.qualify(ctx.driver, names.CAP_MEMORY)):
                continue
            violation = _too_large(raw)
            if violation is not None:
                too_large.append((r, str(key), violation.message()))
    # firstAvailable: a subrequest that is not too large is a fallback for the others
    refused = {id(r) for r, _, _ in too_large}
    fits = {r.index for r in requests if r.first_available and id(r) not in refused}
    return [
        _warning(
            f"{r.path}.capacity.requests[{key}]",
            f"memory {capacity_requests(r)[key]} is more than any GPU model this driver knows "
            f"grants: the largest, {largest.product_name}, grants at most "
            f"{format_bytes_human(memory_policy_max(largest.memory_usable))} ({message}); on "
            "nodes without a larger GPU the claim is never allocated (sharegpu explain shows "
            "why)",
        )
        for r, key, message in too_large
        if r.index not in fits
    ]


def gate_findings(obj: Mapping[str, Any], ctx: Context) -> list[checks.Finding]:
    """Gated fields (:data:`api.gates.GATED_FIELDS`) the API server of ``ctx.version`` drops
    (warnings), and unsupported ones the cluster keeps because their gate is on (errors).
    A field older than its gate is left to the schema check."""
    version = parse_version(ctx.version)
    if version is None:
        return []
    findings: list[checks.Finding] = []
    for path, gated in gates.gated_fields(obj):
        gate = gates.GATES[gated.gate]
        stage = gate.stage(version)
        if stage is None:
            continue
        if not gate.enabled(version, ctx.gates.get(gate.name)):
            findings.append(
                _warning(
                    path,
                    f"Kubernetes {ctx.version} drops {gated.what} unless the {gate.name} "
                    f"feature gate is enabled ({gate.history()}): {gated.consequence}",
                )
            )
        elif not gated.supported:
            findings.append(
                checks.Finding(
                    checks.ERROR,
                    path,
                    f"{gated.what} ({gate.name}, {stage.maturity} in Kubernetes {ctx.version}) "
                    "are not supported by sharegpu: its allocator and kubelet plugin ignore "
                    "them, so sharegpu explain and the node would disagree with the cluster; "
                    f"remove the field or keep {gate.name} off",
                )
            )
    return findings


def cross_findings(obj: Mapping[str, Any], ctx: Context) -> list[checks.Finding]:
    """Every finding of this module for one object (see the module docstring)."""
    findings = (
        pod_reference_findings(obj, ctx) + mps_user_findings(obj, ctx) + gate_findings(obj, ctx)
    )
    if obj.get("kind") == "DeviceClass":
        config = _map(obj.get("spec")).get("config")
        return findings + config_findings(config, "spec.config", None, ctx)
    located = claim_spec(obj)
    if located is None:
        return findings
    base, spec = located
    requests = requests_of(spec, base)
    findings += class_name_findings(requests, ctx)
    config = _map(spec.get("devices")).get("config")
    findings += config_findings(config, f"{base}.devices.config", requests, ctx)
    findings += memory_findings(requests, ctx)
    return findings
