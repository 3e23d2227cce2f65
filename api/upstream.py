"""The upstream releases sharegpu targets, read from ``api/upstream.toml`` (packaged beside
this module): Kubernetes (and its staging modules, ``v0.<minor>.<patch>``), the second
Kubernetes release the end-to-end steps run, cel-go, etcd and containerd.

Invariant: every value is ``X.Y.Z`` (digits only, no ``v``); the previous Kubernetes release
is older than the target. A file that breaks this raises :class:`ValueError` naming the key.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

#: The file's name, in the ``api`` package.
PIN_FILE: Final = "upstream.toml"
_KEYS: Final = ("kubernetes", "kubernetes-previous", "cel-go", "etcd", "containerd")
_VERSION: Final = re.compile(r"\d+\.\d+\.\d+")


def _triple(version: str) -> tuple[int, int, int]:
    major, minor, patch = version.split(".")
    return int(major), int(minor), int(patch)


@dataclass(frozen=True)
class Upstream:
    """The pinned releases (``1.37.2``: without the ``v`` Go and the docs put before them)."""

    kubernetes: str
    kubernetes_previous: str
    cel_go: str
    etcd: str
    containerd: str

    @property
    def minor(self) -> tuple[int, int]:
        """``(major, minor)`` of the target Kubernetes release, ``(1, 37)``."""
        major, minor, _ = _triple(self.kubernetes)
        return major, minor

    def kubernetes_releases(self) -> tuple[str, str]:
        """The target and the previous release, ``("1.37.2", "1.36.3")``."""
        return self.kubernetes, self.kubernetes_previous


def staging(kubernetes: str) -> str:
    """The staging modules' version of a Kubernetes release: ``1.37.2`` -> ``v0.37.2``."""
    _, minor, patch = _triple(kubernetes)
    return f"v0.{minor}.{patch}"


def parse(text: str, source: str = PIN_FILE) -> Upstream:
    """The releases of a pin file's ``text``; :class:`ValueError` naming the key at fault."""
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: not TOML: {exc}") from None
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise ValueError(f"{source}: unknown keys {unknown} (allowed: {', '.join(_KEYS)})")
    values: list[str] = []
    for key in _KEYS:
        value = data.get(key)
        if not isinstance(value, str) or not _VERSION.fullmatch(value):
            raise ValueError(f'{source}: {key}: want a version "X.Y.Z", got {value!r}')
        values.append(value)
    pins = Upstream(*values)
    if _triple(pins.kubernetes_previous) >= _triple(pins.kubernetes):
        raise ValueError(
            f"{source}: kubernetes-previous: {pins.kubernetes_previous} is not older than "
            f"kubernetes {pins.kubernetes}"
        )
    return pins


def load() -> Upstream:
    """The packaged pin file's releases."""
    return parse(resources.files("api").joinpath(PIN_FILE).read_text(encoding="utf-8"))


#: The releases of the packaged pin file.
UPSTREAM: Final = load()
