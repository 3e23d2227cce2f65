"""List-then-watch of one collection into a local store, with resync after watch errors.

Invariant: after every (re)list, the store equals the server's list, and the handler has been
told each difference (added, changed, gone) since the previous state; so no event is lost when
a watch breaks, expires (410 Gone) or the connection drops. Between lists, watch events keep
the store current. A watch that ends normally is resumed from the last resourceVersion seen
(bookmarks keep it fresh); a 410, or any error, leads to a relist after a short back-off.

The handler is called from the informer's thread as ``handler(key, old, new)``: ``old`` None
for an addition, ``new`` None for a removal. ``transform`` reduces each object before it is
stored (return None to ignore an object: it is then treated as absent).

``unserved_is_empty``: a collection the API server does not serve (404, a kind its version
lacks) counts as an empty list: the informer is synced, logs that once, and keeps retrying at
the back-off's cap in case the server starts serving it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from api.jsontypes import Obj
from sharegpu.kube.clock import SYSTEM_CLOCK, Clock
from sharegpu.kube.rest import KubeApiError, KubeRest

log = logging.getLogger(__name__)

Handler = Callable[[str, Any, Any], None]


def object_key(obj: Obj) -> str:
    """``namespace/name`` (``/name`` for cluster-scoped objects)."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: ``initial * factor**n`` seconds, at most ``cap``."""

    initial: float = 0.5
    factor: float = 2.0
    cap: float = 30.0

    def delay(self, failures: int) -> float:
        """Delay after ``failures`` consecutive failures (``failures >= 1``)."""
        return float(min(self.cap, self.initial * self.factor ** max(0, failures - 1)))


class Informer:
    """Keeps ``store`` (key -> transformed object) in step with one API collection."""

    def __init__(
        self,
        kube: KubeRest,
        path: str,
        handler: Handler,
        *,
        name: str,
        query: Sequence[tuple[str, str]] = (),
        transform: Callable[[Obj], Any] | None = None,
        watch_timeout_s: int = 300,
        backoff: Backoff = Backoff(),
        on_relist: Callable[[], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        unserved_is_empty: bool = False,
    ) -> None:
        self.kube = kube
        self.unserved_is_empty = unserved_is_empty
        self._told_unserved = False
        self.path = path
        self.handler = handler
        self.name = name
        self.query = list(query)
        self.transform = transform or (lambda o: o)
        self.watch_timeout_s = watch_timeout_s
        self.backoff = backoff
        #: Called after every (re)list, once the handler has seen its differences.
        self.on_relist = on_relist
        #: Measures the back-off between relists.
        self._clock = clock
        self.store: dict[str, Any] = {}
        self._versions: dict[str, str] = {}
        self.synced = threading.Event()
        self.relists = 0
        self._response: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Run in a daemon thread."""
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching (closes the open stream) and wait for the thread."""
        self._stop.set()
        resp = self._response
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:  # already closed, or a urllib3 without shutdown()
                try:
                    resp.close()
                except Exception as exc:
                    log.debug("closing %s watch: %s", self.name, exc)
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        """List, then watch, until stopped."""
        rv = ""
        failures = 0
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._relist()
                rv = self._watch(rv)
                failures = 0
                continue
            except KubeApiError as exc:
                if self._stop.is_set():
                    break
                failures += 1
                delay = self.backoff.delay(failures)
                if exc.status == 410:
                    log.info("%s: watch expired (410 Gone); relisting", self.name)
                elif exc.status == 404 and self.unserved_is_empty:
                    delay = self.backoff.cap
                    self._unserved()
                elif exc.status == 404:
                    log.error(
                        "%s: the API server does not serve %s (is its CustomResourceDefinition "
                        "installed?); retrying in %.1fs",
                        self.name,
                        self.path,
                        delay,
                    )
                else:
                    log.warning("%s: %s; relisting in %.1fs", self.name, exc, delay)
            except Exception:
                if self._stop.is_set():
                    break
                failures += 1
                delay = self.backoff.delay(failures)
                log.exception("%s: unexpected error; relisting in %.1fs", self.name, delay)
            rv = ""
            self._clock.wait(self._stop, delay)

    def _relist(self) -> str:
        items, rv = self.kube.list_all(self.path, self.query)
        self.relists += 1
        seen: set[str] = set()
        for obj in items:
            key = object_key(obj)
            seen.add(key)
            self._apply(key, obj)
        for key in [k for k in self.store if k not in seen]:
            self._apply(key, None)
        self.synced.set()
        if self.on_relist is not None:
            self.on_relist()
        return rv

    def _unserved(self) -> None:
        """The collection is not served: it counts as empty (see the module text)."""
        if not self._told_unserved:
            log.info("%s: the API server does not serve %s; counting none", self.name, self.path)
            self._told_unserved = True
        for key in list(self.store):
            self._apply(key, None)
        self.synced.set()
        if self.on_relist is not None:
            self.on_relist()

    def _apply(self, key: str, obj: Obj | None) -> None:
        old = self.store.get(key)
        if obj is None:
            self._versions.pop(key, None)
            if old is not None:
                del self.store[key]
                self.handler(key, old, None)
            return
        version = _rv(obj)
        if key in self._versions and self._versions[key] == version and version:
            return
        new = self.transform(obj)
        self._versions[key] = version
        if new is None:
            if old is not None:
                del self.store[key]
                self.handler(key, old, None)
            return
        self.store[key] = new
        self.handler(key, old, new)

    def _register(self, resp: Any) -> None:
        self._response = resp
        if self._stop.is_set():
            resp.shutdown()

    def _watch(self, rv: str) -> str:
        query = [
            *self.query,
            ("resourceVersion", rv),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.watch_timeout_s)),
        ]
        for event in self.kube.watch(
            self.path, query, self.watch_timeout_s + 30, register=self._register
        ):
            if self._stop.is_set():
                break
            kind = event.get("type")
            obj = event.get("object") or {}
            new_rv = _rv(obj)
            if kind == "BOOKMARK":
                rv = new_rv or rv
                continue
            key = object_key(obj)
            self._apply(key, None if kind == "DELETED" else obj)
            rv = new_rv or rv
        self._response = None
        return rv
