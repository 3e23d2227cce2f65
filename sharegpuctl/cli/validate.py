"""``sharegpu validate``: offline checks of the manifests a user is about to apply.

Files come through the bounded loader (:mod:`sharegpuctl.cli.loading`; a problem of one file is
an error finding at its line and column, the others are still checked). Per object, in order:
the official schema of ``--kubernetes-version`` (strict; a misplaced request field gets
:func:`sharegpu.admission.checks.request_field_hints`), the webhook's rules
(:func:`sharegpu.admission.checks.check_object`), CEL compile errors of other drivers'
selectors, standalone GpuConfigs and DeviceTaintRules as the plugin and API server parse them,
the claims pods use, then the checks across objects (:mod:`sharegpuctl.cli.crosschecks`).
DeviceClasses of the files that name the driver count as its classes. Errors make the exit code
1; warnings alone keep it 0."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import kubernetes_validate
from kubernetes_validate.utils import all_versions

from api import names
from api.apiversions import RUNTIME_CONFIG_FLAG, unserved_problem
from api.gates import LATEST_KUBERNETES
from api.gpuconfig import GPU_CONFIG_KIND, GpuConfigError, parse_gpu_config
from api.gpuquota import GpuQuotaError, parse_gpu_quota
from api.jsontypes import Obj
from api.names import GPU_QUOTA_KIND
from sharegpu.admission import checks
from sharegpu.kube.devicetaints import DEVICE_TAINT_RULE_KIND, validate_device_taint_rule
from sharegpuctl.cli import crosschecks
from sharegpuctl.cli.common import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, CliError, add_output_flag
from sharegpuctl.cli.loading import FileProblem, Manifest, load_manifests
from sharegpuctl.cli.output import emit, resolve_format
from sharegpuctl.cli.quota import load_quota, quota_verdicts

HELP = "check DeviceClass, ResourceClaim(Template) and Pod manifests offline"
DEFAULT_KUBERNETES_VERSION: Final = "{}.{}".format(*LATEST_KUBERNETES)
#: Longest finding message; schema messages quote the offending value, which may be large.
MAX_MESSAGE_CHARS: Final = 400
_GATE = re.compile(r"([A-Za-z][A-Za-z0-9]*)=(true|false)")
_API = re.compile(r"([a-z0-9][a-z0-9.-]*/v[0-9]+(?:(?:alpha|beta)[0-9]+)?)(?:=(true|false))?")
#: The kinds of this project's API group (``resource.sharegpu.dev``).
OWN_KINDS: Final = (GPU_CONFIG_KIND, names.GPU_KIND, GPU_QUOTA_KIND)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("validate", help=HELP, description=HELP + ".")
    p.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="manifest file or directory (recursive); repeatable; '-' reads standard input",
    )
    add_version_flags(p)
    p.add_argument(
        "--driver-name",
        default=names.DEFAULT_DRIVER_NAME,
        help=f"DRA driver name (default {names.DEFAULT_DRIVER_NAME})",
    )
    p.add_argument(
        "--quota",
        default=None,
        metavar="FILE",
        help="a GpuQuota (usage 0): report the ResourceClaims of its namespace it would deny",
    )
    add_output_flag(p)
    p.set_defaults(run=run)


def add_version_flags(p: Any) -> None:
    """``--kubernetes-version`` and ``--feature-gates``: what the checks of
    :func:`check_manifests` judge against (shared by ``validate`` and ``explain``)."""
    p.add_argument(
        "--kubernetes-version",
        default=DEFAULT_KUBERNETES_VERSION,
        help=f"Kubernetes version whose schemas apply (default {DEFAULT_KUBERNETES_VERSION})",
    )
    p.add_argument(
        "--feature-gates",
        default="",
        metavar="GATES",
        help="feature gates of the cluster, as kube-apiserver takes them (NAME=true|false,...); "
        "the others have their defaults at --kubernetes-version (e.g. "
        f"{crosschecks.CONSUMABLE_CAPACITY_GATE}=true on 1.34/1.35 keeps capacity requests)",
    )
    p.add_argument(
        RUNTIME_CONFIG_FLAG,
        default="",
        metavar="APIS",
        help="API versions the cluster's kube-apiserver enables beyond its defaults, as it takes "
        "them (GROUP/VERSION=true,...), e.g. resource.k8s.io/v1beta2=true; a resource.k8s.io "
        "version that --kubernetes-version does not serve is an error",
    )


@dataclass(frozen=True)
class FileFinding:
    """A finding located in a file: ``FILE: KIND/NAME: PATH: severity: message``."""

    manifest: Manifest
    finding: checks.Finding

    def __str__(self) -> str:
        f = self.finding
        return f"{self.manifest.file}: {self.manifest.label}: {f.path}: {f.severity}: {f.message}"

    def to_json(self) -> Obj:
        return {
            "file": self.manifest.file,
            "document": self.manifest.document,
            "kind": self.manifest.kind,
            "name": self.manifest.name,
            "path": self.finding.path,
            "severity": self.finding.severity,
            "message": self.finding.message,
        }


@dataclass(frozen=True)
class LoadFinding:
    """A file that could not be read as manifests: ``FILE: WHERE: error: PROBLEM``."""

    problem: FileProblem

    @property
    def finding(self) -> checks.Finding:
        return checks.Finding(checks.ERROR, self.problem.where or "<file>", self.problem.problem)

    def __str__(self) -> str:
        where = f"{self.problem.where}: " if self.problem.where else ""
        return f"{self.problem.file}: {where}{checks.ERROR}: {self.problem.problem}"

    def to_json(self) -> Obj:
        return {
            "file": self.problem.file,
            "document": None,
            "kind": None,
            "name": None,
            "path": self.problem.where or "<file>",
            "severity": checks.ERROR,
            "message": self.problem.problem,
        }


# --- the individual checks -------------------------------------------------------------------


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text``, with its middle cut out when longer than ``limit`` (both ends stay readable)."""
    if len(text) <= limit:
        return text
    keep = (limit - 5) // 2
    return f"{text[:keep]} ... {text[-keep:]}"


def _json_path(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<root>"


def own_kind_findings(obj: Obj) -> list[checks.Finding]:
    """A kind of this project's API group that does not exist (``GPUConfig``, ``GpuConfg``)."""
    kind = str(obj.get("kind"))
    if kind in OWN_KINDS:
        return []
    lowered = {k.lower(): k for k in OWN_KINDS}
    match = lowered.get(kind.lower())
    if match is None:
        close = difflib.get_close_matches(kind, OWN_KINDS, n=1, cutoff=0.6)
        match = close[0] if close else None
    hint = f"; did you mean {match!r}? (kinds are case-sensitive)" if match else ""
    return [
        checks.Finding(
            checks.ERROR,
            "kind",
            f"{names.API_GROUP} has no kind {kind!r}{hint} (kinds: {', '.join(OWN_KINDS)})",
        )
    ]


def served_version_findings(
    obj: Obj, version: str, enabled: Collection[str] = ()
) -> list[checks.Finding]:
    """An error when ``version``'s API server does not serve the object's ``resource.k8s.io``
    version (:mod:`api.apiversions`), with the hints that say how its requests look in v1
    (:func:`sharegpu.admission.checks.request_field_hints` of the object as v1)."""
    release = crosschecks.parse_version(version)
    api_version = str(obj.get("apiVersion", ""))
    problem = unserved_problem(api_version, release, enabled) if release else None
    if problem is None:
        return []
    as_v1 = {**obj, "apiVersion": names.RESOURCE_GROUP_VERSION}
    return [checks.Finding(checks.ERROR, "apiVersion", problem), *checks.request_field_hints(as_v1)]


def schema_findings(obj: Obj, version: str) -> list[checks.Finding]:
    """The strict official schema of the object's kind (first violation); a schema error about
    a request field that :func:`sharegpu.admission.checks.request_field_hints` explains is
    replaced by those hints."""
    group = str(obj.get("apiVersion", "")).partition("/")[0]
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        if group == names.API_GROUP:
            return own_kind_findings(obj)
        return [
            checks.Finding(
                checks.ERROR,
                "<root>",
                f"Kubernetes {version} has no schema for {obj.get('apiVersion')} {obj.get('kind')}",
            )
        ]
    except kubernetes_validate.ValidationError as err:
        path = _json_path(err.path)
        hints = checks.request_field_hints(obj)
        if any(h.path == path for h in hints):
            return hints
        return [
            checks.Finding(
                checks.ERROR, path, f"schema (Kubernetes {version}): {shorten(err.message)}"
            ),
            *hints,
        ]
    return []


def _selectors(node: Any, path: str) -> Iterable[tuple[str, str]]:
    """``(path, expression)`` of every ``selectors[i].cel.expression`` under ``node``."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "selectors" and isinstance(value, list):
                for i, sel in enumerate(value):
                    cel = sel.get("cel") if isinstance(sel, Mapping) else None
                    expr = cel.get("expression") if isinstance(cel, Mapping) else None
                    if isinstance(expr, str):
                        yield f"{where}[{i}].cel.expression", expr
            else:
                yield from _selectors(value, where)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _selectors(item, f"{path}[{i}]")


def foreign_selector_findings(obj: Obj, driver: str) -> list[checks.Finding]:
    """CEL compile errors of selectors that do not name this driver (those that do are
    :func:`sharegpu.admission.checks.check_selector`'s)."""
    findings = []
    for path, expr in _selectors(obj.get("spec"), "spec"):
        if not checks.selector_mentions_driver(expr, driver):
            findings += checks.compile_findings(expr, path)
    return findings


def gpu_config_findings(obj: Obj) -> list[checks.Finding]:
    """A standalone GpuConfig document, decoded as the plugin decodes it."""
    try:
        parse_gpu_config(obj)
    except GpuConfigError as exc:
        return [checks.Finding(checks.ERROR, "<root>", m) for m in exc.messages]
    return []


def gpu_quota_findings(obj: Obj) -> list[checks.Finding]:
    """A GpuQuota document, decoded as the controller decodes it."""
    try:
        parse_gpu_quota(obj)
    except GpuQuotaError as exc:
        return [checks.Finding(checks.ERROR, "<root>", m) for m in exc.messages]
    return []


def pod_claim_findings(obj: Obj) -> list[checks.Finding]:
    """Claims used by containers are defined by the pod, each by exactly one source."""
    located = crosschecks.pod_spec(obj)
    if located is None:
        return []
    base, spec = located
    findings: list[checks.Finding] = []
    defined: set[str] = set()
    for i, entry in enumerate(spec.get("resourceClaims") or []):
        if not isinstance(entry, Mapping):
            continue
        defined.add(str(entry.get("name")))
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if entry.get(k)]
        if len(sources) != 1:
            findings.append(
                checks.Finding(
                    checks.ERROR,
                    f"{base}.resourceClaims[{i}]",
                    "must set exactly one of resourceClaimName and resourceClaimTemplateName",
                )
            )
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            if not isinstance(container, Mapping):
                continue
            claims = (container.get("resources") or {}).get("claims") or []
            for j, claim in enumerate(claims):
                name = claim.get("name") if isinstance(claim, Mapping) else None
                if name not in defined:
                    findings.append(
                        checks.Finding(
                            checks.ERROR,
                            f"{base}.{group}[{i}].resources.claims[{j}].name",
                            f"claim {name!r} is not defined in {base}.resourceClaims"
                            + (f" (defined: {', '.join(sorted(defined))})" if defined else ""),
                        )
                    )
    return findings


def device_taint_rule_findings(obj: Obj) -> list[checks.Finding]:
    """A ``resource.k8s.io`` DeviceTaintRule's rules beyond its schema, as the API server checks
    them (:func:`sharegpu.kube.devicetaints.validate_device_taint_rule`): selector names, the
    taint's key, value and effect."""
    group = str(obj.get("apiVersion", "")).partition("/")[0]
    if obj.get("kind") != DEVICE_TAINT_RULE_KIND or group != names.RESOURCE_GROUP:
        return []
    findings = []
    for problem in validate_device_taint_rule(obj):
        path, _, message = problem.partition(": ")
        findings.append(checks.Finding(checks.ERROR, path, message))
    return findings


def driver_classes(manifests: Sequence[Manifest], driver: str) -> list[str]:
    """DeviceClasses among the manifests whose selectors name the driver."""
    return [
        m.name
        for m in manifests
        if m.kind == "DeviceClass"
        and any(checks.selector_mentions_driver(e, driver) for _, e in _selectors(m.obj, ""))
    ]


def validate_manifest(manifest: Manifest, ctx: crosschecks.Context) -> list[checks.Finding]:
    """Every finding of one object (see the module docstring)."""
    obj = manifest.obj
    if not obj.get("apiVersion") or not obj.get("kind"):
        return [checks.Finding(checks.ERROR, "<root>", "apiVersion and kind are required")]
    findings = served_version_findings(obj, ctx.version, ctx.enabled_api_versions)
    if not findings:
        findings = schema_findings(obj, ctx.version)
    findings += checks.check_object(obj, ctx.driver, ctx.classes, ctx.class_configs.get)
    findings += foreign_selector_findings(obj, ctx.driver)
    if obj.get("kind") == "GpuConfig":
        findings += gpu_config_findings(obj)
    if obj.get("kind") == GPU_QUOTA_KIND:
        findings += gpu_quota_findings(obj)
    findings += device_taint_rule_findings(obj)
    findings += pod_claim_findings(obj)
    findings += crosschecks.cross_findings(obj, ctx)
    return findings


def check_manifests(
    manifests: Sequence[Manifest],
    driver: str,
    version: str,
    gates: Mapping[str, bool] | None = None,
    enabled_api_versions: Collection[str] = (),
) -> list[FileFinding]:
    """Every finding of every object of ``manifests`` (see the module docstring), in order;
    ``enabled_api_versions``: the ``group/version`` strings of ``--runtime-config``."""
    ctx = crosschecks.Context.of(
        manifests,
        driver,
        version,
        gates or {},
        driver_classes(manifests, driver),
        enabled_api_versions,
    )
    return [FileFinding(m, f) for m in manifests for f in validate_manifest(m, ctx)]


def validate_paths(
    paths: Sequence[str],
    driver: str,
    version: str,
    gates: Mapping[str, bool] | None = None,
    enabled_api_versions: Collection[str] = (),
) -> tuple[int, list[FileFinding | LoadFinding]]:
    """``(number of objects, findings)`` for the files and directories named: first the files
    that could not be read, then the findings of every object of the others."""
    problems: list[FileProblem] = []
    manifests = load_manifests(paths, problems=problems)
    found: list[FileFinding | LoadFinding] = [LoadFinding(p) for p in problems]
    found += check_manifests(manifests, driver, version, gates, enabled_api_versions)
    return len(manifests), found


def quota_file_findings(
    quota_file: str, paths: Sequence[str], driver: str
) -> list[FileFinding | LoadFinding]:
    """The denials of the GpuQuota in ``quota_file`` (usage 0) for the claims in ``paths``
    (:mod:`sharegpuctl.cli.quota`)."""
    quota = load_quota(quota_file)
    manifests = load_manifests(paths, problems=[])
    classes = driver_classes(manifests, driver)
    return [FileFinding(m, f) for m, f in quota_verdicts(quota, manifests, driver, classes)]


def check_version(version: str) -> str:
    """``version`` when kubernetes-validate has schemas for it; else a usage error."""
    known = [v for v in (crosschecks.parse_version(k) for k in all_versions()) if v is not None]
    wanted = crosschecks.parse_version(version)
    if wanted is None or not known or not min(known) <= wanted <= max(known):
        lo, hi = min(known), max(known)
        raise CliError(
            f"--kubernetes-version {version}: not supported by kubernetes-validate "
            f"{kubernetes_validate.__version__} (supported: {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]})",
            EXIT_USAGE,
        )
    return version.removeprefix("v")


def parse_feature_gates(text: str) -> dict[str, bool]:
    """``A=true,B=false`` -> ``{"A": True, "B": False}``; anything else is a usage error."""
    gates: dict[str, bool] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        m = _GATE.fullmatch(item)
        if m is None:
            raise CliError(
                f"--feature-gates {text}: {item!r} is not NAME=true or NAME=false", EXIT_USAGE
            )
        gates[m.group(1)] = m.group(2) == "true"
    return gates


def parse_runtime_config(text: str) -> frozenset[str]:
    """``G/V=true,G/V2`` -> the ``group/version`` strings enabled (kube-apiserver's
    ``--runtime-config``: a key alone means true; ``=false`` enables nothing); anything else is a
    usage error."""
    enabled: set[str] = set()
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        m = _API.fullmatch(item)
        if m is None:
            raise CliError(
                f"{RUNTIME_CONFIG_FLAG} {text}: {item!r} is not GROUP/VERSION=true or "
                "GROUP/VERSION=false",
                EXIT_USAGE,
            )
        if m.group(2) != "false":
            enabled.add(m.group(1))
    return frozenset(enabled)


def run(args: argparse.Namespace) -> int:
    version = check_version(str(args.kubernetes_version))
    gates = parse_feature_gates(str(args.feature_gates))
    enabled = parse_runtime_config(str(args.runtime_config))
    count, found = validate_paths(args.filename, args.driver_name, version, gates, enabled)
    if getattr(args, "quota", None):
        found += quota_file_findings(args.quota, args.filename, args.driver_name)
    errors = [f for f in found if f.finding.severity == checks.ERROR]
    warnings = [f for f in found if f.finding.severity == checks.WARNING]
    data = {
        "kubernetesVersion": version,
        "objects": count,
        "errors": len(errors),
        "warnings": len(warnings),
        "findings": [f.to_json() for f in found],
    }
    summary = (
        f"{count} object(s) checked against Kubernetes {version}: "
        f"{len(errors)} error(s), {len(warnings)} warning(s)"
    )
    fmt = resolve_format(args.output)
    if fmt in ("json", "yaml"):
        emit(data, [], fmt)
    else:
        print("\n".join([*(str(f) for f in found), summary]))
    return EXIT_FINDINGS if errors else EXIT_OK
