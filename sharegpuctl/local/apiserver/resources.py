"""The table of resources the in-process API server serves.

Adding a resource is one :class:`ResourceType` entry: group, version, plural, kind, scope,
subresources, the field labels it can be selected by, and optional admission hooks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from api import gates, names
from sharegpuctl.local.apiserver.quantities import quantity_problem
from sharegpuctl.local.apiserver.validation import (
    resource_schema_validator,
    validate_device_taint_rule_object,
    validate_resource_slice_object,
)

#: Field labels every resource supports.
COMMON_FIELD_LABELS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass(frozen=True)
class ResourceType:
    """One REST resource.

    ``validate`` returns ``path: message`` strings for an object about to be stored (create and
    update); ``validate_update(old, new)`` adds checks that need the old object (immutability).
    ``status_on_create``: whether ``status`` given on create is kept (otherwise it is dropped, as
    the real server does for resources with a status subresource).
    ``apply_defaults`` fills server-set fields into a fresh copy of the object on create and
    update (before validation).
    ``allow_unconditional_update``: whether PUT may omit ``metadata.resourceVersion`` (custom
    resources and CRDs require it, like the real server).
    ``decode_problem`` returns why the real server could not even decode the object (a
    malformed Quantity), answered 400 BadRequest before any validation. ``prune`` drops, in
    place, the fields the type does not declare (before validation, on every write, status
    writes included). ``short_names``, ``categories`` and ``printer_columns``
    (``additionalPrinterColumns``) are what discovery and Table answers show. ``crd``: the
    CustomResourceDefinition a custom resource type was made from (:mod:`.crds`).
    ``refused``: a type served only to say why it is not run here: every write is answered 405
    with this message and nothing is stored (reads find nothing).
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: frozenset[str] = frozenset()
    field_labels: frozenset[str] = frozenset()
    validate: Callable[[dict[str, Any]], list[str]] | None = None
    validate_update: Callable[[dict[str, Any], dict[str, Any]], list[str]] | None = None
    apply_defaults: Callable[[dict[str, Any]], None] | None = None
    status_on_create: bool = False
    allow_unconditional_update: bool = True
    default_status: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    prune: Callable[[dict[str, Any]], list[str]] | None = field(default=None, compare=False)
    decode_problem: Callable[[dict[str, Any]], str | None] | None = field(
        default=None, compare=False
    )
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    printer_columns: tuple[dict[str, Any], ...] = field(default=(), hash=False, compare=False)
    crd: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    refused: str = ""

    @property
    def api_version(self) -> str:
        """``group/version``, or just ``version`` for the core group."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular_name(self) -> str:
        """The singular name (``kind`` in lower case unless the type names one)."""
        return self.singular or self.kind.lower()

    @property
    def has_status(self) -> bool:
        """Whether ``status`` is written only through the ``/status`` subresource."""
        return "status" in self.subresources

    @property
    def qualified(self) -> str:
        """``plural.group`` (``plural`` for the core group), as used in error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def selectable_fields(self) -> frozenset[str]:
        """All field labels accepted in ``fieldSelector``."""
        return COMMON_FIELD_LABELS | self.field_labels


def _immutable(*paths: str) -> Callable[[dict[str, Any], dict[str, Any]], list[str]]:
    def check(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
        messages = []
        for path in paths:
            if _lookup(old, path) != _lookup(new, path):
                messages.append(f"{path}: field is immutable")
        return messages

    return check


def _lookup(obj: dict[str, Any], path: str) -> Any:
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, dict):
            return None
        current = current.get(part)
    return current


def _default_taint_time(obj: dict[str, Any]) -> None:
    """Device taints get ``timeAdded`` (now) when they lack it, as the real server does."""
    spec = obj.get("spec")
    devices = spec.get("devices") if isinstance(spec, dict) else None
    if not isinstance(devices, list):
        return
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for device in devices:
        taints = device.get("taints") if isinstance(device, dict) else None
        for taint in taints if isinstance(taints, list) else []:
            if isinstance(taint, dict) and not taint.get("timeAdded"):
                taint["timeAdded"] = now


def _default_device_request(request: Any) -> None:
    if not isinstance(request, dict):
        return
    request.setdefault("allocationMode", "ExactCount")
    if request["allocationMode"] == "ExactCount":
        request.setdefault("count", 1)
    tolerations = request.get("tolerations")
    for toleration in tolerations if isinstance(tolerations, list) else []:
        if isinstance(toleration, dict):
            toleration.setdefault("operator", "Equal")


def _default_claim_spec(spec: Any) -> None:
    """``allocationMode`` ExactCount, ``count`` 1 and toleration ``operator`` Equal, as the real
    server defaults them in every exact request and sub-request."""
    devices = spec.get("devices") if isinstance(spec, dict) else None
    requests = devices.get("requests") if isinstance(devices, dict) else None
    for request in requests if isinstance(requests, list) else []:
        if not isinstance(request, dict):
            continue
        _default_device_request(request.get("exactly"))
        subrequests = request.get("firstAvailable")
        for sub in subrequests if isinstance(subrequests, list) else []:
            _default_device_request(sub)


def _default_claim(obj: dict[str, Any]) -> None:
    _default_claim_spec(obj.get("spec"))


def _default_claim_template(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict):
        _default_claim_spec(spec.get("spec"))


def _then(
    first: Callable[[dict[str, Any]], None], disabled_gates: Collection[str]
) -> Callable[[dict[str, Any]], None]:
    """``first``, then the fields of ``disabled_gates`` dropped, as an API server with those
    feature gates off stores the object (no error, even with ``fieldValidation=Strict``)."""
    if not disabled_gates:
        return first

    def apply(obj: dict[str, Any]) -> None:
        first(obj)
        kept = gates.without(obj, disabled_gates)
        obj.clear()
        obj.update(kept)

    return apply


def default_resources(disabled_gates: Collection[str] = ()) -> list[ResourceType]:
    """The resources sharegpu's components and tests use, the project's CRDs included.

    ``disabled_gates``: feature gates (:mod:`api.gates`) off on this server, whose fields it
    drops from ResourceSlices and ResourceClaims, as Kubernetes 1.34 and 1.35 drop the
    consumable-capacity fields by default."""
    # imported here: these modules build on the ResourceTypes of this module
    from sharegpuctl.local.apiserver.builtinschema import pruner
    from sharegpuctl.local.apiserver.crds import (
        builtin_crds,
        crd_problems,
        default_crd_status,
        resource_type,
    )

    status = frozenset({"status"})
    types = [
        ResourceType(
            "",
            "v1",
            "nodes",
            "Node",
            namespaced=False,
            short_names=("no",),
            subresources=status,
            field_labels=frozenset({"spec.unschedulable"}),
            status_on_create=True,
        ),
        ResourceType(
            "",
            "v1",
            "namespaces",
            "Namespace",
            namespaced=False,
            short_names=("ns",),
            subresources=status,
            field_labels=frozenset({"status.phase"}),
            default_status={"phase": "Active"},
        ),
        ResourceType(
            "",
            "v1",
            "pods",
            "Pod",
            namespaced=True,
            short_names=("po",),
            categories=("all",),
            subresources=status,
            field_labels=frozenset(
                {
                    "spec.nodeName",
                    "spec.schedulerName",
                    "spec.serviceAccountName",
                    "spec.restartPolicy",
                    "status.phase",
                    "status.podIP",
                }
            ),
            default_status={"phase": "Pending"},
        ),
        ResourceType(
            names.RESOURCE_GROUP,
            names.RESOURCE_VERSION,
            "resourceslices",
            "ResourceSlice",
            decode_problem=functools.partial(quantity_problem, "ResourceSlice"),
            namespaced=False,
            field_labels=frozenset({"spec.nodeName", "spec.driver"}),
            validate=validate_resource_slice_object,
            validate_update=_immutable("spec.driver", "spec.pool.name", "spec.nodeName"),
            apply_defaults=_then(_default_taint_time, disabled_gates),
        ),
        ResourceType(
            names.RESOURCE_GROUP,
            names.RESOURCE_VERSION,
            "resourceclaims",
            "ResourceClaim",
            decode_problem=functools.partial(quantity_problem, "ResourceClaim"),
            namespaced=True,
            subresources=status,
            validate=resource_schema_validator("ResourceClaim"),
            validate_update=_immutable("spec"),
            apply_defaults=_then(_default_claim, disabled_gates),
        ),
        ResourceType(
            names.RESOURCE_GROUP,
            names.RESOURCE_VERSION,
            "resourceclaimtemplates",
            "ResourceClaimTemplate",
            decode_problem=functools.partial(quantity_problem, "ResourceClaimTemplate"),
            namespaced=True,
            validate=resource_schema_validator("ResourceClaimTemplate"),
            validate_update=_immutable("spec"),
            apply_defaults=_default_claim_template,
        ),
        ResourceType(
            names.RESOURCE_GROUP,
            names.RESOURCE_VERSION,
            "deviceclasses",
            "DeviceClass",
            namespaced=False,
            validate=resource_schema_validator("DeviceClass"),
        ),
        ResourceType(
            names.RESOURCE_GROUP,
            names.RESOURCE_VERSION,
            "devicetaintrules",
            "DeviceTaintRule",
            namespaced=False,
            subresources=status,
            validate=validate_device_taint_rule_object,
        ),
        ResourceType(
            "",
            "v1",
            "events",
            "Event",
            namespaced=True,
            short_names=("ev",),
            # the field labels the real server selects core/v1 Events by
            field_labels=frozenset(
                {
                    "involvedObject.kind",
                    "involvedObject.namespace",
                    "involvedObject.name",
                    "involvedObject.uid",
                    "involvedObject.apiVersion",
                    "involvedObject.resourceVersion",
                    "involvedObject.fieldPath",
                    "reason",
                    "reportingComponent",
                    "type",
                }
            ),
        ),
        ResourceType("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True),
        ResourceType(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            namespaced=False,
            subresources=status,
            validate=crd_problems,
            apply_defaults=default_crd_status,
            allow_unconditional_update=False,
            short_names=("crd", "crds"),
            categories=("api-extensions",),
        ),
        *(resource_type(crd) for crd in builtin_crds()),
        # Create-only reviews, answered from KubeAPIServer.reviews and never stored.
        ResourceType(
            "authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False
        ),
        ResourceType(
            "authorization.k8s.io",
            "v1",
            "subjectaccessreviews",
            "SubjectAccessReview",
            namespaced=False,
        ),
    ]
    # built-in kinds drop the fields their published schema does not declare, as decoding does
    return [
        dataclasses.replace(rt, prune=pruner(rt)) if rt.crd is None and rt.prune is None else rt
        for rt in types
    ]


class ResourceRegistry:
    """Lookup of resource types by plural (unique across groups) or by group/version/plural."""

    def __init__(self, types: Iterable[ResourceType]) -> None:
        self._by_plural: dict[str, ResourceType] = {}
        self._by_gvr: dict[tuple[str, str, str], ResourceType] = {}
        self._generation = 0
        for rt in types:
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        """Register ``rt``; plurals must be unique."""
        if rt.plural in self._by_plural:
            raise ValueError(f"resource {rt.plural!r} is already registered")
        self._by_plural[rt.plural] = rt
        self._by_gvr[(rt.group, rt.version, rt.plural)] = rt
        self._generation += 1

    @property
    def generation(self) -> int:
        """Changes whenever a type is added or removed (what is derived from the set of types,
        such as the OpenAPI documents, is rebuilt when it differs)."""
        return self._generation

    def replace(self, rt: ResourceType) -> None:
        """Register ``rt`` in place of the type of the same plural (a changed CRD)."""
        self.remove(rt.plural)
        self.add(rt)

    def remove(self, plural: str) -> ResourceType | None:
        """Stop serving ``plural``; returns the type it was, if any."""
        rt = self._by_plural.pop(plural, None)
        if rt is not None:
            self._by_gvr.pop((rt.group, rt.version, rt.plural), None)
            self._generation += 1
        return rt

    def get(self, plural: str) -> ResourceType:
        """The resource type named ``plural``; KeyError naming the known ones otherwise."""
        try:
            return self._by_plural[plural]
        except KeyError:
            raise KeyError(
                f"unknown resource {plural!r}; known: {', '.join(sorted(self._by_plural))}"
            ) from None

    def find(self, group: str, version: str, plural: str) -> ResourceType | None:
        """The resource type served at ``group/version/plural``, if any."""
        return self._by_gvr.get((group, version, plural))

    def all(self) -> list[ResourceType]:
        """Every registered type."""
        return list(self._by_plural.values())


#: Workload kinds a cluster of only an API server, a scheduler step and one kubelet does not run:
#: (group, version, plural, kind, short names).
WORKLOAD_KINDS: Final = (
    ("apps", "v1", "deployments", "Deployment", ("deploy",)),
    ("apps", "v1", "replicasets", "ReplicaSet", ("rs",)),
    ("apps", "v1", "statefulsets", "StatefulSet", ("sts",)),
    ("apps", "v1", "daemonsets", "DaemonSet", ("ds",)),
    ("batch", "v1", "jobs", "Job", ()),
    ("batch", "v1", "cronjobs", "CronJob", ("cj",)),
    ("", "v1", "services", "Service", ("svc",)),
    ("", "v1", "replicationcontrollers", "ReplicationController", ("rc",)),
)


def refused_kinds(why: Callable[[str], str]) -> list[ResourceType]:
    """The :data:`WORKLOAD_KINDS` as types that refuse every write with ``why(kind)``."""
    return [
        ResourceType(
            group, version, plural, kind, namespaced=True, short_names=short, refused=why(kind)
        )
        for group, version, plural, kind, short in WORKLOAD_KINDS
    ]
