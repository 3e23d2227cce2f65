"""One slice publisher, several taint sources: each source sets its complete taint map, and
the publisher gets their union (per device, the sources' taints in the order the sources were
made). Health taints and the optional overcommit taint of the usage stage share it.
"""

from __future__ import annotations

import threading
from typing import Any

from kubeletplugin.model import Taints, TaintSink


class TaintMerger:
    """Merges the taint maps of named sources into ``sink``."""

    def __init__(self, sink: TaintSink) -> None:
        self._sink = sink
        self._maps: dict[str, dict[str, list[dict[str, Any]]]] = {}
        self._mu = threading.Lock()

    def source(self, name: str) -> _Source:
        """A :class:`TaintSink` whose map is merged with the other sources'."""
        with self._mu:
            self._maps.setdefault(name, {})
        return _Source(self, name)

    def _set(self, name: str, taints: Taints) -> None:
        with self._mu:
            self._maps[name] = {k: [dict(t) for t in v] for k, v in taints.items()}
            merged: dict[str, list[dict[str, Any]]] = {}
            for source in self._maps.values():
                for device, device_taints in source.items():
                    merged.setdefault(device, []).extend(device_taints)
            # Under the lock, so the sink sees the sources' maps in the order they were set.
            self._sink.set_taints(merged)


class _Source:
    def __init__(self, merger: TaintMerger, name: str) -> None:
        self._merger = merger
        self._name = name

    def set_taints(self, taints: Taints) -> None:
        self._merger._set(self._name, taints)
