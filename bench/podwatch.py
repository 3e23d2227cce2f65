"""A watch on the pods of one namespace of an e2e control plane, noting when each pod was first
seen (:attr:`PodWatch.added`), first seen bound (``spec.nodeName`` set) and first seen Running
(``status.phase``), on this process' monotonic clock, so a bench subtracts them from the moment
it created the pod.

The watch runs on a thread of its own inside the run's sealed network namespace (as every client
of the run does) and reconnects from the last resourceVersion it saw when the server ends the
stream. Invariant: a time, once noted, never changes; a deleted pod's times are dropped from
``added``, ``bound`` and ``running`` (a name may come back), and kept in :attr:`PodWatch.started`,
by pod UID, for pods that a bench does not delete itself (the MPS daemon pods the plugin
deletes when it unprepares their claim).
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterable

from tests.e2e.controlplane import ControlPlane
from tests.e2e.netns import enter


class PodWatch:
    """Times of the pods of ``namespace`` (those matching ``label_selector`` where one is given;
    start with :meth:`start`, end with :meth:`stop`)."""

    def __init__(self, plane: ControlPlane, namespace: str, label_selector: str = "") -> None:
        self.plane = plane
        self.namespace = namespace
        self.label_selector = label_selector
        self.added: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        #: Pod UID -> (created, first seen Running) of every pod created while the watch ran
        #: (first seen in an ADDED event) and seen Running; kept after the pod is deleted.
        self.started: dict[str, tuple[float, float]] = {}
        #: UIDs of the pods first seen in an ADDED event.
        self._created: set[str] = set()
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._connection: http.client.HTTPSConnection | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="podwatch", daemon=True)
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError(f"the pod watch did not start: {self.error}")

    def stop(self) -> None:
        self._stopping.set()
        if self._connection is not None and self._connection.sock is not None:
            self._connection.sock.close()
        if self._thread is not None:
            self._thread.join(10)

    def wait(self, names: Iterable[str], *, running: bool = True, timeout_s: float = 300) -> None:
        """Block until every pod of ``names`` was seen Running (or bound, ``running=False``)."""
        wanted = set(names)
        times = self.running if running else self.bound
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not wanted <= times.keys():
                if self.error is not None:
                    raise RuntimeError(f"the pod watch failed: {self.error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(wanted - times.keys())
                    state = "Running" if running else "bound"
                    raise TimeoutError(f"{len(missing)} pods not {state}: {missing[:5]}")
                self._changed.wait(min(left, 1.0))

    def _run(self) -> None:
        try:
            enter(self.plane.network.path)
            version = ""
            while not self._stopping.is_set():
                version = self._stream(version)
        except BaseException as exc:
            if not self._stopping.is_set():
                self.error = exc
        finally:
            self._ready.set()
            with self._changed:
                self._changed.notify_all()

    def _stream(self, version: str) -> str:
        server = urllib.parse.urlsplit(self.plane.server)
        context: ssl.SSLContext = self.plane.ssl_context()
        connection = http.client.HTTPSConnection(
            server.hostname or "", server.port, context=context, timeout=None
        )
        self._connection = connection
        selector = {"labelSelector": self.label_selector} if self.label_selector else {}
        if not version:
            listing = urllib.parse.urlencode({"limit": "1", **selector})
            connection.request("GET", f"/api/v1/namespaces/{self.namespace}/pods?{listing}")
            answer = connection.getresponse()
            version = json.loads(answer.read())["metadata"]["resourceVersion"]
        query = urllib.parse.urlencode(
            {"watch": "true", "resourceVersion": version, "allowWatchBookmarks": "true", **selector}
        )
        connection.request("GET", f"/api/v1/namespaces/{self.namespace}/pods?{query}")
        answer = connection.getresponse()
        self._ready.set()
        for line in answer:
            if not line.strip():
                continue
            event = json.loads(line)
            obj = event["object"]
            if event["type"] == "ERROR":
                return ""
            version = obj["metadata"].get("resourceVersion", version)
            if event["type"] == "BOOKMARK":
                continue
            self._note(event["type"], obj)
        connection.close()
        return version

    def _note(self, kind: str, pod: dict[str, object]) -> None:
        now = time.monotonic()
        meta = pod["metadata"]
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        assert isinstance(meta, dict) and isinstance(spec, dict) and isinstance(status, dict)
        name = str(meta["name"])
        uid = str(meta.get("uid") or name)
        with self._changed:
            if kind == "DELETED":
                self.added.pop(name, None)
                self.bound.pop(name, None)
                self.running.pop(name, None)
            else:
                if name not in self.added and kind == "ADDED":
                    self._created.add(uid)
                self.added.setdefault(name, now)
                if spec.get("nodeName") and name not in self.bound:
                    self.bound[name] = now
                if status.get("phase") == "Running" and name not in self.running:
                    self.running[name] = now
                    if uid in self._created:
                        self.started.setdefault(uid, (self.added[name], now))
            self._changed.notify_all()
