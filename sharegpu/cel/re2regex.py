"""Regular expressions with RE2 semantics, as Kubernetes' CEL (Go's ``regexp``) has them.

Patterns compile with Google's RE2 (the ``google-re2`` package): ``\\p{Lu}``, ``\\z`` and
``(?i)`` work, look-around and back-references are errors, matching is linear-time. Compiled
patterns are cached by text. :func:`find_all` drops an empty match that directly follows the
previous match, as Go's ``FindAllString`` does.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2  # type: ignore[import-untyped]

from .errors import CelEvalError

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False


class RegexError(CelEvalError):
    """A pattern RE2 rejects. ``reason`` is RE2's explanation."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


#: RE2's error codes and the wording Go's ``regexp/syntax`` uses for the same errors.
_GO_WORDING = {
    "invalid escape sequence": "invalid escape sequence",
    "invalid character class": "invalid character class",
    "invalid character class range": "invalid character class range",
    "missing ]": "missing closing ]",
    "missing )": "missing closing )",
    "unexpected )": "unexpected )",
    "trailing \\": "trailing backslash at end of expression",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid repetition size": "invalid repeat count",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid UTF-8": "invalid UTF-8",
    "invalid named capture group": "invalid named capture",
}


def _go_reason(re2_reason: str) -> str:
    """RE2's ``code: fragment`` as Go words it: ``code: `fragment```."""
    code, sep, fragment = re2_reason.partition(": ")
    if code in _GO_WORDING:
        code = _GO_WORDING[code]
        return f"{code}: `{fragment}`" if sep else code
    return re2_reason


def _any_byte_escape(pattern: str) -> bool:
    """Whether ``pattern`` uses ``\\C`` (any byte): RE2 accepts it, Go's regexp does not."""
    i = 0
    while i < len(pattern) - 1:
        if pattern[i] == "\\":
            if pattern[i + 1] == "C":
                return True
            i += 2
        else:
            i += 1
    return False


@lru_cache(maxsize=256)
def _compile(pattern: str) -> Any:
    if _any_byte_escape(pattern):
        reason = "invalid escape sequence: `\\C`"
        raise RegexError(f"error parsing regexp: {reason}", reason)
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        text = detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
        reason = _go_reason(text)
        raise RegexError(f"error parsing regexp: {reason}", reason) from None


def check_pattern(pattern: str) -> str | None:
    """Why ``pattern`` is invalid, or ``None``: for compile-time checks of constant patterns
    (Kubernetes reports those as ``compilation error``s, see :func:`compile_time_message`)."""
    try:
        _compile(pattern)
    except RegexError as exc:
        return exc.reason
    return None


def compile_time_message(function: str, pattern: str) -> str | None:
    """The error Kubernetes reports when compiling a call of ``function`` (``matches``,
    ``find``, ``findAll``) with the constant invalid ``pattern``, or ``None`` when valid.

    ``matches`` is caught by cel-go's regex validator, whose message names no reason
    (``invalid matches argument``); ``find`` and ``findAll`` by the program's regex
    precompilation (``program instantiation failed: error parsing regexp: ...``).
    """
    reason = check_pattern(pattern)
    if reason is None:
        return None
    if function == "matches":
        return "invalid matches argument"
    return f"program instantiation failed: error parsing regexp: {reason}"


def matches(text: str, pattern: str) -> bool:
    """Whether ``pattern`` matches anywhere in ``text``."""
    return _compile(pattern).search(text) is not None


def find(text: str, pattern: str) -> str:
    """The leftmost match, or ``''``."""
    try:
        m = _compile(pattern).search(text)
    except RegexError as exc:
        raise CelEvalError(f"Illegal regex: {exc.message}") from None
    return str(m.group(0)) if m else ""


def find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    """All successive non-overlapping matches (at most ``limit`` when it is >= 0)."""
    try:
        compiled = _compile(pattern)
    except RegexError as exc:
        raise CelEvalError(f"Illegal regex: {exc.message}") from None
    if limit == 0:
        return []
    found: list[str] = []
    previous_end = -1
    for m in compiled.finditer(text):
        if m.start() == m.end() and m.start() == previous_end:
            continue
        found.append(str(m.group(0)))
        previous_end = m.end()
        if 0 < limit <= len(found):
            break
    return found
