"""Normalise the version strings NVIDIA reports into strict semantic versions.

Kubernetes accepts a ``version`` device attribute only when it is strict semver 2.0.0
(``MAJOR.MINOR.PATCH`` without leading zeros, optional pre-release and build suffixes). NVIDIA
reports versions such as ``"9.0"`` (compute capability), ``"12.8"`` (CUDA) and
``"580.159.04"`` (driver): these are padded to three components and leading zeros are dropped.
"""

from __future__ import annotations

import re
from typing import Final

from sharegpu.kube.slicerules import MAX_VERSION_LENGTH

#: Numeric core plus optional ``-prerelease`` and ``+build`` parts, before normalisation.
_LOOSE: Final = re.compile(
    r"^v?(?P<core>\d+(?:\.\d+){0,2})"
    r"(?:-(?P<pre>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


class VersionError(ValueError):
    """A version string that cannot be turned into strict semver; the message names it."""


def _strip_zeros(identifier: str) -> str:
    """Drop leading zeros of a numeric pre-release identifier (semver forbids them)."""
    return str(int(identifier)) if identifier.isdigit() else identifier


def to_semver(raw: str) -> str:
    """Return ``raw`` as strict semver, e.g. ``"9.0"`` -> ``"9.0.0"``.

    ``"580.159.04"`` becomes ``"580.159.4"``.

    Raises :class:`VersionError` for anything that is not one to three dot-separated numbers
    (optionally followed by semver pre-release/build parts), or that is longer than 64 characters
    after normalisation.
    """
    text = raw.strip()
    match = _LOOSE.match(text)
    if match is None:
        raise VersionError(
            f"version {raw!r} is not a version number (expected 1 to 3 dot-separated numbers "
            "such as '12.8' or '580.159.04')"
        )
    parts = [str(int(p)) for p in match.group("core").split(".")]
    parts += ["0"] * (3 - len(parts))
    result = ".".join(parts)
    if match.group("pre"):
        result += "-" + ".".join(_strip_zeros(p) for p in match.group("pre").split("."))
    if match.group("build"):
        result += "+" + match.group("build")
    if len(result) > MAX_VERSION_LENGTH:
        raise VersionError(f"version {raw!r} is longer than {MAX_VERSION_LENGTH} characters")
    return result
