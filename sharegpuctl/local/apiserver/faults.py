"""Fault injection for tests: make chosen requests fail, hang up, or stall."""

from __future__ import annotations

import threading
from dataclasses import dataclass

#: What an injected fault does.
ACTION_STATUS = "status"  # answer with a Status error of ``code``
ACTION_HANGUP = "hangup"  # close the connection without answering
ACTION_DELAY = "delay"  # wait ``delay_s`` seconds, then serve the request normally
ACTIONS = (ACTION_STATUS, ACTION_HANGUP, ACTION_DELAY)

#: Verbs, as counted and matched (Kubernetes authorization verbs).
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


@dataclass
class Fault:
    """One injected fault. ``verb``/``resource``/``name``/``namespace`` of None match anything;
    ``resource`` may name a subresource as ``resourceclaims/status``. ``times`` is how many more
    requests it hits (None: until cleared); ``hits`` counts the requests it hit."""

    verb: str | None
    resource: str | None
    code: int = 500
    times: int | None = 1
    action: str = ACTION_STATUS
    delay_s: float = 0.0
    name: str | None = None
    namespace: str | None = None
    message: str = "injected fault"
    hits: int = 0

    def matches(self, verb: str, resource: str, name: str | None, namespace: str | None) -> bool:
        """Whether this fault applies to the request."""
        if self.times is not None and self.times <= 0:
            return False
        if self.verb is not None and self.verb != verb:
            return False
        if self.resource is not None and self.resource not in (resource, resource.split("/")[0]):
            return False
        if self.name is not None and self.name != name:
            return False
        return self.namespace is None or self.namespace == namespace


class FaultInjector:
    """Thread-safe list of faults; :meth:`take` consumes one hit of the first matching fault."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        """Register ``fault`` (after validating its action and verb) and return it."""
        if fault.action not in ACTIONS:
            raise ValueError(f"unknown fault action {fault.action!r}; one of {', '.join(ACTIONS)}")
        if fault.verb is not None and fault.verb not in VERBS:
            raise ValueError(f"unknown verb {fault.verb!r}; one of {', '.join(VERBS)}")
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        """Remove all faults."""
        with self._lock:
            self._faults.clear()

    def take(
        self, verb: str, resource: str, name: str | None, namespace: str | None
    ) -> Fault | None:
        """The fault that hits this request, if any (its remaining count is decremented)."""
        with self._lock:
            for fault in self._faults:
                if fault.matches(verb, resource, name, namespace):
                    if fault.times is not None:
                        fault.times -= 1
                    fault.hits += 1
                    return fault
        return None
