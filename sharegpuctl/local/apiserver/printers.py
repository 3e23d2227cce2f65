"""The Table columns of the built-in kinds, as the real API server prints them.

Each built-in kind the server serves maps (by group and plural) to its column definitions;
a column is a name, its priority (0: ``kubectl get`` shows it; 1: only ``-o wide``) and a small
function computing the cell from the stored object and the current time. The server always
computes every column (the real one generates wide tables and lets the client drop priority-1
columns). Cells are strings like upstream's printers (``<none>``/``<unknown>`` for missing
values) except the events' ``Count`` (an integer), and the CustomResourceDefinitions'
``Created At`` (the RFC 3339 timestamp, which kubectl shows as an age) and ``Established`` (a
boolean). Custom resources keep the default ``Name``/``Created At`` table or their
``additionalPrinterColumns``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from api import names

Obj = Mapping[str, Any]
CellFn = Callable[[Obj, datetime], Any]

NAME_DESCRIPTION = (
    "Name must be unique within a namespace. Is required when creating resources, although "
    "some resources may allow a client to request the generation of an appropriate name "
    "automatically. Name is primarily intended for creation idempotence and configuration "
    "definition. Cannot be updated."
)
AGE_DESCRIPTION = (
    "CreationTimestamp is a timestamp representing the server time when this object was created."
)
_NODE_ROLE_PREFIX = "node-role.kubernetes.io/"
_NODE_ROLE_LABEL = "kubernetes.io/role"


@dataclass(frozen=True)
class Column:
    """One printed column: its definition and how to compute its cell."""

    name: str
    description: str
    cell: CellFn
    priority: int = 0
    type: str = "string"
    format: str = ""

    def definition(self) -> dict[str, Any]:
        """The ``columnDefinitions`` entry of a Table."""
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


def _map(obj: Any, *keys: str) -> Mapping[str, Any]:
    """The mapping at ``obj[keys[0]][keys[1]]...``; empty when any step is not a mapping."""
    current: Any = obj
    for key in keys:
        current = current.get(key) if isinstance(current, Mapping) else None
    return current if isinstance(current, Mapping) else {}


def _list(obj: Any, *keys: str) -> list[Any]:
    *head, last = keys
    value = _map(obj, *head).get(last)
    return value if isinstance(value, list) else []


def _str(obj: Any, *keys: str) -> str:
    *head, last = keys
    value = _map(obj, *head).get(last)
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def human_duration(seconds: float) -> str:
    """``k8s.io/apimachinery/pkg/util/duration.HumanDuration`` of ``seconds``."""
    if seconds < -1:
        return "<invalid>"
    s = max(int(seconds), 0)
    minutes, hours = s // 60, s // 3600
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp (seconds or microseconds, ``Z``) as a UTC datetime, if it is one."""
    if not isinstance(value, str):
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.%fZ"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def since(value: Any, now: datetime) -> str:
    """How long ago ``value`` was, or ``<unknown>`` when it is not a timestamp."""
    then = parse_time(value)
    return "<unknown>" if then is None else human_duration((now - then).total_seconds())


def _name(obj: Obj, now: datetime) -> Any:
    return _map(obj, "metadata").get("name")


def _age(obj: Obj, now: datetime) -> str:
    return since(_map(obj, "metadata").get("creationTimestamp"), now)


def _field(*keys: str, empty: str = "") -> CellFn:
    """A cell showing the string at ``keys`` (``empty`` when absent)."""

    def cell(obj: Obj, now: datetime) -> str:
        return _str(obj, *keys) or empty

    return cell


NAME = Column("Name", NAME_DESCRIPTION, _name, format="name")
AGE = Column("Age", AGE_DESCRIPTION, _age)


# --- resource.k8s.io -------------------------------------------------------------------------


def claim_state(obj: Obj, now: datetime) -> str:
    """``deleted``, ``pending``, ``allocated`` and ``reserved``, comma-joined as they apply."""
    states = []
    deleting = _map(obj, "metadata").get("deletionTimestamp") is not None
    if deleting:
        states.append("deleted")
    status = _map(obj, "status")
    if status.get("allocation") is None:
        if not deleting:
            states.append("pending")
    else:
        states.append("allocated")
        if _list(obj, "status", "reservedFor"):
            states.append("reserved")
    return ",".join(states)


def _taint_added(obj: Obj, now: datetime) -> str:
    added = _map(obj, "spec", "taint").get("timeAdded")
    return "" if added is None else since(added, now)


# --- core/v1 Node ----------------------------------------------------------------------------


def node_status(obj: Obj, now: datetime) -> str:
    """``Ready``/``NotReady`` from the Ready condition (``Unknown`` without one), then
    ``SchedulingDisabled`` when the node is cordoned."""
    status = []
    for condition in _list(obj, "status", "conditions"):
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
            status = ["Ready" if ready else "NotReady"]
    if not status:
        status = ["Unknown"]
    if _map(obj, "spec").get("unschedulable") is True:
        status.append("SchedulingDisabled")
    return ",".join(status)


def node_roles(obj: Obj, now: datetime) -> str:
    """The sorted roles from ``node-role.kubernetes.io/<role>`` and ``kubernetes.io/role``
    labels, or ``<none>``."""
    roles = set()
    for key, value in _map(obj, "metadata", "labels").items():
        if key.startswith(_NODE_ROLE_PREFIX) and key != _NODE_ROLE_PREFIX:
            roles.add(key.removeprefix(_NODE_ROLE_PREFIX))
        elif key == _NODE_ROLE_LABEL and value:
            roles.add(str(value))
    return ",".join(sorted(roles)) or "<none>"


def _node_address(kind: str) -> CellFn:
    def cell(obj: Obj, now: datetime) -> str:
        for address in _list(obj, "status", "addresses"):
            if isinstance(address, Mapping) and address.get("type") == kind:
                return str(address.get("address", ""))
        return "<none>"

    return cell


def _kernel(obj: Obj, now: datetime) -> str:
    kernel = _str(obj, "status", "nodeInfo", "kernelVersion") or "<unknown>"
    arch = _str(obj, "status", "nodeInfo", "architecture")
    return f"{kernel} ({arch})" if arch else kernel


# --- core/v1 Event ---------------------------------------------------------------------------


def _event_first(obj: Obj, now: datetime) -> str:
    first = obj.get("firstTimestamp")
    return since(first if first else obj.get("eventTime"), now)


def event_last_seen(obj: Obj, now: datetime) -> str:
    """The series' last observation, else ``lastTimestamp``, else the first sighting."""
    series = obj.get("series")
    if isinstance(series, Mapping):
        return since(series.get("lastObservedTime"), now)
    last = obj.get("lastTimestamp")
    return since(last, now) if last else _event_first(obj, now)


def event_object(obj: Obj, now: datetime) -> str:
    """``kind/name`` of the involved object in lower case kind (just the kind without a name)."""
    kind = _str(obj, "involvedObject", "kind").lower()
    name = _str(obj, "involvedObject", "name")
    return f"{kind}/{name}" if name else kind


def _event_source(obj: Obj, now: datetime) -> str:
    component = _str(obj, "source", "component") or _str(obj, "reportingComponent")
    instance = _str(obj, "source", "host") or _str(obj, "reportingInstance")
    return f"{component}, {instance}" if instance else component


def _event_count(obj: Obj, now: datetime) -> int:
    series = obj.get("series")
    if isinstance(series, Mapping):
        return _int(series.get("count"))
    return _int(obj.get("count")) or 1


def _event_message(obj: Obj, now: datetime) -> str:
    return _str(obj, "message").strip()


# --- core/v1 Pod -----------------------------------------------------------------------------


@dataclass
class _PodSummary:
    ready: int
    total: int
    reason: str
    restarts: int
    last_restart: datetime | None


def _later(a: datetime | None, status: Obj) -> datetime | None:
    """The later of ``a`` and the container's last termination time."""
    finished = parse_time(_map(status, "lastState", "terminated").get("finishedAt"))
    if finished is None or (a is not None and a >= finished):
        return a
    return finished


def _terminated_reason(terminated: Mapping[str, Any], prefix: str) -> str:
    if terminated.get("reason"):
        return f"{prefix}{terminated['reason']}"
    if _int(terminated.get("signal")):
        return f"{prefix}Signal:{terminated['signal']}"
    return f"{prefix}ExitCode:{_int(terminated.get('exitCode'))}"


def _has_condition(obj: Obj, kind: str) -> bool | None:
    for condition in _list(obj, "status", "conditions"):
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            return condition.get("status") == "True"
    return None


def pod_summary(obj: Obj) -> _PodSummary:
    """Ready/total containers, the status reason and the restarts of a pod, following the
    real server's pod printer (init containers, sidecars, waiting/terminated reasons,
    ``Terminating``)."""
    restartable = {
        c.get("name")
        for c in _list(obj, "spec", "initContainers")
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
    }
    init_count = len(_list(obj, "spec", "initContainers"))
    total = len(_list(obj, "spec", "containers")) + len(restartable)
    phase = _str(obj, "status", "phase")
    reason = _str(obj, "status", "reason") or phase
    for condition in _list(obj, "status", "conditions"):
        gated = isinstance(condition, Mapping) and condition.get("reason") == "SchedulingGated"
        if gated and condition.get("type") == "PodScheduled":
            reason = "SchedulingGated"
    ready = restarts = sidecar_restarts = 0
    last: datetime | None = None
    sidecar_last: datetime | None = None
    initializing = False
    for i, status in enumerate(_list(obj, "status", "initContainerStatuses")):
        if not isinstance(status, Mapping):
            continue
        restarts += _int(status.get("restartCount"))
        last = _later(last, status)
        sidecar = status.get("name") in restartable
        if sidecar:
            sidecar_restarts += _int(status.get("restartCount"))
            sidecar_last = _later(sidecar_last, status)
        terminated = _map(status, "state", "terminated")
        waiting = _map(status, "state", "waiting")
        if terminated and _int(terminated.get("exitCode")) == 0:
            continue
        if sidecar and status.get("started") is True:
            ready += 1 if status.get("ready") is True else 0
            continue
        if terminated:
            reason = _terminated_reason(terminated, "Init:")
        elif waiting.get("reason") and waiting.get("reason") != "PodInitializing":
            reason = f"Init:{waiting['reason']}"
        else:
            reason = f"Init:{i}/{init_count}"
        initializing = True
        break
    if not initializing or _has_condition(obj, "Initialized"):
        restarts, last = sidecar_restarts, sidecar_last
        running = False
        error = ""
        for status in reversed(_list(obj, "status", "containerStatuses")):
            if not isinstance(status, Mapping):
                continue
            restarts += _int(status.get("restartCount"))
            last = _later(last, status)
            terminated = _map(status, "state", "terminated")
            waiting = _map(status, "state", "waiting")
            if waiting.get("reason"):
                reason = str(waiting["reason"])
            elif terminated:
                reason = _terminated_reason(terminated, "")
                if _int(terminated.get("exitCode")) != 0:
                    error = reason
            elif status.get("ready") is True and "running" in _map(status, "state"):
                running = True
                ready += 1
        if reason == "Completed":
            if running and _has_condition(obj, "Ready"):
                reason = "Running"
            elif error:
                reason = error
            elif running:
                reason = "NotReady"
    meta = _map(obj, "metadata")
    if meta.get("deletionTimestamp") is not None:
        if _str(obj, "status", "reason") == "NodeLost":
            reason = "Unknown"
        elif phase not in ("Succeeded", "Failed"):
            reason = "Terminating"
    return _PodSummary(ready, total, reason, restarts, last)


def _pod_ready(obj: Obj, now: datetime) -> str:
    summary = pod_summary(obj)
    return f"{summary.ready}/{summary.total}"


def _pod_status(obj: Obj, now: datetime) -> str:
    return pod_summary(obj).reason


def _pod_restarts(obj: Obj, now: datetime) -> str:
    summary = pod_summary(obj)
    if summary.restarts and summary.last_restart is not None:
        ago = human_duration((now - summary.last_restart).total_seconds())
        return f"{summary.restarts} ({ago} ago)"
    return str(summary.restarts)


def _pod_ip(obj: Obj, now: datetime) -> str:
    ips = _list(obj, "status", "podIPs")
    first = ips[0] if ips and isinstance(ips[0], Mapping) else {}
    return str(first.get("ip") or "") or "<none>"


def _readiness_gates(obj: Obj, now: datetime) -> str:
    gates = [g for g in _list(obj, "spec", "readinessGates") if isinstance(g, Mapping)]
    if not gates:
        return "<none>"
    met = sum(1 for g in gates if _has_condition(obj, str(g.get("conditionType"))))
    return f"{met}/{len(gates)}"


def pod_row_conditions(obj: Obj) -> list[dict[str, str]]:
    """The ``Completed`` row condition of a finished pod (kubectl hides such rows on request)."""
    phase = _str(obj, "status", "phase")
    messages = {"Succeeded": "The pod has completed successfully.", "Failed": "The pod failed."}
    if phase not in messages:
        return []
    return [{"type": "Completed", "status": "True", "reason": phase, "message": messages[phase]}]


# --- apiextensions.k8s.io/v1 CustomResourceDefinition ------------------------------------------


def crd_versions(obj: Obj, now: datetime) -> str:
    """The served versions, sorted, the storage one marked ``(storage)``."""
    labels = [
        str(v.get("name", "")) + ("(storage)" if v.get("storage") is True else "")
        for v in _list(obj, "spec", "versions")
        if isinstance(v, Mapping) and v.get("served") is True
    ]
    return ",".join(sorted(labels))


def _created(obj: Obj, now: datetime) -> Any:
    return _map(obj, "metadata").get("creationTimestamp")


def _short_names(obj: Obj, now: datetime) -> str:
    return ",".join(str(n) for n in _list(obj, "spec", "names", "shortNames"))


def _established(obj: Obj, now: datetime) -> bool:
    return _has_condition(obj, "Established") is True


# --- the table -------------------------------------------------------------------------------

_RESOURCE = names.RESOURCE_GROUP

BUILTIN_COLUMNS: dict[tuple[str, str], tuple[Column, ...]] = {
    ("", "pods"): (
        NAME,
        Column("Ready", "The aggregate readiness state of this pod.", _pod_ready),
        Column("Status", "The aggregate status of the containers in this pod.", _pod_status),
        Column("Restarts", "The number of container restarts and the last one.", _pod_restarts),
        AGE,
        Column("IP", "The pod's first IP address.", _pod_ip, priority=1),
        Column(
            "Node",
            "The node the pod is bound to.",
            _field("spec", "nodeName", empty="<none>"),
            priority=1,
        ),
        Column(
            "Nominated Node",
            "The node the scheduler nominated for preemption.",
            _field("status", "nominatedNodeName", empty="<none>"),
            priority=1,
        ),
        Column("Readiness Gates", "Readiness gates met of all.", _readiness_gates, priority=1),
    ),
    ("", "nodes"): (
        NAME,
        Column("Status", "The status of the node", node_status),
        Column("Roles", "The roles of the node", node_roles),
        AGE,
        Column(
            "Version",
            "Kubelet Version reported by the node.",
            _field("status", "nodeInfo", "kubeletVersion"),
        ),
        Column(
            "Internal-IP", "The node's internal address.", _node_address("InternalIP"), priority=1
        ),
        Column(
            "External-IP", "The node's external address.", _node_address("ExternalIP"), priority=1
        ),
        Column(
            "OS-Image",
            "The node's OS image.",
            _field("status", "nodeInfo", "osImage", empty="<unknown>"),
            priority=1,
        ),
        Column("Kernel-Version", "The node's kernel version.", _kernel, priority=1),
        Column(
            "Container-Runtime",
            "The node's container runtime version.",
            _field("status", "nodeInfo", "containerRuntimeVersion", empty="<unknown>"),
            priority=1,
        ),
    ),
    ("", "namespaces"): (
        NAME,
        Column("Status", "The status of the namespace", _field("status", "phase")),
        AGE,
    ),
    ("", "events"): (
        Column("Last Seen", "When the event was last observed.", event_last_seen),
        Column("Type", "Type of this event (Normal, Warning).", _field("type")),
        Column("Reason", "Why the event was generated.", _field("reason")),
        Column("Object", "The object this event is about.", event_object),
        Column(
            "Subobject",
            "The part of the object this event is about.",
            _field("involvedObject", "fieldPath"),
            priority=1,
        ),
        Column("Source", "The component reporting this event.", _event_source, priority=1),
        Column("Message", "A description of the event.", _event_message),
        Column("First Seen", "When the event was first observed.", _event_first, priority=1),
        Column("Count", "How often the event occurred.", _event_count, priority=1),
        Column("Name", NAME_DESCRIPTION, _name, priority=1, format="name"),
    ),
    ("coordination.k8s.io", "leases"): (
        NAME,
        Column("Holder", "The holder of the lease.", _field("spec", "holderIdentity")),
        AGE,
    ),
    (_RESOURCE, "deviceclasses"): (NAME, AGE),
    (_RESOURCE, "resourceclaims"): (
        NAME,
        Column(
            "State",
            "A summary of the current state (allocated, pending, reserved, etc.).",
            claim_state,
        ),
        AGE,
    ),
    (_RESOURCE, "resourceclaimtemplates"): (NAME, AGE),
    (_RESOURCE, "resourceslices"): (
        NAME,
        Column("Node", "The node the slice's devices are local to.", _field("spec", "nodeName")),
        Column("Driver", "The driver publishing the slice.", _field("spec", "driver")),
        Column("Pool", "The pool the slice belongs to.", _field("spec", "pool", "name")),
        AGE,
    ),
    ("apiextensions.k8s.io", "customresourcedefinitions"): (
        NAME,
        Column("Scope", "Cluster/Namespaced", _field("spec", "scope")),
        Column("Versions", "Served versions", crd_versions),
        Column("Created At", AGE_DESCRIPTION, _created, type="date"),
        Column("Group", "API group", _field("spec", "group"), priority=1),
        Column("Kind", "CustomResource kind", _field("spec", "names", "kind"), priority=1),
        Column("ShortNames", "Short names", _short_names, priority=1),
        Column("Established", "Established status", _established, priority=1, type="boolean"),
    ),
    (_RESOURCE, "devicetaintrules"): (
        NAME,
        Column("Key", "The taint key.", _field("spec", "taint", "key")),
        Column("Value", "The taint value.", _field("spec", "taint", "value")),
        Column("Effect", "The taint effect.", _field("spec", "taint", "effect")),
        Column("TimeAdded", "When the taint was added.", _taint_added),
        AGE,
    ),
}

#: Extra per-row conditions of a kind (only finished pods have any).
ROW_CONDITIONS: dict[tuple[str, str], Callable[[Obj], list[dict[str, str]]]] = {
    ("", "pods"): pod_row_conditions,
}
