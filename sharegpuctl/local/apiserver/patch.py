"""Patch application: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and, for built-in
kinds, strategic merge patch (:mod:`.strategicpatch`).

Server-side apply (``application/apply-patch+yaml``) is not implemented: it is answered 415
naming it and the media types that are accepted, as is a strategic merge patch of a custom
resource (the real API server refuses that too).
"""

from __future__ import annotations

import copy
from typing import Any

from sharegpuctl.local.apiserver.errors import ApiError
from sharegpuctl.local.apiserver.strategicpatch import strategic_merge

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
SUPPORTED_PATCH_TYPES = (MERGE_PATCH, STRATEGIC_MERGE_PATCH, JSON_PATCH)
#: The patch types of a custom resource.
CUSTOM_RESOURCE_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH)


def unsupported_patch_type(media: str, accepted: tuple[str, ...]) -> ApiError:
    """415 for a patch of media type ``media``, naming the ``accepted`` ones (and, for an apply
    patch, that server-side apply is what is missing)."""
    what = "the body of the request was in an unknown format"
    if media == APPLY_PATCH:
        what = f"server-side apply ({APPLY_PATCH}) is not supported by this server"
    return ApiError(415, f"{what} - accepted media types include: {', '.join(accepted)}")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"json patch: invalid path {path!r}: must start with '/'")
    return [_unescape(t) for t in path[1:].split("/")]


def _walk(doc: Any, tokens: list[str], path: str) -> Any:
    """The value ``tokens`` lead to in ``doc``; a 422 naming ``path`` if any step is missing."""
    current = doc
    for token in tokens:
        if isinstance(current, dict) and token in current:
            current = current[token]
        elif isinstance(current, list) and token.isdigit() and int(token) < len(current):
            current = current[int(token)]
        else:
            raise ApiError(422, f"json patch: path {path!r} does not exist")
    return current


def _resolve_parent(doc: Any, tokens: list[str], path: str) -> tuple[Any, str]:
    return _walk(doc, tokens[:-1], path), tokens[-1]


def _get(doc: Any, path: str) -> Any:
    return _walk(doc, _pointer(path), path)


def _remove(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise ApiError(422, "json patch: cannot remove the whole document")
    parent, last = _resolve_parent(doc, tokens, path)
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise ApiError(422, f"json patch: path {path!r} does not exist")


def _add(doc: Any, path: str, value: Any, *, replace: bool = False) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent, last = _resolve_parent(doc, tokens, path)
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise ApiError(422, f"json patch: path {path!r} does not exist")
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise ApiError(422, f"json patch: index {last!r} out of range in {path!r}")
    else:
        raise ApiError(422, f"json patch: path {path!r} does not exist")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 operations ``add``, ``remove``, ``replace``, ``move``, ``copy``, ``test``."""
    if not isinstance(operations, list):
        raise ApiError(400, "json patch: the body must be a list of operations")
    doc = copy.deepcopy(target)
    for i, op in enumerate(operations):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, f"json patch: operation {i} needs 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise ApiError(400, f"json patch: operation {i} ({kind}) needs 'value'")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op["value"]), replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind in ("move", "copy"):
            if "from" not in op:
                raise ApiError(400, f"json patch: operation {i} ({kind}) needs 'from'")
            value = (
                _remove(doc, op["from"]) if kind == "move" else copy.deepcopy(_get(doc, op["from"]))
            )
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise ApiError(422, f"json patch: test operation {i} failed at {path!r}")
        else:
            raise ApiError(400, f"json patch: unknown operation {kind!r}")
    return doc


def apply_patch(
    content_type: str, target: dict[str, Any], patch: Any, schema: dict[str, Any] | None
) -> dict[str, Any]:
    """Apply ``patch`` of media type ``content_type`` to ``target`` (left unchanged).
    ``schema``: the published definition of a built-in kind (strategic merge patches follow
    it); None for a custom resource, which takes no strategic merge patch."""
    media = content_type.split(";")[0].strip().lower()
    if media == STRATEGIC_MERGE_PATCH and schema is None:
        raise unsupported_patch_type(media, CUSTOM_RESOURCE_PATCH_TYPES)
    if media in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
        if not isinstance(patch, dict):
            raise ApiError(400, "merge patch: the body must be a JSON object")
        if schema is not None and media == STRATEGIC_MERGE_PATCH:
            result = strategic_merge(target, patch, schema)
        else:
            result = merge_patch(target, patch)
    elif media == JSON_PATCH:
        result = json_patch(target, patch)
    else:
        raise unsupported_patch_type(media, SUPPORTED_PATCH_TYPES)
    if not isinstance(result, dict):
        raise ApiError(422, "the patched object is not a JSON object")
    return result
