"""The ``Semver`` CEL type of Kubernetes (``k8s.io/apiserver/pkg/cel/library/semverlib.go``).

Strict Semantic Versioning 2.0.0; ``semver(s, true)`` normalises first (drops a leading
``v``, adds missing minor and patch parts, strips leading zeros), as Kubernetes does.
Comparison follows semver precedence; build metadata is ignored.
"""

from __future__ import annotations

import re

from .errors import CelEvalError

_NUM = r"0|[1-9]\d*"
_PRE_ID = r"(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
_SEMVER = re.compile(
    rf"^(?P<major>{_NUM})\.(?P<minor>{_NUM})\.(?P<patch>{_NUM})"
    rf"(?:-(?P<pre>{_PRE_ID}(?:\.{_PRE_ID})*))?"
    r"(?:\+(?P<build>[0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


class Semver:
    """An immutable semantic version with the CEL methods of the semver library."""

    __slots__ = ("build", "major", "minor", "patch", "pre", "text")

    def __init__(self, text: str, normalize: bool = False) -> None:
        source = _normalize(text) if normalize else text
        match = _SEMVER.match(source)
        if match is None:
            raise CelEvalError(f"could not parse {text!r} as semver")
        self.text = source
        self.major = int(match["major"])
        self.minor = int(match["minor"])
        self.patch = int(match["patch"])
        self.pre: tuple[str, ...] = tuple(match["pre"].split(".")) if match["pre"] else ()
        self.build = match["build"] or ""

    @staticmethod
    def is_valid(text: str, normalize: bool = False) -> bool:
        """Whether ``text`` parses (after normalisation when asked)."""
        return _SEMVER.match(_normalize(text) if normalize else text) is not None

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


def _normalize(text: str) -> str:
    """Kubernetes' normalisation: ``v1.2`` -> ``1.2.0``, ``01.002.3`` -> ``1.2.3``."""
    text = text.removeprefix("v")
    core, sep, rest = _split_core(text)
    parts = core.split(".")
    if len(parts) > 3 or any(not p.isdigit() for p in parts):
        return text
    parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(parts) + sep + rest


def _split_core(text: str) -> tuple[str, str, str]:
    for i, ch in enumerate(text):
        if ch in "-+":
            return text[:i], ch, text[i + 1 :]
    return text, "", ""
