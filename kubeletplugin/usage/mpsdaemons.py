"""Which pods run this node's MPS servers: the MPS control daemon pods of this driver.

An MPS server (``nvidia-cuda-mps-server``) is a compute process of its own in NVML's list. It is
told apart from a tenant's process by the pod its cgroup names, never by its name (a tenant
names its binary as it likes): a daemon pod is a pod in the plugin's namespace labelled
``app.kubernetes.io/component=mps-control-daemon`` (:data:`DAEMON_POD_SELECTOR`; the chart's
pod template sets it and its admission policy requires it of every pod the plugin creates) and
bound to this node (``spec.nodeName``). Tenants cannot create pods in that namespace.

:class:`DaemonPods` lists them with one call (label and field selector) at most every
``refresh_s`` seconds, and sooner when asked (:meth:`DaemonPods.uids` with ``fresh``: a pod not
known yet runs on a GPU with MPS shares, e.g. a daemon started since) but never twice within
``min_interval_s``. A failed list keeps the last known set; before a list succeeds the set is
unknown (None) and no process is judged to have escaped MPS.
"""

from __future__ import annotations

import logging
from typing import Any, Final, Protocol

from sharegpu.kube.clock import Clock
from sharegpu.kube.rest import KubeApiError, KubeRest

log = logging.getLogger(__name__)

#: The label every MPS control daemon pod of the chart carries.
DAEMON_POD_SELECTOR: Final = "app.kubernetes.io/component=mps-control-daemon"
#: Most daemon pod UIDs kept (far above one per prepared claim of a node).
MAX_DAEMON_PODS: Final = 4096


class PodLister(Protocol):
    """Lists the pods of a namespace that match a label and a field selector."""

    def list(self, namespace: str, label_selector: str, field_selector: str) -> list[Any]: ...


class KubePodLister:
    """:class:`PodLister` over the API server (``list`` on pods in one namespace)."""

    def __init__(self, rest: KubeRest) -> None:
        self._rest = rest

    def list(self, namespace: str, label_selector: str, field_selector: str) -> list[Any]:
        items, _ = self._rest.list_all(
            f"/api/v1/namespaces/{namespace}/pods",
            [("labelSelector", label_selector), ("fieldSelector", field_selector)],
        )
        return items


def _uid(pod: Any) -> str | None:
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return uid.lower() if isinstance(uid, str) and 0 < len(uid) <= 64 else None


class DaemonPods:
    """The UIDs of this node's MPS daemon pods (see the module docstring)."""

    def __init__(
        self,
        lister: PodLister,
        namespace: str,
        node_name: str,
        clock: Clock,
        refresh_s: float,
        min_interval_s: float,
    ) -> None:
        self._lister = lister
        self._namespace = namespace
        self._field = f"spec.nodeName={node_name}"
        self._clock = clock
        self._refresh_s = refresh_s
        self._min_interval_s = min_interval_s
        self._uids: frozenset[str] | None = None
        self._listed_at: float | None = None
        self._tried_at: float | None = None

    def uids(self, fresh: bool = False) -> frozenset[str] | None:
        """The daemon pods' UIDs (None: never listed); re-listed when due or, with ``fresh``,
        when the last try is at least ``min_interval_s`` old."""
        now = self._clock.time()
        due = self._listed_at is None or now - self._listed_at >= self._refresh_s
        if fresh and (self._tried_at is None or now - self._tried_at >= self._min_interval_s):
            due = True
        if due and (self._tried_at is None or now - self._tried_at >= self._min_interval_s):
            self._list(now)
        return self._uids

    def _list(self, now: float) -> None:
        self._tried_at = now
        try:
            pods = self._lister.list(self._namespace, DAEMON_POD_SELECTOR, self._field)
        except KubeApiError as exc:
            log.warning("usage: cannot list the MPS daemon pods of this node: %s", exc)
            return
        uids = {u for p in pods[:MAX_DAEMON_PODS] if (u := _uid(p)) is not None}
        self._uids = frozenset(uids)
        self._listed_at = now
