"""Device attributes as constraints compare them."""

from __future__ import annotations

from typing import Any

from .pools import Candidate


def attribute(cand: Candidate, qualified: str) -> tuple[str, Any] | None:
    """``(type, value)`` of a fully qualified attribute, resolved as the scheduler does."""
    attributes = cand.device.get("attributes") or {}
    raw = attributes.get(qualified)
    if raw is None:
        domain, _, ident = qualified.partition("/")
        if domain != cand.id.driver:
            return None
        raw = attributes.get(ident)
    if not raw:
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in raw:
            return kind, raw[kind]
    return None


def show(value: tuple[str, Any]) -> str:
    """An attribute value as text (``true``/``false`` for booleans)."""
    return str(value[1]).lower() if value[0] == "bool" else str(value[1])
