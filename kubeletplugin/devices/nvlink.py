"""NVLink domains: which GPUs of a node reach each other over NVLink, as one string per GPU.

A GPU's domain (published as ``nvlinkDomain``, docs/configuration.md) is, by precedence:

1. ``<clusterUuid>.<cliqueId>`` when the GPU is registered in an NVSwitch fabric
   (NVML fabric info: state completed, status success, a non-zero cluster UUID): every GPU of
   that NVLink partition, on any node, has the same value;
2. :data:`NVSWITCH_DOMAIN` when an active NVLink of the GPU ends at an NVSwitch (an HGX board
   without fabric registration): all such GPUs of the node are one domain;
3. ``nvlink-<PCI bus ID>`` for GPUs joined by direct GPU-to-GPU links (NVLink bridges): one
   value per connected group of the node's GPUs, named after the lowest bus ID in the group;
4. none, for a GPU without an active NVLink to another GPU of the node.

Invariants: two GPUs of one node with the same domain reach each other over NVLink (directly, or
through the switch fabric); every value is a valid attribute string (:func:`domain_problem`);
the result depends only on the links, not on the order the GPUs are given in.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

#: The domain of the GPUs of a node whose NVLinks end at NVSwitches (no fabric registration).
NVSWITCH_DOMAIN: Final = "nvswitch"
#: Prefix of a domain of GPUs joined by direct links (bridges).
PEER_DOMAIN_PREFIX: Final = "nvlink-"
#: Longest domain value (a device attribute string may hold 64 bytes).
MAX_DOMAIN_LENGTH: Final = 64
_DOMAIN_RE: Final = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._:-]*[A-Za-z0-9])?")


@dataclass(frozen=True)
class NvLinkView:
    """What NVML says about one GPU's NVLinks. ``bus_id`` is in the sysfs form
    (``0000:1b:00.0``); ``fabric`` is (cluster UUID bytes, clique id) of a completed NVSwitch
    fabric registration, or None; ``switch`` whether an active link ends at an NVSwitch;
    ``peers`` the bus IDs at the far end of active links that end at a GPU."""

    bus_id: str
    fabric: tuple[bytes, int] | None = None
    switch: bool = False
    peers: frozenset[str] = field(default_factory=frozenset)


def domain_problem(value: str) -> str | None:
    """Why ``value`` cannot be an NVLink domain, or None: 1 to 64 characters, letters, digits,
    ``.``, ``_``, ``:`` and ``-``, starting and ending with a letter or digit."""
    if not 0 < len(value) <= MAX_DOMAIN_LENGTH:
        return f"must have 1 to {MAX_DOMAIN_LENGTH} characters, got {len(value)}"
    if not _DOMAIN_RE.fullmatch(value):
        return (
            "may hold only letters, digits, '.', '_', ':' and '-', and must start and end "
            f"with a letter or digit, got {value!r}"
        )
    return None


def fabric_domain(cluster_uuid: bytes, clique_id: int) -> str | None:
    """``<uuid>.<clique>`` of a fabric registration; None for an all-zero or malformed UUID
    or a clique id outside 0..2**32-1 (no usable registration)."""
    if len(cluster_uuid) != 16 or not any(cluster_uuid) or not 0 <= clique_id < 2**32:
        return None
    return f"{uuid.UUID(bytes=bytes(cluster_uuid))}.{clique_id}"


def nvlink_domains(views: Iterable[NvLinkView]) -> dict[str, str]:
    """Bus ID -> NVLink domain of each GPU that has one (see the module docstring). Links to a
    bus ID that is not among ``views`` (a GPU left out, a CPU) are ignored."""
    by_bus = {v.bus_id: v for v in views}
    domains: dict[str, str] = {}
    for view in by_bus.values():
        fabric = fabric_domain(*view.fabric) if view.fabric is not None else None
        if fabric is not None:
            domains[view.bus_id] = fabric
        elif view.switch:
            domains[view.bus_id] = NVSWITCH_DOMAIN
    # Direct links join GPUs in both directions (a link seen from either end counts).
    neighbours: dict[str, set[str]] = {bus: set() for bus in by_bus if bus not in domains}
    for view in by_bus.values():
        for peer in view.peers:
            if view.bus_id in neighbours and peer in neighbours and peer != view.bus_id:
                neighbours[view.bus_id].add(peer)
                neighbours[peer].add(view.bus_id)
    seen: set[str] = set()
    for start in sorted(neighbours):
        if start in seen or not neighbours[start]:
            continue
        group, todo = {start}, [start]
        while todo:
            for peer in neighbours[todo.pop()]:
                if peer not in group:
                    group.add(peer)
                    todo.append(peer)
        seen |= group
        name = PEER_DOMAIN_PREFIX + min(group)
        domains.update((bus, name) for bus in group)
    return domains


def domain_groups(domains: Mapping[str, str]) -> dict[str, list[str]]:
    """Domain -> its bus IDs, sorted (what ``sharegpu devices`` and the docs show)."""
    groups: dict[str, list[str]] = {}
    for bus, domain in sorted(domains.items()):
        groups.setdefault(domain, []).append(bus)
    return groups
