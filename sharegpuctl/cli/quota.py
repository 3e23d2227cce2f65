"""``sharegpu validate --quota FILE``: the verdict of a GpuQuota on the claims being checked.

The quota file holds one GpuQuota; its usage is taken as 0. The ResourceClaims of the checked
files that are in the quota's namespace (no namespace: ``default``) are charged in file order
with the controller's rule (:mod:`controller.quotacharge`, the same code as the admission
webhook), on the mock node the other offline commands use (8 H100 80GB GPUs: a request without
capacity is a whole GPU of that memory). A claim that would not fit is an error finding with the
webhook's denial text; the others add their charge to the usage.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from api.gpuquota import GpuQuota, GpuQuotaError, parse_gpu_quota
from api.names import GPU_QUOTA_KIND
from controller.quotacharge import Amounts, ChargeBasis, basis_of, demand, denial
from kubeletplugin.preview import reference_gpus, share_floor_cores
from sharegpu.admission import checks
from sharegpuctl.cli.common import EXIT_USAGE, CliError
from sharegpuctl.cli.loading import FileProblem, Manifest, load_manifests

#: GPUs of the offline mock node.
MOCK_GPUS = 8
#: The namespace of an object that names none (kubectl's default).
DEFAULT_NAMESPACE = "default"


def mock_basis() -> ChargeBasis:
    """The charge basis of the offline mock node."""
    gpus = reference_gpus("node-a", MOCK_GPUS)
    return basis_of(("node-a", g.memory_usable, share_floor_cores(g)) for g in gpus)


def load_quota(path: str) -> GpuQuota:
    """The one GpuQuota of ``path``; a usage error naming the problem otherwise."""
    problems: list[FileProblem] = []
    try:
        manifests = load_manifests([path], problems=problems)
    except CliError as exc:
        raise CliError(f"--quota {path}: {exc.message}", EXIT_USAGE) from None
    if problems:
        raise CliError(f"--quota {path}: {problems[0]}", EXIT_USAGE)
    quotas = [m for m in manifests if m.kind == GPU_QUOTA_KIND]
    if len(quotas) != 1:
        raise CliError(
            f"--quota {path}: expected one {GPU_QUOTA_KIND} document, found {len(quotas)}",
            EXIT_USAGE,
        )
    try:
        return parse_gpu_quota(quotas[0].obj)
    except GpuQuotaError as exc:
        raise CliError(f"--quota {path}: invalid {GPU_QUOTA_KIND}: {exc}", EXIT_USAGE) from None


def _namespace(manifest: Manifest) -> str:
    meta = manifest.obj.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    return ns if isinstance(ns, str) and ns else DEFAULT_NAMESPACE


def quota_verdicts(
    quota: GpuQuota,
    manifests: Sequence[Manifest],
    driver: str,
    classes: Iterable[str],
    basis: ChargeBasis | None = None,
) -> list[tuple[Manifest, checks.Finding]]:
    """The denials of ``quota`` (usage 0) for the ResourceClaims of its namespace, in order."""
    basis = basis or mock_basis()
    known = list(classes)
    used = Amounts()
    namespace = quota.namespace or DEFAULT_NAMESPACE
    out: list[tuple[Manifest, checks.Finding]] = []
    for m in manifests:
        if m.kind != "ResourceClaim" or _namespace(m) != namespace:
            continue
        spec = m.obj.get("spec")
        try:
            asked = demand(
                spec if isinstance(spec, dict) else {},
                driver,
                known,
                basis,
                quota.spec.device_class_names,
            )
        except ValueError as exc:
            out.append((m, checks.Finding(checks.ERROR, "spec", f"cannot be charged: {exc}")))
            continue
        refused = denial(quota, used, asked)
        if refused is not None:
            out.append((m, checks.Finding(checks.ERROR, "metadata.namespace", refused)))
        else:
            used += asked
    return out
