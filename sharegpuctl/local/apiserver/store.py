"""Thread-safe object store with Kubernetes API semantics and watch fan-out.

Invariants:
- One global, strictly increasing resourceVersion; every write (create, update, delete, and
  setting deletionTimestamp) takes the next value and emits exactly one watch event.
- Stored objects are never mutated in place (copy on write), so references handed to the HTTP
  layer for serialisation stay consistent without holding the lock; the public read methods
  return deep copies.
- Per resource, the last ``history_size`` events are kept; a watch from a resourceVersion older
  than the oldest kept event gets 410 Gone (reason Expired).
"""

from __future__ import annotations

import json
import queue
import random
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from api.jsontypes import Obj
from sharegpu.kube.slicerules import is_dns_label, is_dns_subdomain
from sharegpuctl.local.apiserver import selectors
from sharegpuctl.local.apiserver.bounds import MAX_OBJECT_BYTES, check_object_size
from sharegpuctl.local.apiserver.builtinschema import definition
from sharegpuctl.local.apiserver.crds import crd_problems, default_crd_status, resource_type
from sharegpuctl.local.apiserver.errors import ApiError
from sharegpuctl.local.apiserver.patch import apply_patch
from sharegpuctl.local.apiserver.resources import ResourceRegistry, ResourceType, default_resources

Key = tuple[str, str]  # (namespace or "", name)
Matcher = Callable[[Mapping[str, Any]], bool]
ObjList = list[Obj]

#: The resource whose objects define the custom resources served.
_CRD_PLURAL = "customresourcedefinitions"
#: ``field.ErrorType`` of each ``ErrorBody`` prefix, for the causes of a 422 Invalid.
_CAUSE_REASONS = (
    ("Required value", "FieldValueRequired"),
    ("Unsupported value", "FieldValueNotSupported"),
    ("Too long", "FieldValueTooLong"),
    ("Too many", "FieldValueTooMany"),
    ("Forbidden", "FieldValueForbidden"),
    ("Duplicate value", "FieldValueDuplicate"),
    ("Not found", "FieldValueNotFound"),
)

#: Namespaces that exist in every cluster.
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def deep_copy(obj: Obj) -> Obj:
    """A deep copy of a JSON object (faster than ``copy.deepcopy`` for JSON data)."""
    result: Obj = json.loads(json.dumps(obj))
    return result


def now_rfc3339() -> str:
    """The current time as Kubernetes writes ``metav1.Time``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Event:
    """A watch event; ``old`` is the previous state for MODIFIED events."""

    type: str
    object: Obj
    rv: int
    old: Obj | None = None


class _Closed:
    """Sentinel put into a watcher's queue to end its stream."""


CLOSED = _Closed()


@dataclass(eq=False)
class Watcher:
    """A registered watch: events matching its filter are queued until the stream reads them.

    ``queue`` holds :class:`Event`, a Status dict (an ERROR event), or :data:`CLOSED`.
    """

    resource: str
    namespace: str | None
    matches: Matcher
    queue: queue.SimpleQueue[Event | Obj | _Closed] = field(default_factory=queue.SimpleQueue)

    def offer(self, event: Event) -> None:
        """Queue ``event`` as this watcher sees it (selector transitions become ADDED/DELETED)."""
        obj_ns = event.object.get("metadata", {}).get("namespace", "")
        if self.namespace is not None and obj_ns != self.namespace:
            return
        now = self.matches(event.object)
        if event.type == "MODIFIED" and event.old is not None:
            before = self.matches(event.old)
            if now and not before:
                self.queue.put(Event("ADDED", event.object, event.rv))
            elif before and not now:
                self.queue.put(Event("DELETED", event.object, event.rv))
            elif now:
                self.queue.put(event)
        elif now:
            self.queue.put(event)

    def close(self) -> None:
        """End the stream."""
        self.queue.put(CLOSED)


def _key(rt: ResourceType, obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace", "") if rt.namespaced else "", meta.get("name", ""))


def _without_volatile(obj: Obj) -> Obj:
    """``obj`` without the fields every write changes (for no-op detection)."""
    meta = dict(obj.get("metadata") or {})
    meta.pop("resourceVersion", None)
    meta.pop("managedFields", None)
    return {**obj, "metadata": meta}


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class ObjectStore:
    """All objects of the fake cluster, by resource type; see the module docstring."""

    def __init__(
        self,
        registry: ResourceRegistry | None = None,
        *,
        history_size: int = 200_000,
        max_object_bytes: int = MAX_OBJECT_BYTES,
    ) -> None:
        self.registry = registry or ResourceRegistry(default_resources())
        #: Largest object stored, JSON-encoded (413 above it).
        self.max_object_bytes = max_object_bytes
        self._history_size = history_size
        self._lock = threading.RLock()
        self._rv = 0
        self._objects: dict[str, dict[Key, Obj]] = {rt.plural: {} for rt in self.registry.all()}
        self._history: dict[str, deque[Event]] = {
            rt.plural: deque(maxlen=history_size) for rt in self.registry.all()
        }
        self._compacted: dict[str, int] = {rt.plural: 0 for rt in self.registry.all()}
        self._watchers: dict[str, list[Watcher]] = {rt.plural: [] for rt in self.registry.all()}
        # owner uid -> dependents (resource, key)
        self._dependents: dict[str, set[tuple[str, Key]]] = {}
        self._uids: dict[str, tuple[str, Key]] = {}
        for ns in DEFAULT_NAMESPACES:
            self.put("namespaces", {"metadata": {"name": ns}, "status": {"phase": "Active"}})
        if _CRD_PLURAL in self._objects:
            for rt in self.registry.all():
                if rt.crd is not None:
                    crd = deep_copy(rt.crd)
                    default_crd_status(crd)
                    self.put(_CRD_PLURAL, crd)

    # ----------------------------------------------------------------- reads

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out."""
        with self._lock:
            return self._rv

    def get(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        """A copy of the object, or None."""
        obj = self.get_ref(resource, name, namespace)
        return deep_copy(obj) if obj is not None else None

    def get_ref(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        """The stored object itself (never mutate it), or None."""
        rt = self.registry.get(resource)
        with self._lock:
            return self._objects[rt.plural].get((namespace or "" if rt.namespaced else "", name))

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        matches: Matcher | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjList:
        """Copies of the objects (of ``namespace`` if given) that ``matches`` and the selectors
        (API string syntax), ordered by namespace and name."""
        if label_selector or field_selector:
            rt = self.registry.get(resource)
            selected = selectors.make_matcher(
                selectors.parse_label_selector(label_selector),
                selectors.parse_field_selector(field_selector, rt.selectable_fields),
            )
            if matches is not None:
                extra = matches

                def both(obj: Mapping[str, Any]) -> bool:
                    return selected(obj) and extra(obj)

                matches = both
            else:
                matches = selected
        items, _ = self.list_refs(resource, namespace, matches)
        return [deep_copy(o) for o in items]

    def list_refs(
        self, resource: str, namespace: str | None = None, matches: Matcher | None = None
    ) -> tuple[ObjList, int]:
        """Stored objects (never mutate them) and the resourceVersion of this snapshot."""
        rt = self.registry.get(resource)
        with self._lock:
            objects = self._objects[rt.plural]
            items = [
                obj
                for key, obj in sorted(objects.items())
                if (namespace is None or key[0] == namespace) and (matches is None or matches(obj))
            ]
            return items, self._rv

    def count(self, resource: str) -> int:
        """How many objects of ``resource`` exist."""
        rt = self.registry.get(resource)
        with self._lock:
            return len(self._objects[rt.plural])

    # ----------------------------------------------------------------- raw writes

    def put(self, resource: str, obj: Obj) -> Obj:
        """Store ``obj`` as given (create or replace), bypassing validation and conflict checks.

        Fills in missing uid/creationTimestamp/generation, takes a new resourceVersion and emits
        ADDED or MODIFIED. Returns a copy of the stored object.
        """
        rt = self.registry.get(resource)
        new = deep_copy(obj)
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        meta = new.setdefault("metadata", {})
        if not meta.get("name"):
            raise ApiError(422, "metadata.name: Required value")
        if rt.namespaced:
            meta.setdefault("namespace", "default")
        else:
            meta.pop("namespace", None)
        with self._lock:
            old = self._objects[rt.plural].get(_key(rt, new))
            if old is not None:
                for f in ("uid", "creationTimestamp"):
                    meta.setdefault(f, old["metadata"].get(f))
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", now_rfc3339())
            meta.setdefault("generation", 1)
            return deep_copy(self._commit(rt, new, old))

    def delete_now(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        """Remove the object at once (ignoring finalizers); returns a copy, or None if absent."""
        rt = self.registry.get(resource)
        with self._lock:
            old = self._objects[rt.plural].get((namespace or "" if rt.namespaced else "", name))
            if old is None:
                return None
            return deep_copy(self._remove(rt, old))

    def compact(self) -> None:
        """Forget all watch history, so any watch from an old resourceVersion gets 410."""
        with self._lock:
            for plural, history in self._history.items():
                history.clear()
                self._compacted[plural] = self._rv

    # ----------------------------------------------------------------- API verbs

    def create_ref(
        self,
        resource: str,
        obj: Obj,
        *,
        dry_run: bool = False,
        strict: bool = False,
        keep_uid: bool = False,
    ) -> Obj:
        """Create as the API server does: generateName, uid, resourceVersion, timestamps,
        generation 1, status dropped unless the type keeps it, undeclared fields pruned (refused
        with ``strict``), validation (422), 409 if the name exists. ``keep_uid``: the object is
        the one a dry run returned (and admission judged): its uid is kept. Returns the stored
        object itself (never mutate it; see :meth:`create`)."""
        rt = self.registry.get(resource)
        new = deep_copy(obj)
        new.setdefault("apiVersion", rt.api_version)
        new.setdefault("kind", rt.kind)
        self._check_type(rt, new)
        self._check_decodes(rt, new)
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "metadata must be an object")
        if rt.namespaced:
            meta["namespace"] = meta.get("namespace") or "default"
        elif "namespace" in meta:
            meta.pop("namespace")
        given_uid = meta.get("uid") if keep_uid else None
        for f in ("uid", "resourceVersion", "deletionTimestamp", "selfLink"):
            meta.pop(f, None)
        meta["generation"] = 1
        meta["creationTimestamp"] = now_rfc3339()
        if rt.has_status and not rt.status_on_create:
            new.pop("status", None)
        if rt.default_status is not None and "status" not in new:
            new["status"] = dict(rt.default_status)
        with self._lock:
            self._check_namespace(rt, new)
            if not meta.get("name"):
                prefix = meta.get("generateName")
                if not prefix:
                    raise self._invalid(
                        rt, "", ["metadata.name: Required value: name or generateName is required"]
                    )
                meta["name"] = self._generate_name(rt, prefix, meta.get("namespace", ""))
            meta["uid"] = given_uid if isinstance(given_uid, str) else str(uuid.uuid4())
            self._validate_names(rt, meta)
            self._prune(rt, new, strict)
            if rt.apply_defaults is not None:
                rt.apply_defaults(new)
            self._validate(rt, new)
            if _key(rt, new) in self._objects[rt.plural]:
                raise ApiError(
                    409,
                    f'{rt.qualified} "{meta["name"]}" already exists',
                    reason="AlreadyExists",
                    name=meta["name"],
                    group=rt.group,
                    kind=rt.plural,
                )
            if dry_run:
                return new
            return self._commit(rt, new, None)

    def _check_namespace(self, rt: ResourceType, obj: Obj) -> None:
        """Namespaced objects are created only in an existing namespace that is not being
        deleted (the real server's NamespaceLifecycle admission: 404, or 403), checked before
        names are generated and objects validated, as admission runs before both."""
        if not rt.namespaced or "namespaces" not in self._objects:
            return
        name = obj["metadata"]["namespace"]
        who = obj["metadata"].get("name") or obj["metadata"].get("generateName", "")
        namespace = self._objects["namespaces"].get(("", name))
        if namespace is None:
            raise ApiError(404, f'namespaces "{name}" not found', name=name, kind="namespaces")
        terminating = (namespace.get("status") or {}).get("phase") == "Terminating"
        if terminating or namespace["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                f'{rt.qualified} "{who}" is forbidden: unable to create new '
                f"content in namespace {name} because it is being terminated",
                name=who,
                group=rt.group,
                kind=rt.plural,
            )

    def update_ref(
        self,
        resource: str,
        obj: Obj,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        strict: bool = False,
    ) -> Obj:
        """Replace (PUT). 409 Conflict if ``metadata.resourceVersion`` is set and stale. On the
        main resource, status changes are ignored for types with a status subresource; on
        ``status`` only the status changes. A no-op update stores nothing and emits nothing."""
        rt = self.registry.get(resource)
        self._check_type(rt, obj)
        self._check_subresource(rt, subresource)
        meta = obj.get("metadata") or {}
        with self._lock:
            old = self._objects[rt.plural].get(_key(rt, obj))
            if old is None:
                raise self._not_found(rt, meta.get("name", ""))
            if not rt.allow_unconditional_update and not meta.get("resourceVersion"):
                raise self._invalid(
                    rt,
                    meta.get("name", ""),
                    [
                        "metadata.resourceVersion: Invalid value: 0x0: "
                        "must be specified for an update"
                    ],
                )
            return self._update(rt, old, obj, subresource, dry_run=dry_run, strict=strict)

    def patch_ref(
        self,
        resource: str,
        name: str,
        namespace: str | None,
        apply: Callable[[Obj], Obj],
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        strict: bool = False,
    ) -> Obj:
        """Apply ``apply(old) -> new`` atomically, then update like :meth:`update`."""
        rt = self.registry.get(resource)
        self._check_subresource(rt, subresource)
        with self._lock:
            old = self._objects[rt.plural].get((namespace or "" if rt.namespaced else "", name))
            if old is None:
                raise self._not_found(rt, name)
            new = apply(old)
            new_meta = new.get("metadata")
            if not isinstance(new_meta, dict):
                raise ApiError(422, "metadata: must be an object")
            if new_meta.get("name") != name:
                raise self._invalid(rt, name, ["metadata.name: field is immutable"])
            return self._update(
                rt, old, new, subresource, dry_run=dry_run, strict=strict, patched=True
            )

    def delete_ref(
        self,
        resource: str,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        dry_run: bool = False,
        orphan: bool = False,
    ) -> Obj:
        """Delete with optional preconditions (409 on mismatch). Objects with finalizers only get
        ``deletionTimestamp``. Dependents (ownerReferences) are garbage-collected, or with
        ``orphan`` (propagationPolicy Orphan) kept with the reference to this owner removed."""
        rt = self.registry.get(resource)
        with self._lock:
            old = self._objects[rt.plural].get((namespace or "" if rt.namespaced else "", name))
            if old is None:
                raise self._not_found(rt, name)
            meta = old["metadata"]
            if uid is not None and uid != meta.get("uid"):
                raise self._conflict(
                    rt,
                    name,
                    f"Precondition failed: UID in precondition: {uid}, "
                    f"UID in object meta: {meta.get('uid')}",
                )
            if resource_version is not None and resource_version != meta.get("resourceVersion"):
                raise self._conflict(
                    rt,
                    name,
                    f"Precondition failed: ResourceVersion in precondition: {resource_version}, "
                    f"ResourceVersion in object meta: {meta.get('resourceVersion')}",
                )
            if dry_run:
                return old
            if orphan:
                self._orphan_dependents(meta.get("uid", ""))
            if meta.get("finalizers"):
                if meta.get("deletionTimestamp"):
                    return old
                new = deep_copy(old)
                new["metadata"]["deletionTimestamp"] = now_rfc3339()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                return self._commit(rt, new, old)
            return self._remove(rt, old)

    def delete_collection(
        self,
        resource: str,
        namespace: str | None,
        matches: Matcher | None,
        *,
        dry_run: bool = False,
    ) -> ObjList:
        """Delete every matching object; returns the deleted (or deletion-marked) objects as
        stored (never mutate them)."""
        rt = self.registry.get(resource)
        with self._lock:
            items, _ = self.list_refs(resource, namespace, matches)
            return [
                self.delete_ref(
                    rt.plural,
                    o["metadata"]["name"],
                    o["metadata"].get("namespace"),
                    dry_run=dry_run,
                )
                for o in items
            ]

    # ----------------------------------------------------------------- API verbs, copying

    def create(self, resource: str, obj: Obj, *, dry_run: bool = False) -> Obj:
        """:meth:`create_ref`, returning a copy."""
        return deep_copy(self.create_ref(resource, obj, dry_run=dry_run))

    def update(
        self, resource: str, obj: Obj, *, subresource: str | None = None, dry_run: bool = False
    ) -> Obj:
        """:meth:`update_ref`, returning a copy."""
        return deep_copy(self.update_ref(resource, obj, subresource=subresource, dry_run=dry_run))

    def update_status(self, resource: str, obj: Obj) -> Obj:
        """Replace only the status of ``obj`` (the ``/status`` subresource); returns a copy."""
        return self.update(resource, obj, subresource="status")

    def patch(
        self,
        resource: str,
        name: str,
        namespace: str | None,
        patch: Any,
        *,
        content_type: str = "application/merge-patch+json",
        subresource: str | None = None,
    ) -> Obj:
        """Patch like the API does (merge patch by default, JSON patch, or strategic merge
        patch of a built-in kind); returns a copy."""
        schema = definition(self.registry.get(resource))

        def apply(old: Obj) -> Obj:
            return apply_patch(content_type, old, patch, schema)

        return deep_copy(self.patch_ref(resource, name, namespace, apply, subresource=subresource))

    def delete(
        self,
        resource: str,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        orphan: bool = False,
    ) -> Obj:
        """:meth:`delete_ref`, returning a copy of the deleted (or deletion-marked) object."""
        return deep_copy(
            self.delete_ref(
                resource,
                name,
                namespace,
                uid=uid,
                resource_version=resource_version,
                orphan=orphan,
            )
        )

    # ----------------------------------------------------------------- watch

    def watch(
        self,
        resource: str,
        namespace: str | None,
        matches: Matcher,
        resource_version: str | None,
    ) -> Watcher:
        """Register a watch. Without a resourceVersion (or ``"0"``) the current objects come
        first as ADDED; otherwise the kept events after it are replayed, or a 410 ERROR is
        queued when they are no longer kept."""
        rt = self.registry.get(resource)
        watcher = Watcher(rt.plural, namespace, matches)
        with self._lock:
            if not resource_version or resource_version == "0":
                items, _ = self.list_refs(rt.plural, namespace, matches)
                for obj in items:
                    watcher.queue.put(Event("ADDED", obj, int(obj["metadata"]["resourceVersion"])))
            else:
                try:
                    since = int(resource_version)
                except ValueError:
                    raise ApiError(
                        400, f"invalid resourceVersion {resource_version!r}: must be an integer"
                    ) from None
                if since < self._compacted[rt.plural]:
                    watcher.queue.put(
                        ApiError(
                            410,
                            f"too old resource version: {since} ({self._compacted[rt.plural] + 1})",
                            reason="Expired",
                        ).status()
                    )
                    watcher.close()
                    return watcher
                for event in self._history[rt.plural]:
                    if event.rv > since:
                        watcher.offer(event)
            self._watchers[rt.plural].append(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        """Stop delivering events to ``watcher``."""
        with self._lock:
            watchers = self._watchers.get(watcher.resource, [])
            if watcher in watchers:
                watchers.remove(watcher)

    def close_watches(self) -> int:
        """End every open watch stream; returns how many were open."""
        with self._lock:
            count = 0
            for watchers in self._watchers.values():
                for w in watchers:
                    w.close()
                count += len(watchers)
                watchers.clear()
            return count

    def open_watches(self) -> int:
        """How many watches are registered."""
        with self._lock:
            return sum(len(w) for w in self._watchers.values())

    # ----------------------------------------------------------------- internals

    def _commit(self, rt: ResourceType, new: Obj, old: Obj | None) -> Obj:
        """Store ``new`` (replacing ``old``) with the next resourceVersion; emit the event."""
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        key = _key(rt, new)
        self._objects[rt.plural][key] = new
        if old is not None:
            self._unindex(rt, old)
        self._index(rt, new)
        self._emit(rt, Event("ADDED" if old is None else "MODIFIED", new, self._rv, old))
        if rt.plural == _CRD_PLURAL and not new["metadata"].get("deletionTimestamp"):
            self._serve_crd(new)
        if (
            old is not None
            and new["metadata"].get("deletionTimestamp")
            and not new["metadata"].get("finalizers")
        ):
            return self._remove(rt, new)
        return new

    def _remove(self, rt: ResourceType, old: Obj) -> Obj:
        self._rv += 1
        gone = {**old, "metadata": {**old["metadata"], "resourceVersion": str(self._rv)}}
        del self._objects[rt.plural][_key(rt, old)]
        self._unindex(rt, old)
        self._emit(rt, Event("DELETED", gone, self._rv))
        self._collect_garbage(old)
        if rt.plural == _CRD_PLURAL:
            self._unserve_crd(old)
        if rt.plural == "namespaces":
            self._delete_namespace_contents(old["metadata"]["name"])
        return gone

    def _serve_crd(self, crd: Obj) -> None:
        """Serve (or re-serve, when changed) the resource ``crd`` defines. A plural that a
        built-in type serves is left to it."""
        if crd_problems(crd):
            return
        rt = resource_type(crd)
        try:
            current: ResourceType | None = self.registry.get(rt.plural)
        except KeyError:
            current = None
        if current is not None and current.crd is None:
            return
        self.registry.replace(rt)
        self._objects.setdefault(rt.plural, {})
        self._history.setdefault(rt.plural, deque(maxlen=self._history_size))
        self._compacted.setdefault(rt.plural, 0)
        self._watchers.setdefault(rt.plural, [])

    def _unserve_crd(self, crd: Obj) -> None:
        """Stop serving what ``crd`` defined: its objects are deleted (watchers see DELETED,
        then their streams end) and its resource answers 404 from now on."""
        names = (crd.get("spec") or {}).get("names") or {}
        try:
            rt = self.registry.get(str(names.get("plural")))
        except KeyError:
            return
        if rt.crd is None or (rt.crd.get("metadata") or {}).get("name") != crd["metadata"].get(
            "name"
        ):
            return
        for obj in list(self._objects[rt.plural].values()):
            self._remove(rt, obj)
        for watcher in self._watchers.pop(rt.plural, []):
            watcher.close()
        self.registry.remove(rt.plural)
        self._objects.pop(rt.plural, None)
        self._history.pop(rt.plural, None)
        self._compacted.pop(rt.plural, None)

    def _collect_garbage(self, owner: Obj) -> None:
        uid = owner["metadata"].get("uid", "")
        for plural, key in sorted(self._dependents.pop(uid, set())):
            dependent = self._objects[plural].get(key)
            if dependent is None:
                continue
            owners = [r.get("uid") for r in dependent["metadata"].get("ownerReferences") or []]
            if any(o in self._uids for o in owners if o != uid):
                continue
            drt = self.registry.get(plural)
            self.delete_ref(drt.plural, key[1], key[0] or None)

    def _orphan_dependents(self, uid: str) -> None:
        for plural, key in sorted(self._dependents.get(uid, set())):
            dependent = self._objects[plural].get(key)
            if dependent is None:
                continue
            new = deep_copy(dependent)
            refs = [r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                new["metadata"].pop("ownerReferences", None)
            self._commit(self.registry.get(plural), new, dependent)

    def _delete_namespace_contents(self, namespace: str) -> None:
        for rt in self.registry.all():
            if not rt.namespaced:
                continue
            for key in [k for k in self._objects[rt.plural] if k[0] == namespace]:
                obj = self._objects[rt.plural].get(key)
                if obj is not None:
                    self._remove(rt, obj)

    def _index(self, rt: ResourceType, obj: Obj) -> None:
        key = _key(rt, obj)
        self._uids[obj["metadata"].get("uid", "")] = (rt.plural, key)
        for ref in obj["metadata"].get("ownerReferences") or []:
            self._dependents.setdefault(ref.get("uid", ""), set()).add((rt.plural, key))

    def _unindex(self, rt: ResourceType, obj: Obj) -> None:
        key = _key(rt, obj)
        self._uids.pop(obj["metadata"].get("uid", ""), None)
        for ref in obj["metadata"].get("ownerReferences") or []:
            deps = self._dependents.get(ref.get("uid", ""))
            if deps is not None:
                deps.discard((rt.plural, key))
                if not deps:
                    del self._dependents[ref.get("uid", "")]

    def _emit(self, rt: ResourceType, event: Event) -> None:
        history = self._history[rt.plural]
        if history.maxlen is not None and len(history) == history.maxlen:
            self._compacted[rt.plural] = history[0].rv
        history.append(event)
        for watcher in self._watchers[rt.plural]:
            watcher.offer(event)

    def _update(
        self,
        rt: ResourceType,
        old: Obj,
        obj: Obj,
        subresource: str | None,
        *,
        dry_run: bool,
        strict: bool = False,
        patched: bool = False,
    ) -> Obj:
        name = old["metadata"]["name"]
        given_uid = (obj.get("metadata") or {}).get("uid")
        if given_uid and given_uid != old["metadata"].get("uid"):
            raise self._conflict(
                rt,
                name,
                f"Precondition failed: UID in precondition: {given_uid}, "
                f"UID in object meta: {old['metadata'].get('uid')}",
            )
        given_rv = (obj.get("metadata") or {}).get("resourceVersion")
        if given_rv and given_rv != old["metadata"].get("resourceVersion"):
            raise self._conflict(
                rt,
                name,
                "the object has been modified; please apply your changes to the latest version "
                "and try again",
            )
        if subresource == "status":
            new = deep_copy(old)
            if "status" in obj:
                new["status"] = deep_copy({"s": obj["status"]})["s"]
            else:
                new.pop("status", None)
        else:
            new = deep_copy(obj)
            new.setdefault("apiVersion", rt.api_version)
            new.setdefault("kind", rt.kind)
            if rt.has_status:
                if "status" in old:
                    new["status"] = old["status"]
                else:
                    new.pop("status", None)
            meta = new.setdefault("metadata", {})
            for f in (
                "uid",
                "creationTimestamp",
                "namespace",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ):
                if f in old["metadata"]:
                    meta[f] = old["metadata"][f]
                else:
                    meta.pop(f, None)
        new["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion")
        self._check_decodes(rt, new)
        self._prune(rt, new, strict, patched=patched)
        if rt.apply_defaults is not None and subresource is None:
            rt.apply_defaults(new)
        if _without_volatile(new) == _without_volatile(old):
            return old
        if _spec_part(new) != _spec_part(old):
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        messages: list[str] = []
        if rt.validate_update is not None:
            messages.extend(rt.validate_update(old, new))
        if messages:
            raise self._invalid(rt, name, messages)
        self._validate(rt, new)
        if dry_run:
            return new
        return self._commit(rt, new, old)

    def _validate(self, rt: ResourceType, obj: Obj) -> None:
        """422 for what ``rt`` does not accept; 413 for an object too large to store (checked
        on every write, so a patch cannot grow one past the limit either)."""
        name = obj["metadata"].get("name", "")
        check_object_size(obj, f'{rt.qualified} "{name}"', self.max_object_bytes)
        if rt.validate is None:
            return
        messages = rt.validate(obj)
        if messages:
            raise self._invalid(rt, obj["metadata"].get("name", ""), messages)

    def _validate_names(self, rt: ResourceType, meta: Mapping[str, Any]) -> None:
        """Object names are DNS subdomains (namespaces: DNS labels); namespaces DNS labels."""
        name = meta.get("name")
        messages = []
        if rt.plural == "namespaces":
            if not is_dns_label(name):
                messages.append(
                    f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 label must "
                    "consist of lower case alphanumeric characters or '-', and must start and "
                    "end with an alphanumeric character"
                )
        elif not is_dns_subdomain(name):
            messages.append(
                f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain must "
                "consist of lower case alphanumeric characters, '-' or '.', and must start and "
                "end with an alphanumeric character"
            )
        namespace = meta.get("namespace")
        if rt.namespaced and not is_dns_label(namespace):
            messages.append(
                f"metadata.namespace: Invalid value: {namespace!r}: must be a lowercase RFC 1123 "
                "label"
            )
        if messages:
            raise self._invalid(rt, str(name or ""), messages)

    def _check_type(self, rt: ResourceType, obj: Mapping[str, Any]) -> None:
        if not isinstance(obj, Mapping):
            raise ApiError(400, "the request body must be a JSON object")
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if api_version not in (None, rt.api_version) or kind not in (None, rt.kind):
            raise ApiError(
                400,
                f"the API version in the data ({api_version}) and kind ({kind}) do not match "
                f"the expected {rt.api_version} {rt.kind}",
            )

    @staticmethod
    def _prune(rt: ResourceType, obj: Obj, strict: bool, *, patched: bool = False) -> None:
        """Drop undeclared fields; with ``strict`` (``fieldValidation=Strict``) refuse them
        instead, worded as the real server: 400 BadRequest from the decoder for a body sent
        whole, 422 Invalid naming ``patch`` and the patched object for a patch."""
        before = json.dumps(obj, separators=(",", ":"), sort_keys=True) if patched else ""
        unknown = rt.prune(obj) if rt.prune is not None else []
        if not strict or not unknown:
            return
        problem = "strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in unknown)
        if patched:
            detail = f"Invalid value: {json.dumps(before)}: {problem}"
            raise ApiError(
                422,
                f' "" is invalid: patch: {detail}',
                reason="Invalid",
                causes=[{"reason": "FieldValueInvalid", "message": detail, "field": "patch"}],
            )
        raise ApiError(
            400, f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {problem}'
        )

    @staticmethod
    def _check_decodes(rt: ResourceType, obj: Obj) -> None:
        """400 BadRequest, worded as the real server's decoder, for what it could not decode."""
        problem = rt.decode_problem(obj) if rt.decode_problem is not None else None
        if problem is not None:
            raise ApiError(
                400,
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {problem}',
            )

    @staticmethod
    def _check_subresource(rt: ResourceType, subresource: str | None) -> None:
        if subresource is not None and subresource not in rt.subresources:
            raise ApiError(404, f"{rt.qualified} has no subresource {subresource!r}")

    def _generate_name(self, rt: ResourceType, prefix: str, namespace: str) -> str:
        for _ in range(100):
            suffix = "".join(random.choices(_GENERATE_ALPHABET, k=5))
            name = f"{prefix[:58]}{suffix}"
            if (namespace if rt.namespaced else "", name) not in self._objects[rt.plural]:
                return name
        raise ApiError(500, f"could not generate a unique name from prefix {prefix!r}")

    @staticmethod
    def _not_found(rt: ResourceType, name: str) -> ApiError:
        return ApiError(
            404, f'{rt.qualified} "{name}" not found', name=name, group=rt.group, kind=rt.plural
        )

    @staticmethod
    def _conflict(rt: ResourceType, name: str, detail: str) -> ApiError:
        return ApiError(
            409,
            f'Operation cannot be fulfilled on {rt.qualified} "{name}": {detail}',
            reason="Conflict",
            name=name,
            group=rt.group,
            kind=rt.plural,
        )

    @staticmethod
    def _invalid(rt: ResourceType, name: str, messages: Iterable[str]) -> ApiError:
        """422 Invalid for ``path: body`` messages, shaped as ``errors.NewInvalid`` shapes it:
        duplicates dropped, one message as is or several in brackets, a cause per message with
        its ``field.ErrorType``."""
        unique = list(dict.fromkeys(messages))
        causes = []
        for m in unique:
            field_path, _, detail = m.partition(": ")
            body = detail or m
            reason = next((r for p, r in _CAUSE_REASONS if body.startswith(p)), None)
            if reason is None:
                typed = " in body must be of type " in body
                reason = "FieldValueTypeInvalid" if typed else "FieldValueInvalid"
            causes.append({"reason": reason, "message": body, "field": field_path})
        group_kind = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
        listed = unique[0] if len(unique) == 1 else f"[{', '.join(unique)}]"
        return ApiError(
            422,
            f'{group_kind} "{name}" is invalid: {listed}',
            reason="Invalid",
            name=name,
            group=rt.group,
            kind=rt.kind,
            causes=causes,
        )
