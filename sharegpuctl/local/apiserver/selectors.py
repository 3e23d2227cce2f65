"""Label and field selectors in the string syntax of the Kubernetes API.

Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``,
joined by commas (all must hold). Field selectors: ``path=v``, ``path==v``, ``path!=v`` over
dotted paths such as ``spec.nodeName``; a missing field reads as the empty string.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sharegpuctl.local.apiserver.errors import ApiError

Matcher = Callable[[Mapping[str, Any]], bool]

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9._/-]+)\s+(in|notin)\s*\((.*)\)\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s*(==|!=|=)\s*([A-Za-z0-9._-]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9._/-]+)\s*$")


@dataclass(frozen=True)
class Requirement:
    """One requirement of a selector: ``op`` is one of ``=``, ``!=``, ``in``, ``notin``,
    ``exists``, ``!exists``."""

    key: str
    op: str
    values: frozenset[str]


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(ch)
    terms.append("".join(current))
    return [t for t in (term.strip() for term in terms) if t]


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse a label selector; raises ApiError 400 naming the bad term."""
    if not text:
        return []
    requirements: list[Requirement] = []
    for term in _split_terms(text):
        m = _SET_RE.match(term)
        if m and not m.group(1):
            values = frozenset(v.strip() for v in m.group(4).split(",") if v.strip())
            requirements.append(Requirement(m.group(2), m.group(3), values))
            continue
        m = _EQ_RE.match(term)
        if m:
            op = "!=" if m.group(2) == "!=" else "="
            requirements.append(Requirement(m.group(1), op, frozenset({m.group(3)})))
            continue
        m = _EXISTS_RE.match(term)
        if m:
            op = "!exists" if m.group(1) else "exists"
            requirements.append(Requirement(m.group(2), op, frozenset()))
            continue
        raise ApiError(400, f"unable to parse requirement: invalid label selector term {term!r}")
    return requirements


def labels_match(requirements: list[Requirement], labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy every requirement."""
    for req in requirements:
        present = req.key in labels
        value = labels.get(req.key, "")
        if req.op == "=":
            ok = present and value in req.values
        elif req.op == "!=":
            ok = not present or value not in req.values
        elif req.op == "in":
            ok = present and value in req.values
        elif req.op == "notin":
            ok = not present or value not in req.values
        elif req.op == "exists":
            ok = present
        else:
            ok = not present
        if not ok:
            return False
    return True


def parse_field_selector(text: str | None, supported: frozenset[str]) -> list[Requirement]:
    """Parse a field selector; fields outside ``supported`` are rejected with 400 like the real
    API server does (``field label not supported``)."""
    if not text:
        return []
    requirements: list[Requirement] = []
    for term in _split_terms(text):
        m = re.match(r"^\s*([A-Za-z0-9._-]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
        if not m:
            raise ApiError(400, f"invalid field selector term {term!r}")
        field = m.group(1)
        if field not in supported:
            raise ApiError(
                400,
                f'field label not supported: "{field}" (supported: {", ".join(sorted(supported))})',
            )
        op = "!=" if m.group(2) == "!=" else "="
        requirements.append(Requirement(field, op, frozenset({m.group(3)})))
    return requirements


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The value at dotted ``path`` as a selector compares it (missing -> ``""``)."""
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return ""
        current = current[part]
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def fields_match(requirements: list[Requirement], obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` satisfies every field requirement."""
    for req in requirements:
        value = field_value(obj, req.key)
        if (value in req.values) != (req.op == "="):
            return False
    return True


def make_matcher(
    label_requirements: list[Requirement], field_requirements: list[Requirement]
) -> Matcher:
    """A predicate on objects combining both selectors."""

    def matches(obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        return labels_match(label_requirements, labels) and fields_match(field_requirements, obj)

    return matches
