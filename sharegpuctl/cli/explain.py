"""``sharegpu explain``: where a claim would be allocated, or why it cannot be, per device.

The objects of ``-f``, ``--classes`` and ``--allocated`` are first checked as ``sharegpu
validate`` checks them (any error: nothing is allocated, exit 1); the claims are then allocated
in file order with :mod:`sharegpu.allocator` against the slices of ``--slices``, of the cluster
(``--kubeconfig``, with its classes and allocated claims) or of this node as the plugin would
publish them; each claim sees the ones before it, the claims of one pod are allocated together,
and a claim goes to the first node (by name) where it fits.
DeviceTaintRules taint what they select. Rejections are grouped by reason, labelled with one of
:data:`~sharegpu.allocator.REJECTION_KINDS` (:func:`reason_kind`). The user's view is in
docs/troubleshooting.md."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from api import burst, names
from api.gpuconfig import DriverConfigs, GpuConfigError, decode_driver_configs
from api.jsontypes import Obj
from api.quantity import (
    QuantityError,
    format_bytes_human,
    format_quantity,
    parse_quantity,
    quantity_int,
)
from sharegpu.admission.checks import ERROR
from sharegpu.allocator import (
    AllocationOutcome,
    Allocator,
    AllocatorInputError,
    DeviceId,
    Rejection,
    RequestReport,
    seeded_share_ids,
)
from sharegpu.allocator.capacity import describe_policy
from sharegpu.allocator.explanation import explain as explain_plan
from sharegpu.allocator.requests import parse_requests
from sharegpu.allocator.search import ClaimPlan
from sharegpu.kube.devicetaints import (
    DEVICE_TAINT_RULE_KIND,
    rule_name,
    validate_device_taint_rule,
)
from sharegpu.kube.rest import KubeApiError, KubeConfigError, KubeRest, load_api_client
from sharegpuctl.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    add_node_flags,
    add_output_flag,
    chart_installed_classes,
    chart_installs,
    compact_names,
    local_node,
)
from sharegpuctl.cli.loading import SLICE_LIMITS, Manifest, load_manifests, load_objects
from sharegpuctl.cli.output import Table, emit, resolve_format
from sharegpuctl.cli.validate import (
    FileFinding,
    add_version_flags,
    check_manifests,
    check_version,
    parse_feature_gates,
    parse_runtime_config,
)

HELP = "explain where a claim would be allocated, or why each device is rejected"
#: Share IDs in explanations are reproducible (they are not written anywhere).
SHARE_ID_SEED: Final = 5075
RESOURCE_API: Final = f"/apis/{names.RESOURCE_GROUP_VERSION}"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "explain",
        help=HELP,
        description="Allocate claims as kube-scheduler would and print the allocation, or for "
        "each request why every device was rejected. Slices come from --slices files, from the "
        "cluster of --kubeconfig (with its DeviceClasses and allocated claims), or else from "
        "this node as the kubelet plugin would publish it (mock backend by default).",
    )
    p.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="claims (ResourceClaim, ResourceClaimTemplate), DeviceClasses and "
        "DeviceTaintRules; repeatable",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--slices",
        action="append",
        metavar="FILE",
        help="ResourceSlices and DeviceTaintRules (YAML list, multi-document or a List); "
        "repeatable",
    )
    source.add_argument("--kubeconfig", help="read slices, classes and claims from this cluster")
    p.add_argument("--node", help="allocate on this node only (default: every node of the slices)")
    p.add_argument("--classes", action="append", metavar="FILE", help="DeviceClasses")
    p.add_argument(
        "--allocated",
        action="append",
        metavar="FILE",
        help="claims already allocated (with status.allocation) whose devices are taken",
    )
    p.add_argument(
        "--quota",
        metavar="FILE",
        help="a GpuQuota (usage 0): say which claims of its namespace it admits or denies, as "
        "the admission webhook would",
    )
    add_version_flags(p)
    offline = p.add_argument_group("this node (used when neither --slices nor --kubeconfig)")
    add_node_flags(p, default_backend=names.MOCK_BACKEND, group=offline)
    add_output_flag(p)
    p.set_defaults(run=run)


# --- inputs ------------------------------------------------------------------------------------


@dataclass
class Inputs:
    """Everything an explanation needs."""

    claims: list[Obj]
    slices: list[Obj]
    classes: dict[str, Obj]
    allocated: list[Obj] = field(default_factory=list)
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    source: str = ""
    #: The only node to try (``--node``, or this node when explaining offline); None: all.
    node: str | None = None
    #: Where ``classes`` come from, for the message about a class that is not there.
    classes_from: str = "the files given"
    #: Claim ``namespace/name`` -> ``KIND/NAME`` of the pods and workloads of the files using it.
    users: dict[str, list[str]] = field(default_factory=dict)
    #: The documents of the files given with ``-f``, in order.
    manifests: list[Manifest] = field(default_factory=list)
    #: DeviceTaintRules (of ``-f``, ``--slices`` and the cluster): their taints count as taints
    #: of the devices they select.
    taint_rules: list[Obj] = field(default_factory=list)
    #: The DRA driver (``--driver-name``).
    driver: str = names.DEFAULT_DRIVER_NAME


def claim_from_template(template: Obj) -> Obj:
    """The claim a ResourceClaimTemplate generates (named like the template)."""
    md = template.get("metadata") or {}
    return {
        "apiVersion": template.get("apiVersion", names.RESOURCE_GROUP_VERSION),
        "kind": "ResourceClaim",
        "metadata": {"name": md.get("name", "claim"), "namespace": md.get("namespace", "default")},
        "spec": (template.get("spec") or {}).get("spec") or {},
    }


#: Workload kinds whose pod template is ``spec.template.spec``.
WORKLOAD_KINDS: Final = ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job")


def pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod spec of a Pod, of a workload's pod template or of a CronJob's job; None for
    any other object."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return None
    kind = obj.get("kind")
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    elif kind not in WORKLOAD_KINDS:
        return None
    template = spec.get("template") if isinstance(spec, Mapping) else None
    pod = template.get("spec") if isinstance(template, Mapping) else None
    return pod if isinstance(pod, Mapping) else None


def claim_refs(obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(kind, name)`` of the ResourceClaims and ResourceClaimTemplates a pod-running object
    names in ``resourceClaims``, in order (empty for any other object)."""
    pod = pod_spec(obj)
    refs = pod.get("resourceClaims") if pod is not None else None
    out: list[tuple[str, str]] = []
    for ref in refs if isinstance(refs, list) else []:
        if not isinstance(ref, Mapping):
            continue
        if ref.get("resourceClaimName"):
            out.append(("ResourceClaim", str(ref["resourceClaimName"])))
        elif ref.get("resourceClaimTemplateName"):
            out.append(("ResourceClaimTemplate", str(ref["resourceClaimTemplateName"])))
    return out


def pod_groups(users: Sequence[Sequence[str]]) -> list[list[int]]:
    """Which claims are allocated together: ``users[i]`` names the pods using claim ``i``.

    In claim order, a claim not yet placed opens a group with every later claim its first pod
    also uses (kube-scheduler allocates a pod's claims that are not allocated yet in one
    search); a claim no pod uses is a group of its own. Every index is in exactly one group.
    """
    placed: set[int] = set()
    groups: list[list[int]] = []
    for i, pods in enumerate(users):
        if i in placed:
            continue
        group = [i] + [
            j for j in range(i + 1, len(users)) if j not in placed and pods and pods[0] in users[j]
        ]
        placed.update(group)
        groups.append(group)
    return groups


def claims_of(objects: Iterable[Obj]) -> list[Obj]:
    """ResourceClaims (namespace defaulted) and the claims of ResourceClaimTemplates."""
    out = []
    for obj in objects:
        if obj.get("kind") == "ResourceClaimTemplate":
            out.append(claim_from_template(obj))
        elif obj.get("kind") == "ResourceClaim":
            claim = dict(obj)
            md = dict(claim.get("metadata") or {})
            md.setdefault("namespace", "default")
            claim["metadata"] = md
            out.append(claim)
    return out


def _items(rest: KubeRest, path: str) -> list[Obj]:
    try:
        items = rest.request("GET", path).get("items") or []
    except KubeApiError as exc:
        raise CliError(f"cannot list {path.rpartition('/')[2]}: {exc}") from None
    return [dict(i) for i in items if isinstance(i, Mapping)]


def _taint_rules(rest: KubeRest) -> list[Obj]:
    """The cluster's DeviceTaintRules; none where ``resource.k8s.io/v1`` does not serve them
    (clusters before 1.37 serve them only in alpha and beta versions, behind a gate)."""
    try:
        items = rest.request("GET", f"{RESOURCE_API}/devicetaintrules").get("items") or []
    except KubeApiError as exc:
        if exc.status == 404:
            return []
        raise CliError(f"cannot list devicetaintrules: {exc}") from None
    return [dict(i) for i in items if isinstance(i, Mapping)]


@dataclass
class ClusterState:
    """What explain reads from a cluster."""

    slices: list[Obj]
    classes: list[Obj]
    claims: list[Obj]
    labels: dict[str, dict[str, str]]
    taint_rules: list[Obj]


def cluster_inputs(kubeconfig: str, node: str | None) -> ClusterState:
    """Slices, classes, allocated claims, node labels and DeviceTaintRules from the cluster."""
    try:
        api = load_api_client(kubeconfig, use_home=True)
    except KubeConfigError as exc:
        raise CliError(str(exc)) from None
    try:
        rest = KubeRest(api)
        slices = _items(rest, f"{RESOURCE_API}/resourceslices")
        classes = _items(rest, f"{RESOURCE_API}/deviceclasses")
        claims = [
            c
            for c in _items(rest, f"{RESOURCE_API}/resourceclaims")
            if (c.get("status") or {}).get("allocation")
        ]
        labels: dict[str, dict[str, str]] = {}
        for n in _items(rest, "/api/v1/nodes"):
            md = n.get("metadata") or {}
            if node is None or md.get("name") == node:
                labels[str(md.get("name"))] = dict(md.get("labels") or {})
        rules = _taint_rules(rest)
    finally:
        api.close()
    return ClusterState(slices, classes, claims, labels, rules)


def side_manifests(args: argparse.Namespace) -> tuple[list[Manifest], list[Manifest]]:
    """The DeviceClasses of ``--classes`` and the claims of ``--allocated``, as loaded."""
    classes = [m for m in load_manifests(args.classes or []) if m.kind == "DeviceClass"]
    allocated = [m for m in load_manifests(args.allocated or []) if m.kind == "ResourceClaim"]
    return classes, allocated


def gather_inputs(
    args: argparse.Namespace,
    manifests: list[Manifest] | None = None,
    side: tuple[list[Manifest], list[Manifest]] | None = None,
) -> Inputs:
    """Read the claims (from ``manifests`` when already loaded), the ``--classes`` and
    ``--allocated`` objects (``side``: :func:`side_manifests`, when already loaded) and the
    cluster state the command line names."""
    if manifests is None:
        manifests = load_manifests(args.filename)
    claims = claims_of(m.obj for m in manifests)
    if not claims:
        raise CliError(f"{', '.join(args.filename)}: no ResourceClaim or ResourceClaimTemplate")
    side_classes, side_allocated = side if side is not None else side_manifests(args)
    classes = [m.obj for m in manifests if m.kind == "DeviceClass"]
    classes += [m.obj for m in side_classes]
    allocated = [m.obj for m in side_allocated]
    rules = [m.obj for m in manifests if m.kind == DEVICE_TAINT_RULE_KIND]
    labels: dict[str, dict[str, str]] = {}
    node: str | None = args.node
    classes_from = "the files given"
    if args.slices:
        state = load_objects(args.slices, ["ResourceSlice", DEVICE_TAINT_RULE_KIND], SLICE_LIMITS)
        slices = [o for o in state if o.get("kind") == "ResourceSlice"]
        rules += [o for o in state if o.get("kind") == DEVICE_TAINT_RULE_KIND]
        source = "slices from " + ", ".join(args.slices)
    elif args.kubeconfig:
        live = cluster_inputs(args.kubeconfig, args.node)
        slices, live_classes, labels = live.slices, live.classes, live.labels
        classes = live_classes + classes
        allocated = live.claims + allocated
        rules = live.taint_rules + rules
        source = f"cluster of {args.kubeconfig}"
        classes_from = f"the {source}" + (
            " and the files given" if len(classes) > len(live_classes) else ""
        )
    else:
        local = local_node(
            argparse.Namespace(**{**vars(args), "node_name": args.node_name or node})
        )
        slices = list(local.slices)
        node = local.node_name
        source = (
            f"this node ({local.node_name}): {len(local.gpus)} {local.backend} GPU(s), "
            f"{local.sharing_mode} mode"
        )
    if not slices:
        raise CliError(f"no ResourceSlices found ({source})")
    by_name = {str((c.get("metadata") or {}).get("name")): c for c in classes}
    if not by_name and not args.kubeconfig:
        chart = chart_installed_classes(args.driver_name)
        by_name.update((c["metadata"]["name"], c) for c in chart)
        classes_from = (
            "the classes known here (only those the sharegpu chart installs: pass others with -f "
            "or --classes)"
        )
    own = {_name(c) for c in claims}
    others = [c for c in allocated if _name(c) not in own]
    users = claim_users(manifests)
    return Inputs(
        claims,
        slices,
        by_name,
        others,
        labels,
        source,
        node,
        classes_from,
        users,
        manifests,
        _checked_rules(rules),
        args.driver_name,
    )


def _checked_rules(rules: Sequence[Obj]) -> list[Obj]:
    """``rules``, or a one-line error naming the first malformed rule's field."""
    for rule in rules:
        problems = validate_device_taint_rule(rule)
        if problems:
            raise CliError(f"{DEVICE_TAINT_RULE_KIND} {rule_name(rule) or '?'}: {problems[0]}")
    return list(rules)


def claim_users(manifests: Sequence[Manifest]) -> dict[str, list[str]]:
    """Claim ``namespace/name`` -> the pods and workloads (``KIND/NAME``) that use it; a
    template stands for the claim named like it (:func:`claim_from_template`)."""
    users: dict[str, list[str]] = {}
    for m in manifests:
        namespace = (m.obj.get("metadata") or {}).get("namespace") or "default"
        for _kind, name in claim_refs(m.obj):
            users.setdefault(f"{namespace}/{name}", []).append(m.label)
    return users


def class_names(claim: Mapping[str, Any]) -> list[str]:
    """The DeviceClass names a claim's requests use (``exactly``, ``firstAvailable`` and the
    flat v1beta1 request), in order, each once."""
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    found: list[str] = []
    for req in requests if isinstance(requests, list) else []:
        if not isinstance(req, Mapping):
            continue
        subs = req.get("firstAvailable")
        for entry in [req, req.get("exactly"), *(subs if isinstance(subs, list) else [])]:
            name = entry.get("deviceClassName") if isinstance(entry, Mapping) else None
            if isinstance(name, str) and name and name not in found:
                found.append(name)
    return found


def missing_class_error(claim: Mapping[str, Any], inputs: Inputs) -> str | None:
    """Why a claim cannot be allocated at all because a DeviceClass it names is not there;
    None when every class it names is."""
    missing = [n for n in class_names(claim) if n not in inputs.classes]
    if not missing:
        return None
    there = compact_names(sorted(inputs.classes)) or "none"
    return (
        f"DeviceClass {', '.join(missing)} does not exist in {inputs.classes_from} (DeviceClasses "
        f"there: {there}); kube-scheduler leaves the pod Pending until the class exists: fix "
        f"deviceClassName, or create the class ({chart_installs(inputs.driver)})"
    )


def _name(claim: Mapping[str, Any]) -> str:
    md = claim.get("metadata") or {}
    return f"{md.get('namespace', 'default')}/{md.get('name', '')}"


def nodes_of(slices: Sequence[Obj], wanted: str | None) -> list[str]:
    """The nodes to try: ``wanted``, else every ``spec.nodeName`` of the slices (sorted)."""
    if wanted:
        return [wanted]
    found = sorted({str(n) for s in slices if (n := (s.get("spec") or {}).get("nodeName"))})
    if not found:
        raise CliError(
            "the slices name no node (allNodes or nodeSelector); choose one with --node",
            EXIT_USAGE,
        )
    return found


# --- readable reasons ------------------------------------------------------------------------


def _amount(capacity: str, raw: Any) -> str:
    if raw is None:
        return "none"
    if capacity.endswith(names.CAP_MEMORY):
        try:
            return format_bytes_human(quantity_int(raw))
        except QuantityError:
            return str(raw)
    return str(raw)


def _device_names(slices: Sequence[Obj], driver: str, pool: str, device: str) -> list[str]:
    """The attribute and capacity names of one device (unqualified under its driver)."""
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != driver or (spec.get("pool") or {}).get("name") != pool:
            continue
        for d in spec.get("devices") or []:
            if d.get("name") == device:
                keys = [*(d.get("attributes") or {}), *(d.get("capacity") or {})]
                return [k.removeprefix(f"{driver}/") for k in keys]
    return []


def did_you_mean(name: str, known: Sequence[str]) -> str:
    """``; did you mean 'x'?`` for the closest known name, or nothing."""
    bare = name.rpartition("/")[2]
    lowered = {k.lower(): k for k in known}
    match = lowered.get(bare.lower())
    if match is None:
        close = difflib.get_close_matches(bare, list(known), n=1, cutoff=0.6)
        match = close[0] if close else None
    return f"; did you mean {match!r}?" if match and match != bare else ""


def _device(slices: Sequence[Obj], rejection: Rejection) -> Mapping[str, Any]:
    """The device a rejection is about, as its slice publishes it (empty when not found)."""
    return find_device(slices, *_split(rejection))


def find_device(slices: Sequence[Obj], driver: str, pool: str, device: str) -> Mapping[str, Any]:
    """Device ``device`` of ``driver``'s pool ``pool`` as its slice publishes it (empty when
    not found)."""
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != driver or (spec.get("pool") or {}).get("name") != pool:
            continue
        for d in spec.get("devices") or []:
            if isinstance(d, Mapping) and d.get("name") == device:
                return d
    return {}


def policy_maximum(rejection: Rejection, slices: Sequence[Obj]) -> tuple[str, str] | None:
    """``(most, policy text)`` when a ``capacity-short`` rejection asks for more than the most
    the device's request policy allows one share (its ``validRange.max``, or its largest
    ``validValues``, as the slice writes it); else None. Amounts are compared exactly
    (fractional ranges: a 1700m request is above a 1500m maximum)."""
    d = rejection.details
    if rejection.kind != "capacity-short" or d.get("available") is None:
        return None
    capacity = (_device(slices, rejection).get("capacity") or {}).get(str(d.get("capacity")))
    policy = capacity.get("requestPolicy") if isinstance(capacity, Mapping) else None
    if not isinstance(policy, Mapping):
        return None
    try:
        values = policy.get("validValues")
        tops = list(values) if values else [(policy.get("validRange") or {}).get("max")]
        if tops == [None]:
            return None
        most = max(tops, key=lambda v: parse_quantity(str(v)))
        requested = parse_quantity(str(d.get("requested")))
    except (QuantityError, TypeError, AttributeError):
        return None
    if requested <= parse_quantity(str(most)):
        return None
    return str(most), describe_policy(policy)


def reason_kind(rejection: Rejection, slices: Sequence[Obj]) -> str:
    """The label of a rejection in explanations: the allocator's kind, except that a
    ``capacity-short`` request above the device's request policy (:func:`policy_maximum`) is a
    ``capacity-policy`` violation. Always one of :data:`REJECTION_KINDS`."""
    if policy_maximum(rejection, slices) is not None:
        return "capacity-policy"
    return rejection.kind


#: The allocated devices holding what a ``counter-short`` rejection lacks: ``device (claim)``.
HeldBy = Callable[[Rejection], list[str]]


def counter_holders(allocator: Allocator) -> HeldBy:
    """For a ``counter-short`` rejection, the devices allocated on ``allocator``'s node that
    consume the exhausted counter (``device (claim)``, in pool order); empty for other kinds."""

    def held_by(rejection: Rejection) -> list[str]:
        if rejection.kind != "counter-short":
            return []
        driver, pool_name, _ = _split(rejection)
        pool = allocator.pool_by_key.get((driver, pool_name))
        if pool is None:
            return []
        set_name, counter = rejection.details.get("counterSet"), rejection.details.get("counter")
        usage = allocator.usage
        out: list[str] = []
        for name, device in pool.all_devices.items():
            dev = DeviceId(driver, pool_name, name)
            holders = [usage.exclusive[dev]] if dev in usage.exclusive else usage.sharers.get(dev)
            if not holders:
                continue
            if any(
                e.get("counterSet") == set_name and counter in (e.get("counters") or {})
                for e in device.get("consumesCounters") or []
            ):
                out.append(f"{name} ({', '.join(holders)})")
        return out

    return held_by


def describe(rejection: Rejection, slices: Sequence[Obj], held_by: HeldBy | None = None) -> str:
    """One rejection as a short sentence, without the device name. A ``counter-short``
    rejection names the counter set, the counter, what the device needs and what is left, and
    (with ``held_by``) the allocated devices that hold the counter."""
    d = rejection.details
    above = policy_maximum(rejection, slices)
    if above is not None:
        cap = str(d.get("capacity", "?"))
        most, policy = above
        shown = _amount(cap, most)
        return (
            f"capacity {cap}: requested {_amount(cap, d.get('requested'))}, but one share of "
            f"the device may have at most {shown} ({policy}); request at most {shown}"
        )
    if rejection.kind == "capacity-short":
        cap = str(d.get("capacity", "?"))
        if d.get("available") is None:
            known = _device_names(slices, *_split(rejection))
            return f"capacity {cap}: the device has no such capacity{did_you_mean(cap, known)}"
        return (
            f"capacity {cap}: requested {_amount(cap, d.get('requested'))}, available "
            f"{_amount(cap, d.get('available'))} (short {_amount(cap, d.get('shortBy'))})"
        )
    if rejection.kind == "selector-error":
        text = f"{d.get('source')} selector #{d.get('index')}: {d.get('error')}"
        missing = d.get("missingKey")
        if missing:
            text += did_you_mean(str(missing), _device_names(slices, *_split(rejection)))
        return f"{text} (expression: {d.get('expression')})"
    if rejection.kind == "selector-false":
        return f"{d.get('source')} selector #{d.get('index')} is false: {d.get('expression')}"
    if rejection.kind == "counter-short":
        counter = str(d.get("counter", "?"))
        text = (
            f"counter {d.get('counterSet')}/{counter}: needs {_amount(counter, d.get('needed'))}, "
            f"available {_amount(counter, d.get('available'))} "
            f"(short {_amount(counter, d.get('shortBy'))})"
        )
        holders = held_by(rejection) if held_by is not None else []
        return text + (f"; held by {compact_names(holders)}" if holders else "")
    if rejection.kind == "already-allocated":
        return f"already allocated to {d.get('by')}"
    return rejection.message


def _split(rejection: Rejection) -> tuple[str, str, str]:
    return rejection.device.driver, rejection.device.pool, rejection.device.device


def grouped_reasons(
    report: RequestReport, slices: Sequence[Obj], held_by: HeldBy | None = None
) -> list[Obj]:
    """Rejections with the same reason merged: ``[{"kind", "reason", "devices"}]``."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in report.rejections:
        key = (reason_kind(r, slices), describe(r, slices, held_by))
        groups.setdefault(key, []).append(r.device.device)
    return [
        {"kind": kind, "reason": reason, "devices": devices}
        for (kind, reason), devices in groups.items()
    ]


def _kind_counts(kinds: Iterable[str]) -> str:
    """``2 capacity-short, 1 tainted``, as the allocator's summaries count rejections."""
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))


def report_json(report: RequestReport, slices: Sequence[Obj], held_by: HeldBy | None = None) -> Obj:
    """A request's report with every rejection labelled by :func:`reason_kind` (its list, and
    the counts in its summary) and the grouped reasons (:func:`describe` with ``held_by``)."""
    data = report.to_dict()
    kinds = [reason_kind(r, slices) for r in report.rejections]
    for rejection, kind in zip(data["rejections"], kinds, strict=True):
        rejection["kind"] = kind
    before = _kind_counts(r.kind for r in report.rejections)
    if before:
        data["summary"] = str(data["summary"]).replace(f"{before}", _kind_counts(kinds))
    data["reasons"] = grouped_reasons(report, slices, held_by)
    return data


# --- dynamic MIG placements --------------------------------------------------------------------


def dynamic_mig_devices(slices: Sequence[Obj], allocation: Mapping[str, Any]) -> list[str]:
    """The allocated devices of ``allocation`` that are dynamic MIG placements (attribute
    ``migDynamic``)."""
    out = []
    for r in (allocation.get("devices") or {}).get("results") or []:
        device = find_device(slices, str(r["driver"]), str(r["pool"]), str(r["device"]))
        if ((device.get("attributes") or {}).get(names.ATTR_MIG_DYNAMIC) or {}).get("bool"):
            out.append(str(r["device"]))
    return out


def placements_json(
    allocator: Allocator, claim: Mapping[str, Any], slices: Sequence[Obj]
) -> list[Obj]:
    """Per request of ``claim``, against what ``allocator`` holds before the claim: the
    candidate devices (those its selectors match) that fit (``fit``) and, grouped, why each
    other candidate does not (``reasons``, counters named with the devices that hold them);
    ``otherDevices`` counts the devices its selectors do not match."""
    requests, constraints, _ = parse_requests(claim, allocator.classes)
    held_by = counter_holders(allocator)
    out = []
    for report in explain_plan(allocator, ClaimPlan(claim, requests, constraints)):
        candidates = [r for r in report.rejections if r.kind != "selector-false"]
        shown = RequestReport(report.request, report.needed, report.eligible, candidates, "")
        out.append(
            {
                "request": report.request,
                "fit": [d.device for d in report.eligible],
                "reasons": grouped_reasons(shown, slices, held_by),
                "otherDevices": len(report.rejections) - len(candidates),
            }
        )
    return out


# --- explanation -----------------------------------------------------------------------------


def allocation_rows(allocation: Mapping[str, Any]) -> list[Obj]:
    """Per result: request, device (driver/pool/device), shareID, consumed capacity, and for
    a burstable share its ``burst`` (:func:`burst_of`)."""
    rows = []
    devices = allocation.get("devices") or {}
    config = devices.get("config")
    decoded: dict[str, DriverConfigs] = {}
    for r in devices.get("results") or []:
        row: Obj = {
            "request": r.get("request"),
            "driver": r.get("driver"),
            "pool": r.get("pool"),
            "device": r.get("device"),
            "shareID": r.get("shareID"),
            "consumedCapacity": dict(r.get("consumedCapacity") or {}),
        }
        driver = r.get("driver")
        if isinstance(driver, str) and isinstance(config, list):
            if driver not in decoded:
                decoded[driver] = decode_driver_configs(config, driver)
            found = burst_of(decoded[driver], row)
            if found is not None:
                row["burst"] = found
        rows.append(row)
    return rows


def burst_of(configs: DriverConfigs, row: Mapping[str, Any]) -> Obj | None:
    """A share's ``burstLimit`` as the node would enforce it: ``{"limit": {cores, memory},
    "problems": [...]}`` (problems: why the node would refuse it, :func:`api.burst.limit_problems`
    with the allocation's DeviceClass policy); None for a result without one."""
    request = str(row["request"])
    try:
        config = configs.resolve(request, shared=True)
    except GpuConfigError:
        return None
    sharing = config.sharing
    if sharing is None or sharing.burst_limit is None:
        return None
    consumed = row["consumedCapacity"]
    try:
        cores = quantity_int(consumed.get(names.CAP_CORES, names.CORES_PER_GPU))
        memory = quantity_int(consumed.get(names.CAP_MEMORY, 0))
    except QuantityError:
        return None
    try:
        policy = burst.allocation_policy(configs, request)
        problems = burst.limit_problems(sharing, policy, cores=cores, memory=memory or None)
    except GpuConfigError as exc:
        problems = list(exc.messages)
    caps = burst.share_caps(sharing, cores, memory)
    return {
        "limit": {names.CAP_CORES: caps[0], names.CAP_MEMORY: format_quantity(caps[1])},
        "problems": problems,
    }


def burst_tables(entry: Mapping[str, Any]) -> list[Table]:
    """For an allocated claim with burstable shares: what each reserves and may use."""
    bursting = [r for r in entry["results"] if r.get("burst")]
    if not bursting:
        return []
    t = Table(
        ["REQUEST", "RESERVED", "LIMIT", "PROBLEMS"],
        title=f"{entry['claim']}: burstable shares (the limit is enforced, the reservation "
        "is counted)",
    )
    for r in bursting:
        limit = r["burst"]["limit"]
        t.add(
            r["request"],
            consumed_text(r["consumedCapacity"]),
            consumed_text(limit),
            "; ".join(r["burst"]["problems"]) or "-",
        )
    return [t]


def consumed_text(consumed: Mapping[str, Any]) -> str:
    """``cores=30, memory=10Gi`` (``whole device`` when nothing is consumed as a share)."""
    return ", ".join(f"{k}={v}" for k, v in sorted(consumed.items())) or "whole device"


def explain_claims(inputs: Inputs, nodes: Sequence[str]) -> list[Obj]:
    """Allocate the claims in order, a pod's claims together (first node where they all fit);
    the JSON report per claim, in claim order."""
    try:
        allocators = {
            node: Allocator(
                inputs.slices,
                inputs.classes,
                inputs.allocated,
                node,
                inputs.node_labels.get(node),
                seeded_share_ids(SHARE_ID_SEED),
                taint_rules=inputs.taint_rules,
            )
            for node in nodes
        }
    except AllocatorInputError as exc:
        raise CliError(str(exc)) from None
    names = [_name(c) for c in inputs.claims]
    entries: list[Obj] = [{"claim": name, "allocated": False} for name in names]
    for group in pod_groups([inputs.users.get(name, []) for name in names]):
        claims = [inputs.claims[i] for i in group]
        for i, claim in zip(group, claims, strict=True):
            if len(group) > 1:
                entries[i]["pod"] = inputs.users[names[i]][0]
                entries[i]["allocatedWith"] = [names[j] for j in group if j != i]
            missing = missing_class_error(claim, inputs)
            if missing is not None:
                entries[i].update(error=missing, nodes=[])
        blocked = next((entries[i]["error"] for i in group if entries[i].get("error")), None)
        if blocked is not None:
            for i in group:
                entries[i].setdefault("error", f"another claim of the same pod: {blocked}")
                entries[i].setdefault("nodes", [])
            continue
        _allocate_group(allocators, claims, group, entries, inputs)
    return entries


def _allocate_group(
    allocators: Mapping[str, Allocator],
    claims: Sequence[Obj],
    indices: Sequence[int],
    entries: list[Obj],
    inputs: Inputs,
) -> None:
    """Allocate one pod's claims on the first node where they all fit; fill their entries."""
    attempts: list[tuple[str, list[AllocationOutcome]]] = []
    for node, allocator in allocators.items():
        try:
            outcomes = allocator.allocate_pod(claims)
        except AllocatorInputError as exc:
            names = ", ".join(_name(c) for c in claims)
            raise CliError(f"claim {names}: {exc}") from None
        if all(o.allocation is not None for o in outcomes):
            placements = [
                placements_json(allocator, claim, inputs.slices)
                if o.allocation is not None and dynamic_mig_devices(inputs.slices, o.allocation)
                else None
                for claim, o in zip(claims, outcomes, strict=True)
            ]
            for i, claim, outcome, fits in zip(indices, claims, outcomes, placements, strict=True):
                assert outcome.allocation is not None
                allocator.commit(claim, outcome.allocation)
                entries[i].update(
                    allocated=True,
                    node=node,
                    results=allocation_rows(outcome.allocation),
                    allocation=outcome.allocation,
                )
                if fits is not None:
                    entries[i]["placements"] = fits
            return
        attempts.append((node, outcomes))
    for k, i in enumerate(indices):
        entries[i]["nodes"] = [
            {
                "node": node,
                "error": outcomes[k].error,
                "requests": [
                    report_json(rep, inputs.slices, counter_holders(allocators[node]))
                    for rep in outcomes[k].reports
                ],
            }
            for node, outcomes in attempts
        ]


def tables_of(report: Sequence[Obj]) -> list[Table]:
    """Human-readable tables: the allocation, or the grouped reasons per request."""
    tables = []
    for entry in report:
        if entry["allocated"]:
            t = Table(
                ["REQUEST", "DEVICE", "SHARE ID", "CONSUMED"],
                title=f"{entry['claim']}: allocated on node {entry['node']}",
            )
            for r in entry["results"]:
                t.add(
                    r["request"],
                    f"{r['pool']}/{r['device']}",
                    r["shareID"] or "-",
                    consumed_text(r["consumedCapacity"]),
                )
            tables.append(t)
            tables += burst_tables(entry)
            tables += placement_tables(entry)
            continue
        hint = f"\n  hint: {entry['hint']}" if entry.get("hint") else ""
        if entry.get("error"):
            t = Table(
                ["REQUEST", "DEVICES", "REASON"],
                title=f"{entry['claim']}: cannot be allocated{hint}",
            )
            t.add("-", "-", entry["error"])
            tables.append(t)
            hint = ""
        for attempt in entry["nodes"]:
            title = f"{entry['claim']}: cannot be allocated on node {attempt['node']}{hint}"
            hint = ""
            if attempt["error"]:
                title += f"\n  error: {attempt['error']}"
            t = Table(["REQUEST", "DEVICES", "REASON"], title=title)
            for req in attempt["requests"]:
                t.add(req["request"], "-", req["summary"])
                for group in req["reasons"]:
                    t.add("", compact_names(group["devices"]), group["reason"])
            tables.append(t)
    return tables


def placement_tables(entry: Mapping[str, Any]) -> list[Table]:
    """Dynamic MIG: for an allocated claim, per request the placements that fit and why each
    other candidate does not (empty for other claims)."""
    tables = []
    for req in entry.get("placements") or []:
        t = Table(
            ["DEVICES", "FIT / REASON"],
            title=f"{entry['claim']}: request {req['request']}: placements before this claim "
            f"({req['otherDevices']} other device(s) do not match its selectors)",
        )
        t.add(compact_names(req["fit"]) or "-", "fit")
        for group in req["reasons"]:
            t.add(compact_names(group["devices"]), group["reason"])
        tables.append(t)
    return tables


def quota_report(
    quota_file: str, manifests: Sequence[Manifest], driver: str, classes: Iterable[str]
) -> list[Obj]:
    """The verdict of the GpuQuota in ``quota_file`` (usage 0) on each ResourceClaim of its
    namespace among ``manifests``, in order: the rule and denial text of the admission webhook
    (:mod:`sharegpuctl.cli.quota`)."""
    from sharegpuctl.cli.quota import DEFAULT_NAMESPACE, load_quota, quota_verdicts

    quota = load_quota(quota_file)
    namespace = quota.namespace or DEFAULT_NAMESPACE
    denied = {id(m): f.message for m, f in quota_verdicts(quota, manifests, driver, classes)}
    out: list[Obj] = []
    for m in manifests:
        meta = m.obj.get("metadata")
        ns = (meta.get("namespace") if isinstance(meta, dict) else None) or DEFAULT_NAMESPACE
        if m.kind != "ResourceClaim" or ns != namespace:
            continue
        name = meta.get("name") if isinstance(meta, dict) else None
        entry: Obj = {"claim": f"{ns}/{name}", "quota": f"{namespace}/{quota.name}"}
        if id(m) in denied:
            entry.update(admitted=False, reason=denied[id(m)])
        else:
            entry["admitted"] = True
        out.append(entry)
    return out


def quota_table(verdicts: Sequence[Obj]) -> Table:
    """The quota verdicts as a table."""
    t = Table(["CLAIM", "QUOTA", "VERDICT"], title="GpuQuota verdicts (usage 0)")
    for v in verdicts:
        t.add(v["claim"], v["quota"], "admitted" if v["admitted"] else f"denied: {v['reason']}")
    return t


def invalid_report(
    manifests: Sequence[Manifest], findings: Sequence[FileFinding], version: str, fmt: str
) -> int:
    """Report files that fail the checks of ``sharegpu validate``: nothing is allocated."""
    errors = [f for f in findings if f.finding.severity == ERROR]
    claims = [
        {"claim": _name(c), "allocated": False, "error": "not allocated: the files have errors"}
        for c in claims_of(m.obj for m in manifests)
    ]
    summary = (
        f"not allocated: {len(errors)} error(s) against Kubernetes {version} "
        "(the checks of sharegpu validate)"
    )
    if fmt in ("json", "yaml"):
        data: Obj = {
            "kubernetesVersion": version,
            "valid": False,
            "findings": [f.to_json() for f in findings],
            "claims": claims,
        }
        emit(data, [], fmt)
    else:
        print("\n".join([*(str(f) for f in findings), summary]))
    return EXIT_FINDINGS


#: The node flags (``--sharing-mode``, ``--mig``) a mode hint tries, fewest changes first.
MODE_ALTERNATIVES: Final = (
    (names.SHARING_MODE_CONSUMABLE, names.MIG_STRATEGY_STATIC),
    (names.SHARING_MODE_PARTITIONS, names.MIG_STRATEGY_STATIC),
    (names.SHARING_MODE_EXCLUSIVE, names.MIG_STRATEGY_STATIC),
    (names.SHARING_MODE_PARTITIONS, names.MIG_STRATEGY_DYNAMIC),
)


def mode_flags(sharing_mode: str, mig: str) -> str:
    """``--sharing-mode M`` and, unless static, ``--mig S``."""
    flags = f"--sharing-mode {sharing_mode}"
    return flags if mig == names.MIG_STRATEGY_STATIC else f"{flags} --mig {mig}"


def add_mode_hints(
    args: argparse.Namespace,
    report: Sequence[Obj],
    manifests: list[Manifest],
    side: tuple[list[Manifest], list[Manifest]],
) -> None:
    """Offline on this node (no ``--slices``, no ``--kubeconfig``): give each claim that is not
    allocated with this run's ``--sharing-mode`` and ``--mig`` a ``hint`` naming the first other
    flags (:data:`MODE_ALTERNATIVES`) under which it is, i.e. the chart's
    ``kubeletPlugin.sharingMode``/``kubeletPlugin.mig`` it needs. Nothing changes when no other
    mode allocates it."""
    if args.slices or args.kubeconfig:
        return
    waiting = {e["claim"]: e for e in report if not e["allocated"]}
    current = (args.sharing_mode, getattr(args, "mig", names.MIG_STRATEGY_STATIC))
    for mode, mig in MODE_ALTERNATIVES:
        if not waiting:
            return
        if (mode, mig) == current:
            continue
        other = argparse.Namespace(**{**vars(args), "sharing_mode": mode, "mig": mig})
        try:
            inputs = gather_inputs(other, manifests, side)
            attempt = explain_claims(inputs, nodes_of(inputs.slices, inputs.node))
        except CliError:
            continue
        for entry in attempt:
            if entry["allocated"] and entry["claim"] in waiting:
                values = f"kubeletPlugin.sharingMode={mode}"
                if mig != names.MIG_STRATEGY_STATIC:
                    values += f", kubeletPlugin.mig={mig}"
                waiting.pop(entry["claim"])["hint"] = (
                    f"it would be allocated with {mode_flags(mode, mig)} (this run: "
                    f"{mode_flags(*current)}); on a cluster, the chart's {values}"
                )


def run(args: argparse.Namespace) -> int:
    version = check_version(str(args.kubernetes_version))
    gates = parse_feature_gates(str(args.feature_gates))
    fmt = resolve_format(args.output)
    manifests = load_manifests(args.filename)
    side = side_manifests(args)
    checked = [*manifests, *side[0], *side[1]]
    enabled = parse_runtime_config(str(args.runtime_config))
    findings = check_manifests(checked, args.driver_name, version, gates, enabled)
    if any(f.finding.severity == ERROR for f in findings):
        return invalid_report(manifests, findings, version, fmt)
    inputs = gather_inputs(args, manifests, side)
    nodes = nodes_of(inputs.slices, inputs.node)
    report = explain_claims(inputs, nodes)
    add_mode_hints(args, report, manifests, side)
    data: Obj = {
        "source": inputs.source,
        "kubernetesVersion": version,
        "nodes": list(nodes),
        "claims": report,
    }
    if findings:
        data["findings"] = [f.to_json() for f in findings]
        if fmt not in ("json", "yaml"):
            print("\n".join(str(f) for f in findings), file=sys.stderr)
    tables = tables_of(report)
    verdicts: list[Obj] = []
    if args.quota:
        verdicts = quota_report(args.quota, inputs.manifests, args.driver_name, inputs.classes)
        data["quota"] = verdicts
        tables.append(quota_table(verdicts))
    emit(data, tables, fmt)
    ok = all(e["allocated"] for e in report) and all(v["admitted"] for v in verdicts)
    return EXIT_OK if ok else EXIT_FINDINGS
