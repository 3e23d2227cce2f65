"""What the API server kept of a ResourceSlice the plugin published.

An API server with a feature gate off drops the gate's fields (:mod:`api.gates`) from what it
stores, without an error: on Kubernetes 1.34 and 1.35 with DRAConsumableCapacity off, the
shared devices lose ``allowMultipleAllocations`` and their request policies and every share
becomes a whole GPU. :func:`dropped_fields` compares a slice as sent with the slice as stored
(the answer to the write); :func:`dropped_message` is the one line an admin reads, naming each
gate and its consequence; :func:`node_event` is that line as a Warning Event on the Node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from api import gates

#: The ``reason`` of the Event on the Node.
EVENT_REASON: Final = "ResourceSliceFieldsDropped"
EVENT_COMPONENT: Final = "sharegpu-kubelet-plugin"
#: Longest Event message sent (the events.k8s.io note limit); longer ones are cut.
MAX_EVENT_MESSAGE: Final = 1024


@dataclass(frozen=True)
class DroppedField:
    """A gated field sent at ``path`` that the API server did not store."""

    path: str
    gated: gates.GatedField


def dropped_fields(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> list[DroppedField]:
    """The gated fields of ``sent`` that ``stored`` (the same ResourceSlice as the API server
    stored it) lacks, in table order."""
    kept = {path for path, _ in gates.gated_fields(stored)}
    return [DroppedField(p, g) for p, g in gates.gated_fields(sent) if p not in kept]


def dropped_gates(dropped: Sequence[DroppedField]) -> list[str]:
    """The gates of ``dropped``, each once, in table order."""
    return list(dict.fromkeys(d.gated.gate for d in dropped))


def dropped_message(name: str, dropped: Sequence[DroppedField]) -> str:
    """One line: per gate, what was dropped (with one path) and what that means."""
    parts = []
    for gate in dropped_gates(dropped):
        mine = [d for d in dropped if d.gated.gate == gate]
        what = ", ".join(dict.fromkeys(d.gated.what for d in mine))
        consequences = "; ".join(dict.fromkeys(d.gated.consequence for d in mine))
        parts.append(
            f"feature gate {gate} is off: {what} dropped (e.g. {mine[0].path}), so {consequences}"
        )
    return (
        f"the API server dropped fields of ResourceSlice {name}: " + " | ".join(parts) + "; "
        "enable the gates on the API server, scheduler, controller manager and kubelets, or "
        "run the plugin in a sharing mode that needs none (exclusive)"
    )


def node_event(node_name: str, node_uid: str, message: str, when: datetime) -> dict[str, Any]:
    """A Warning Event on the Node saying ``message`` (namespace ``default``, as node events;
    cut to :data:`MAX_EVENT_MESSAGE` characters)."""
    if len(message) > MAX_EVENT_MESSAGE:
        message = message[: MAX_EVENT_MESSAGE - 3] + "..."
    stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node_name}.", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid},
        "type": "Warning",
        "reason": EVENT_REASON,
        "message": message,
        "source": {"component": EVENT_COMPONENT, "host": node_name},
        "reportingComponent": EVENT_COMPONENT,
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
    }
