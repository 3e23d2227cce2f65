"""What ``sharegpu demo`` runs and what it tells the reader besides its tables.

- :func:`demo_claims`: the claims of the built-in examples (:data:`DEMO_EXAMPLES`), each with
  the directory it comes from, and the DeviceClasses those directories define (the burstable
  example's class allows memory burst); :func:`skipped_examples` says why the other directories
  of the examples are not run.
- :func:`user_claims`: the claims of ``demo -f``: ResourceClaims, ResourceClaimTemplates (one
  claim each, named like the template), DeviceClasses, and the pods and workloads that use them
  (a claim a pod names that is not in the files is reported, not run). Everything is read by
  the bounded loader (:mod:`sharegpuctl.cli.loading`) and checked against the Kubernetes schema
  first, so bad input ends the command with one line.
- :func:`override_notes`: what the GpuConfig that applies to each allocated request (a
  DeviceClass's or the claim's, resolved as the plugin resolves it) changes compared with the
  defaults the share alone would give.
- :data:`NEXT_STEPS`: the commands to run after the demo.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from api.gpuconfig import Sharing, decode_driver_configs
from api.jsontypes import Obj
from api.quantity import format_quantity, quantity_int
from api.sharepolicy import recorded_amounts
from sharegpuctl.cli.common import CliError
from sharegpuctl.cli.explain import claim_from_template, claim_refs
from sharegpuctl.cli.loading import Manifest, load_manifests
from sharegpuctl.cli.validate import DEFAULT_KUBERNETES_VERSION, schema_findings

NAMESPACE: Final = "default"
#: Example directories whose claims fit consumable mode, in the order they are allocated.
DEMO_EXAMPLES: Final = (
    "whole-gpu",
    "two-pods-fractional-share",
    "mps-with-overrides",
    "select-by-model-and-memory",
    "multi-gpu-same-pcie-root",
    "first-available",
    "burstable-shares",
)
#: Why each other example directory is not run by the demo.
SKIPPED_EXAMPLES: Final[Mapping[str, str]] = {
    "partitions": "needs --sharing-mode=partitions; the demo's plugin publishes in consumable mode",
    "admin-device-classes": "its quarter-GPU class selects partitions-mode devices; the demo's "
    "plugin publishes in consumable mode",
    "device-plugin-style": "has no claim: its pod asks for nvidia.com/gpu, which needs the "
    "chart's extended-resource DeviceClass and kube-scheduler (DRAExtendedResource)",
    "time-slicing": "its claim is one whole GPU like whole-gpu's; what it adds is three "
    "replicas of a Deployment sharing that claim, and the demo runs no Deployments",
    "vllm-inference": "its template is the 50-core/20Gi share of two-pods-fractional-share; "
    "what it adds is a Deployment and a Service, which the demo does not run",
    "training-job": "its templates (a whole GPU; a 50-core/32Gi share) repeat whole-gpu and "
    "two-pods-fractional-share; what it adds is Jobs, which the demo does not run",
}
#: Why a directory of the examples that neither list names is not run.
NOT_IN_DEMO: Final = "not in the demo's set of consumable-mode examples"
#: What to do after the demo: (command, what it does).
NEXT_STEPS: Final = (
    (
        "sharegpu validate -f <your manifests>",
        "check your claims, templates, DeviceClasses and pods offline (schemas, CEL, GpuConfig)",
    ),
    (
        "sharegpu explain -f <claim.yaml>",
        "see where a claim would be allocated, or why each GPU is rejected",
    ),
    (
        "sharegpu demo -f <your manifests>",
        "run this demo on your own claims instead of the examples",
    ),
    (
        "helm install sharegpu deploy/helm/sharegpu --namespace sharegpu-system ...",
        "install the driver in a cluster: docs/install.md (kind, no GPUs: deploy/kind/run.sh)",
    ),
)


@dataclass
class ClaimInput:
    """One claim to allocate and prepare: where it comes from and who uses it."""

    source: str
    claim: Obj
    #: The example directory (built-in demo); None for ``-f`` input.
    example: str | None = None
    #: ``KIND/NAME`` of the pods and workloads of the files that use the claim.
    users: list[str] = field(default_factory=list)
    #: Whether the claim stands for a ResourceClaimTemplate (named like it).
    from_template: bool = False


@dataclass
class Inputs:
    """Claims to run, DeviceClasses to create, and what cannot run (claim, source, reason)."""

    claims: list[ClaimInput]
    classes: list[Obj] = field(default_factory=list)
    unusable: list[Obj] = field(default_factory=list)


def _as_claim(m: Manifest) -> Obj | None:
    if m.kind == "ResourceClaimTemplate":
        claim = claim_from_template(m.obj)
    elif m.kind == "ResourceClaim":
        claim = {k: v for k, v in m.obj.items() if k != "status"}
    else:
        return None
    claim["metadata"] = {"name": claim["metadata"]["name"], "namespace": NAMESPACE}
    return claim


def demo_claims(examples: Path) -> Inputs:
    """Every ResourceClaim(Template) of :data:`DEMO_EXAMPLES`, with its directory, and the
    DeviceClasses of those directories."""
    if not examples.is_dir():
        raise CliError(f"examples directory {examples} not found (use --examples DIR)")
    out: list[ClaimInput] = []
    classes: list[Obj] = []
    for name in DEMO_EXAMPLES:
        directory = examples / name
        if not directory.is_dir():
            raise CliError(f"example {directory} not found")
        manifests = load_manifests([str(directory)])
        found: dict[tuple[str, str], ClaimInput] = {}
        for m in manifests:
            if m.kind == "DeviceClass":
                classes.append({k: v for k, v in m.obj.items() if k != "status"})
            claim = _as_claim(m)
            if claim is not None:
                found[(m.kind, claim["metadata"]["name"])] = ClaimInput(
                    m.file,
                    claim,
                    example=name,
                    from_template=m.kind == "ResourceClaimTemplate",
                )
        for m in manifests:
            for ref in claim_refs(m.obj):
                if ref in found:
                    found[ref].users.append(m.label)
        out.extend(found.values())
    return Inputs(out, classes)


def skipped_examples(examples: Path) -> list[Obj]:
    """``{"example", "reason"}`` for every directory of ``examples`` the demo does not run."""
    found = sorted(p.name for p in examples.iterdir() if p.is_dir()) if examples.is_dir() else []
    return [
        {"example": name, "reason": SKIPPED_EXAMPLES.get(name, NOT_IN_DEMO)}
        for name in found
        if name not in DEMO_EXAMPLES
    ]


# --- demo -f ------------------------------------------------------------------------------------


def _check(m: Manifest) -> None:
    """One line for the first schema error of a claim, template or class of ``-f``."""
    metadata = m.obj.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        raise CliError(f"{m.file}: document {m.document}: {m.kind} has no metadata.name")
    for finding in schema_findings(m.obj, DEFAULT_KUBERNETES_VERSION):
        if finding.severity == "error":
            raise CliError(
                f"{m.file}: {m.label}: {finding.path}: {finding.message} "
                f"(sharegpu validate -f {m.file} lists every problem)"
            )


def user_claims(paths: Sequence[str]) -> Inputs:
    """The claims, DeviceClasses and claim users of ``paths`` (``demo -f``)."""
    manifests = load_manifests(paths)
    claims: dict[tuple[str, str], ClaimInput] = {}
    classes: list[Obj] = []
    for m in manifests:
        if m.kind in ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass"):
            _check(m)
        if m.kind == "DeviceClass":
            classes.append({k: v for k, v in m.obj.items() if k != "status"})
            continue
        claim = _as_claim(m)
        if claim is None:
            continue
        key = (m.kind, claim["metadata"]["name"])
        if key in claims:
            raise CliError(
                f"{m.file}: {m.label} appears twice (also in {claims[key].source}); names of "
                "one kind must be unique"
            )
        claims[key] = ClaimInput(m.file, claim, from_template=m.kind == "ResourceClaimTemplate")
    if not claims:
        raise CliError(
            f"no ResourceClaim or ResourceClaimTemplate in {', '.join(paths)}: the demo "
            "allocates and prepares claims"
        )
    unusable: list[Obj] = []
    for m in manifests:
        for kind, name in claim_refs(m.obj):
            found = claims.get((kind, name))
            if found is not None:
                found.users.append(m.label)
            else:
                unusable.append(
                    {
                        "claim": f"{NAMESPACE}/{name}",
                        "source": m.file,
                        "example": None,
                        "usedBy": [m.label],
                        "allocated": False,
                        "reason": f"{m.label} uses {kind} {name}, which is not in the files given",
                    }
                )
    return Inputs(list(claims.values()), classes, unusable)


# --- GpuConfig overrides ------------------------------------------------------------------------


def _compare(name: str, value: Any, share: Any, what: str) -> str:
    base = f"{name}={value}"
    return f"{base} (the share alone gives {share} {what})" if share is not None else base


def _override_text(sharing: Sharing, cores: Any, memory: Any) -> str:
    """What ``sharing`` sets: its strategy and each limit, next to what the share gives."""
    parts = []
    if sharing.strategy:
        parts.append(f"strategy {sharing.strategy}")
    mps = sharing.mps
    if mps is not None and mps.active_thread_percentage is not None:
        parts.append(
            _compare(
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", mps.active_thread_percentage, cores, "cores"
            )
        )
    if mps is not None and mps.pinned_memory_limit is not None:
        parts.append(
            _compare("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", mps.pinned_memory_limit, memory, "")
        )
    limits = sharing.limits
    if limits is not None and limits.sm_limit is not None:
        parts.append(_compare("CUDA_DEVICE_SM_LIMIT", limits.sm_limit, cores, "cores"))
    if limits is not None and limits.device_memory_limit is not None:
        parts.append(_compare("CUDA_DEVICE_MEMORY_LIMIT", limits.device_memory_limit, memory, ""))
    limit = sharing.burst_limit
    if limit is not None:
        amounts = [f"{limit.cores} cores"] if limit.cores is not None else []
        amounts += [limit.memory] if limit.memory is not None else []
        reserved = [f"{cores} cores"] if cores is not None else []
        reserved += [str(memory)] if memory is not None else []
        text = f"burstable to {' and '.join(amounts)}"
        parts.append(f"{text} (reserves {' and '.join(reserved)})" if reserved else text)
    slicing = sharing.time_slicing
    if slicing is not None and "interval" in slicing.model_fields_set:
        parts.append(f"time slice {slicing.interval}")
    return "; ".join(p.replace(" )", ")") for p in parts)


def override_notes(allocation: Mapping[str, Any], results: Sequence[Obj], driver: str) -> list[Obj]:
    """``{"request", "device", "override"}`` for each allocated request a GpuConfig overrides:
    the strategy it sets and each limit it puts below the share.

    The configs are the allocation's (``devices.config``: the DeviceClasses' entries, then the
    claim's), chosen by :meth:`~api.gpuconfig.DriverConfigs.chosen`, the resolution the plugin
    enforces; invalid configs give no rows (the plugin refuses the claim and prepare says why).
    """
    raw = (allocation.get("devices") or {}).get("config") or []
    configs = decode_driver_configs(raw if isinstance(raw, list) else [], driver)
    if configs.error() is not None:
        return []
    out = []
    for result in results:
        request = str(result.get("request", ""))
        config = configs.chosen(request)
        if config is None or config.sharing is None:
            continue
        consumed = result.get("consumedCapacity") or {}
        cores, memory = recorded_amounts(consumed, driver, lambda _, v: quantity_int(v))
        shown = None if memory is None else format_quantity(memory)
        text = _override_text(config.sharing, cores, shown)
        if text:
            out.append({"request": request, "device": result.get("device"), "override": text})
    return out
