"""The OpenAPI v3 documents of the in-process API server, as kubectl reads them.

``GET /openapi/v3`` lists one document per served group-version; ``GET
/openapi/v3/apis/<group>/<version>`` (``/openapi/v3/api/v1`` for the core group) is that
document: the paths of its resources, each operation marked with ``x-kubernetes-action`` and
``x-kubernetes-group-version-kind`` (kubectl ``explain`` finds a resource's kind there, and
``apply``/``edit`` read the ``fieldValidation`` parameter of its PATCH to leave validation to
the server), and the schemas of its kinds in ``components``.

Everything is derived from what the server already serves: the registry's resource types, the
built-in kinds' definitions of :data:`~.validation.SCHEMA_KUBERNETES_VERSION` (the schemas the
server validates with, converted back from JSON Schema to OpenAPI 3.0) and each custom
resource's ``openAPIV3Schema`` from its CRD. Invariants: every ``$ref`` of a document resolves
in its own ``components``; request and response media types are only those this server reads
and writes (JSON and YAML, the patch types of :mod:`.patch`), never protobuf or apply patches.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import threading
from collections.abc import Iterable
from typing import Any, Final

from api.jsontypes import Obj
from sharegpuctl.local.apiserver.patch import CUSTOM_RESOURCE_PATCH_TYPES, SUPPORTED_PATCH_TYPES
from sharegpuctl.local.apiserver.resources import ResourceRegistry, ResourceType
from sharegpuctl.local.apiserver.reviews import REVIEW_PLURALS
from sharegpuctl.local.apiserver.validation import (
    SCHEMA_KUBERNETES_VERSION,
    definition_name,
    published_definitions,
)

#: Where this server serves the OpenAPI v3 documents.
OPENAPI_V3_PREFIX: Final = "/openapi/v3"
#: Media types of the objects this server reads and writes.
OBJECT_MEDIA_TYPES: Final = ("application/json", "application/yaml")
_SCHEMAS: Final = "#/components/schemas/"
_DEFS: Final = "#/$defs/"
_META: Final = "io.k8s.apimachinery.pkg.apis.meta.v1."
OBJECT_META: Final = _META + "ObjectMeta"
LIST_META: Final = _META + "ListMeta"
STATUS: Final = _META + "Status"
DELETE_OPTIONS: Final = _META + "DeleteOptions"
PATCH: Final = _META + "Patch"


def _param(name: str, kind: str, description: str, where: str = "query") -> Obj:
    return {
        "name": name,
        "in": where,
        "description": description,
        **({"required": True} if where == "path" else {}),
        "schema": {"type": kind, "uniqueItems": True},
    }


_DRY_RUN: Final = _param("dryRun", "string", "When present (All), nothing is persisted.")
_FIELD_MANAGER: Final = _param("fieldManager", "string", "The name of the actor of the change.")
_FIELD_VALIDATION: Final = _param(
    "fieldValidation",
    "string",
    "How unknown fields of the object are handled: Ignore or Warn (dropped), Strict (refused).",
)
_WRITE_PARAMS: Final = (_DRY_RUN, _FIELD_MANAGER, _FIELD_VALIDATION)
_LIST_PARAMS: Final = (
    _param("labelSelector", "string", "Only objects whose labels match."),
    _param("fieldSelector", "string", "Only objects whose fields match."),
    _param("resourceVersion", "string", "Where a watch starts."),
    _param("timeoutSeconds", "integer", "How long a watch lasts."),
    _param("watch", "boolean", "Stream changes instead of listing."),
)
_DELETE_PARAMS: Final = (
    _DRY_RUN,
    _param("propagationPolicy", "string", "Orphan keeps the dependents; otherwise deleted."),
)


# --- schemas ----------------------------------------------------------------------------------


def _openapi_schema(node: Any) -> Any:
    """A JSON Schema node of the definitions as OpenAPI 3.0 writes it: ``type: [X, "null"]``
    becomes ``type: X``; ``$ref`` points into ``components``, wrapped in ``allOf`` when the
    node has more to say (a description), as kube-apiserver publishes it."""
    if isinstance(node, list):
        return [_openapi_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: Obj = {}
    for key, value in node.items():
        if key == "$ref":
            continue
        if key == "type" and isinstance(value, list):
            out[key] = next((t for t in value if t != "null"), "null")
        else:
            out[key] = _openapi_schema(value)
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return out
    target = {"$ref": _SCHEMAS + ref.removeprefix(_DEFS)}
    return {"allOf": [target], **out} if out else target


def _refs(node: Any) -> Iterable[str]:
    """The component names ``node`` refers to."""
    if isinstance(node, list):
        for item in node:
            yield from _refs(item)
    elif isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_SCHEMAS):
            yield ref.removeprefix(_SCHEMAS)
        for value in node.values():
            yield from _refs(value)


@functools.cache
def _builtin_schema(name: str) -> Obj:
    """The published definition ``name`` in OpenAPI 3.0 form; the ``enum`` the JSON Schema
    conversion put on a kind's ``apiVersion`` and ``kind`` (the API server has none) dropped."""
    schema: Obj = _openapi_schema(published_definitions()[name])
    props = schema.get("properties")
    if "x-kubernetes-group-version-kind" in schema and isinstance(props, dict):
        for field in ("apiVersion", "kind"):
            if isinstance(props.get(field), dict):
                props[field].pop("enum", None)
    return schema


def _gvk(rt: ResourceType, kind: str) -> Obj:
    return {"group": rt.group, "version": rt.version, "kind": kind}


def component_name(rt: ResourceType, kind: str) -> str:
    """The component a kind of ``rt``'s group-version is published under: the definition's name
    for built-in kinds, the reversed group then version and kind for custom resources
    (``dev.sharegpu.resource.v1alpha1.GPU``), as kube-apiserver names them."""
    known = definition_name(rt.group, rt.version, kind)
    if known is not None and rt.crd is None:
        return known
    return ".".join([*reversed(rt.group.split(".")), rt.version, kind])


@functools.cache
def _type_meta(kind: str) -> dict[str, str]:
    """The descriptions of ``apiVersion``, ``kind`` and ``metadata`` every built-in object
    (``kind="Namespace"``) or list (``"NamespaceList"``) carries; custom resources get the
    same ones, as kube-apiserver publishes them."""
    props = published_definitions()[f"io.k8s.api.core.v1.{kind}"]["properties"]
    return {f: str(props[f].get("description", "")) for f in ("apiVersion", "kind", "metadata")}


def _custom_schema(rt: ResourceType) -> Obj:
    """A custom resource's schema: its CRD's ``openAPIV3Schema`` with the ``apiVersion``,
    ``kind`` and ``metadata`` every object has, and its group-version-kind."""
    assert rt.crd is not None
    versions = rt.crd["spec"].get("versions") or []
    version: Obj = next((v for v in versions if v.get("name") == rt.version), {})
    given = (version.get("schema") or {}).get("openAPIV3Schema")
    schema: Obj = copy.deepcopy(given) if isinstance(given, dict) else {}
    if not given:
        schema.update({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
    props = schema.setdefault("properties", {})
    described = _type_meta("Namespace")
    for field in ("apiVersion", "kind"):
        props[field] = {"type": "string", "description": described[field]}
    props["metadata"] = {
        "allOf": [{"$ref": _SCHEMAS + OBJECT_META}],
        "description": described["metadata"],
    }
    schema["x-kubernetes-group-version-kind"] = [_gvk(rt, rt.kind)]
    return schema


def _list_schema(rt: ResourceType, item: str) -> Obj:
    described = _type_meta("NamespaceList")
    return {
        "description": f"{rt.kind}List is a list of {rt.kind}",
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string", "description": described["apiVersion"]},
            "items": {
                "type": "array",
                "items": {"$ref": _SCHEMAS + item},
                "description": f"List of {rt.plural}. More info: "
                "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md",
            },
            "kind": {"type": "string", "description": described["kind"]},
            "metadata": {
                "allOf": [{"$ref": _SCHEMAS + LIST_META}],
                "description": described["metadata"],
            },
        },
        "x-kubernetes-group-version-kind": [_gvk(rt, f"{rt.kind}List")],
    }


def _kind_schemas(rt: ResourceType) -> dict[str, Obj]:
    """The schemas of ``rt``'s kind and list kind, by component name."""
    item, listed = component_name(rt, rt.kind), component_name(rt, f"{rt.kind}List")
    if rt.crd is not None:
        return {item: _custom_schema(rt), listed: _list_schema(rt, item)}
    out: dict[str, Obj] = {}
    if item in published_definitions():
        out[item] = _builtin_schema(item)
    else:  # a kind the schemas do not describe: an object of any fields
        out[item] = {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "x-kubernetes-group-version-kind": [_gvk(rt, rt.kind)],
        }
    if rt.plural not in REVIEW_PLURALS:
        has_list = listed in published_definitions()
        out[listed] = _builtin_schema(listed) if has_list else _list_schema(rt, item)
    return out


def _with_references(schemas: dict[str, Obj]) -> dict[str, Obj]:
    """``schemas`` plus every published definition they refer to, transitively."""
    out = dict(schemas)
    pending = [ref for schema in schemas.values() for ref in _refs(schema)]
    while pending:
        name = pending.pop()
        if name in out or name not in published_definitions():
            continue
        out[name] = _builtin_schema(name)
        pending.extend(_refs(out[name]))
    return dict(sorted(out.items()))


# --- paths ------------------------------------------------------------------------------------


def _content(ref: str, media_types: Iterable[str] = OBJECT_MEDIA_TYPES) -> Obj:
    return {m: {"schema": {"$ref": _SCHEMAS + ref}} for m in media_types}


def _operation(
    rt: ResourceType,
    action: str,
    operation_id: str,
    response: str,
    params: Iterable[Obj] = (),
    body: tuple[str, Iterable[str]] | None = None,
) -> Obj:
    op: Obj = {
        "description": f"{action} {rt.kind}",
        "operationId": operation_id,
        "parameters": list(params),
        "responses": {
            "200": {"description": "OK", "content": _content(response)},
            "401": {"description": "Unauthorized"},
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(rt, rt.kind),
    }
    if action in ("post", "put"):
        op["responses"]["201"] = {"description": "Created", "content": _content(response)}
    if body is not None:
        ref, media_types = body
        op["requestBody"] = {"content": _content(ref, media_types), "required": True}
    return op


def _camel(text: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in text.replace("-", ".").split("."))


def _paths(rt: ResourceType) -> dict[str, Obj]:
    """The paths of ``rt``: collection (list, create, delete collection), object (get, replace,
    patch, delete) and each subresource (get, replace, patch); reviews are create-only."""
    prefix = f"/apis/{rt.group}/{rt.version}" if rt.group else f"/api/{rt.version}"
    item = component_name(rt, rt.kind)
    listed = component_name(rt, f"{rt.kind}List")
    scope = "Namespaced" if rt.namespaced else ""
    ident = f"{_camel(rt.group) or 'Core'}{_camel(rt.version)}{scope}{rt.kind}"
    base = (
        f"{prefix}/namespaces/{{namespace}}/{rt.plural}"
        if rt.namespaced
        else (f"{prefix}/{rt.plural}")
    )
    ns_param = [_param("namespace", "string", "object name and auth scope", "path")]
    scope_params = ns_param if rt.namespaced else []
    name_param = [*scope_params, _param("name", "string", f"name of the {rt.kind}", "path")]
    write = (item, OBJECT_MEDIA_TYPES)
    if rt.plural in REVIEW_PLURALS:
        post = _operation(rt, "post", f"create{ident}", item, _WRITE_PARAMS, write)
        return {base: {"post": post, "parameters": scope_params}}
    paths: dict[str, Obj] = {
        base: {
            "get": _operation(rt, "list", f"list{ident}", listed, _LIST_PARAMS),
            "post": _operation(rt, "post", f"create{ident}", item, _WRITE_PARAMS, write),
            "delete": _operation(
                rt, "deletecollection", f"deletecollection{ident}", STATUS, _LIST_PARAMS[:2]
            ),
            "parameters": scope_params,
        },
    }
    if rt.namespaced:
        every = f"list{ident.replace('Namespaced', '', 1)}ForAllNamespaces"
        paths[f"{prefix}/{rt.plural}"] = {
            "get": _operation(rt, "list", every, listed, _LIST_PARAMS),
            "parameters": [],
        }
    patch_types = SUPPORTED_PATCH_TYPES if rt.crd is None else CUSTOM_RESOURCE_PATCH_TYPES
    patch_body = (PATCH, patch_types)
    for sub in ("", *sorted(rt.subresources)):
        path, suffix = (f"{base}/{{name}}/{sub}", _camel(sub)) if sub else (f"{base}/{{name}}", "")
        entry: Obj = {
            "get": _operation(rt, "get", f"read{ident}{suffix}", item),
            "put": _operation(rt, "put", f"replace{ident}{suffix}", item, _WRITE_PARAMS, write),
            "patch": _operation(
                rt, "patch", f"patch{ident}{suffix}", item, _WRITE_PARAMS, patch_body
            ),
            "parameters": name_param,
        }
        if not sub:
            entry["delete"] = _operation(
                rt,
                "delete",
                f"delete{ident}",
                STATUS,
                _DELETE_PARAMS,
                (DELETE_OPTIONS, ["application/json"]),
            )
        paths[path] = entry
    return paths


# --- documents --------------------------------------------------------------------------------


def group_versions(registry: ResourceRegistry) -> list[tuple[str, str]]:
    """Every served (group, version), core first."""
    return sorted({(rt.group, rt.version) for rt in registry.all()})


def document_key(group: str, version: str) -> str:
    """The key of a group-version in the index (``api/v1``, ``apis/<group>/<version>``)."""
    return f"apis/{group}/{version}" if group else f"api/{version}"


def document(registry: ResourceRegistry, group: str, version: str) -> Obj | None:
    """The OpenAPI v3 document of ``group``/``version``; None when nothing is served there."""
    types = sorted(
        (rt for rt in registry.all() if (rt.group, rt.version) == (group, version)),
        key=lambda rt: rt.plural,
    )
    if not types:
        return None
    paths: dict[str, Obj] = {}
    schemas: dict[str, Obj] = {}
    for rt in types:
        paths.update(_paths(rt))
        schemas.update(_kind_schemas(rt))
    for name in (STATUS, DELETE_OPTIONS, PATCH):
        schemas[name] = _builtin_schema(name)
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": f"v{SCHEMA_KUBERNETES_VERSION}"},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": _with_references(schemas)},
    }


def _encode(doc: Obj) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


class OpenAPIDocuments:
    """The encoded documents and their index, rebuilt when the registry's types change
    (thread-safe). A document's URL in the index carries the hash of its bytes, so a client
    that caches by URL sees a changed document as new."""

    def __init__(self, registry: ResourceRegistry) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._generation = -1
        self._documents: dict[str, bytes] = {}

    def _current(self) -> dict[str, bytes]:
        with self._lock:
            if self._generation != self._registry.generation:
                generation = self._registry.generation
                self._documents = {}
                for group, version in group_versions(self._registry):
                    doc = document(self._registry, group, version)
                    if doc is not None:
                        self._documents[document_key(group, version)] = _encode(doc)
                self._generation = generation
            return self._documents

    def index(self) -> Obj:
        """``{"paths": {key: {"serverRelativeURL": ...}}}``, as ``GET /openapi/v3`` answers."""
        paths = {
            key: {
                "serverRelativeURL": f"{OPENAPI_V3_PREFIX}/{key}?hash="
                + hashlib.sha512(data).hexdigest().upper()
            }
            for key, data in self._current().items()
        }
        return {"paths": paths}

    def get(self, key: str) -> bytes | None:
        """The encoded document of index key ``key`` (``api/v1``), if served."""
        return self._current().get(key)
