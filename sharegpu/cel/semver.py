"""The ``Semver`` CEL type of Kubernetes (``k8s.io/apiserver/pkg/cel/library/semverlib.go``).

Strict Semantic Versioning 2.0.0; ``semver(s, true)`` normalises first (drops a leading
``v``, adds missing minor and patch parts, strips leading zeros), as Kubernetes does.
Comparison follows semver precedence; build metadata is ignored.
"""

from __future__ import annotations

import re

from .errors import CelEvalError

_UINT64_MAX = 2**64 - 1
_NUMBER = re.compile(r"0|[1-9][0-9]*")
_ALPHANUMERIC = re.compile(r"[0-9A-Za-z-]+")


def _number(text: str) -> int | None:
    """A version number as blang/semver reads it: ASCII digits, no leading zero, a uint64."""
    if not _NUMBER.fullmatch(text):
        return None
    value = int(text)
    return value if value <= _UINT64_MAX else None


def _parse(text: str) -> tuple[int, int, int, tuple[str, ...], str] | None:
    """blang/semver's ``Parse``: (major, minor, patch, pre-release identifiers, build), or
    None when it refuses ``text``."""
    parts = text.split(".", 2)
    if len(parts) != 3:
        return None
    major, minor = _number(parts[0]), _number(parts[1])
    rest, _, build = parts[2].partition("+")
    patch_text, has_pre, pre_text = rest.partition("-")
    patch = _number(patch_text)
    if major is None or minor is None or patch is None:
        return None
    if "+" in parts[2] and not all(_ALPHANUMERIC.fullmatch(b) for b in build.split(".")):
        return None
    pre = tuple(pre_text.split(".")) if has_pre else ()
    for identifier in pre:
        if identifier.isascii() and identifier.isdigit():
            if _number(identifier) is None:
                return None
        elif not _ALPHANUMERIC.fullmatch(identifier):
            return None
    return major, minor, patch, pre, build


class Semver:
    """An immutable semantic version with the CEL methods of the semver library."""

    __slots__ = ("build", "major", "minor", "patch", "pre", "text")

    def __init__(self, text: str, normalize: bool = False) -> None:
        source = _normalize(text) if normalize else text
        parsed = None if source is None else _parse(source)
        if source is None or parsed is None:
            raise CelEvalError(f"could not parse {text!r} as semver")
        self.text = source
        self.major, self.minor, self.patch, self.pre, self.build = parsed

    @staticmethod
    def is_valid(text: str, normalize: bool = False) -> bool:
        """Whether ``text`` parses (after normalisation when asked)."""
        source = _normalize(text) if normalize else text
        return source is not None and _parse(source) is not None

    def __repr__(self) -> str:
        return f"semver({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare_to(other) == 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))

    def compare_to(self, other: Semver) -> int:
        """-1, 0 or 1 by semver precedence."""
        a = (self.major, self.minor, self.patch)
        b = (other.major, other.minor, other.patch)
        if a != b:
            return -1 if a < b else 1
        return _compare_pre(self.pre, other.pre)


def _compare_pre(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    if a == b:
        return 0
    if not a:
        return 1
    if not b:
        return -1
    for x, y in zip(a, b, strict=False):
        if x == y:
            continue
        xd, yd = x.isdigit(), y.isdigit()
        if xd and yd:
            return -1 if int(x) < int(y) else 1
        if xd != yd:
            return -1 if xd else 1
        return -1 if x < y else 1
    return -1 if len(a) < len(b) else 1


def _normalize(text: str) -> str | None:
    """Kubernetes' normalisation (``normalizeAndParse``): drop a leading ``v``, strip leading
    zeros of each of the first three dot-separated parts, fill a short version up with ``.0``
    (None, an error, when its last part carries a pre-release or build)."""
    parts = text.removeprefix("v").split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            part = part.lstrip("0")
            if not part or part[0] not in "0123456789":
                part = "0" + part
            parts[i] = part
    if len(parts) < 3:
        if "+" in parts[-1] or "-" in parts[-1]:
            return None
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)
