"""The tracker's view of the GPU objects stored in the API server.

A stored object is kept as a :class:`StoredGpu`: its metadata (less ``managedFields``, which the
server keeps when a write leaves it out) and a digest of its ``spec`` and of its ``status``. Two
JSON values have equal digests exactly when they are equal as JSON (:func:`json_digest` hashes
a canonical encoding), so comparing digests says whether a write is needed without keeping a
second copy of every object's status.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api.jsontypes import Obj
from api.names import GPU_KIND, GROUP_VERSION


def json_digest(value: Any) -> bytes:
    """A 16-byte digest of the canonical JSON of ``value`` (keys sorted, no spaces)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class StoredGpu:
    """A GPU object as stored: ``metadata`` (without ``managedFields``) and digests of its
    ``spec`` and ``status`` (:func:`json_digest`; of None when absent)."""

    metadata: Obj
    spec_digest: bytes
    status_digest: bytes

    @property
    def resource_version(self) -> str:
        """``metadata.resourceVersion`` ("" when absent)."""
        return str(self.metadata.get("resourceVersion", ""))

    def has_labels(self, labels: Mapping[str, str]) -> bool:
        """Whether the object carries every one of ``labels`` (other labels are left alone)."""
        have = self.metadata.get("labels") or {}
        return all(have.get(k) == v for k, v in labels.items())

    def body(self, **parts: Obj) -> Obj:
        """A request body: this object's identity and metadata plus ``parts`` (e.g. ``status``)."""
        return {"apiVersion": GROUP_VERSION, "kind": GPU_KIND, "metadata": self.metadata, **parts}


def stored_gpu(obj: Mapping[str, Any]) -> StoredGpu:
    """Reduce a GPU object as the API server serves it."""
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return StoredGpu(
        metadata=metadata,
        spec_digest=json_digest(obj.get("spec")),
        status_digest=json_digest(obj.get("status")),
    )


def older(new: StoredGpu, current: StoredGpu | None) -> bool:
    """Whether ``new`` is an older version than ``current`` (integer resourceVersions only)."""
    if current is None:
        return False
    a, b = new.resource_version, current.resource_version
    return a.isdigit() and b.isdigit() and int(a) < int(b)
