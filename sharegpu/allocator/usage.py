"""What the claims already allocated on the cluster hold: exclusive devices, consumed
capacity of shared devices, and (per pool) the counters their devices consume."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .capacity import Amount, amount
from .model import DeviceId
from .pools import Pool
from .requests import claim_name


@dataclass
class Usage:
    """Holdings of allocated claims. ``adminAccess`` results hold nothing."""

    #: Device -> claim holding it without a share.
    exclusive: dict[DeviceId, str] = field(default_factory=dict)
    #: Shared device -> capacity key -> consumed amount (sum over its shares).
    consumed: dict[DeviceId, dict[str, Amount]] = field(default_factory=lambda: defaultdict(dict))
    #: Shared device -> claims holding a share.
    sharers: dict[DeviceId, list[str]] = field(default_factory=lambda: defaultdict(list))

    @property
    def allocated(self) -> set[DeviceId]:
        """Every device held by some claim (exclusively or shared)."""
        return set(self.exclusive) | {d for d, s in self.sharers.items() if s}

    def add_allocation(self, holder: str, allocation: Mapping[str, Any]) -> None:
        """Record the ``status.allocation`` of claim ``holder``."""
        results = (allocation.get("devices") or {}).get("results") or []
        for i, result in enumerate(results):
            if result.get("adminAccess"):
                continue
            dev = DeviceId(str(result["driver"]), str(result["pool"]), str(result["device"]))
            if not result.get("shareID"):
                self.exclusive[dev] = holder
                continue
            self.sharers[dev].append(holder)
            consumed = self.consumed[dev]
            for name, value in (result.get("consumedCapacity") or {}).items():
                path = f"claim {holder}: status.allocation.devices.results[{i}]"
                used = amount(value, f"{path}.consumedCapacity[{name}]")
                consumed[name] = consumed.get(name, Amount(0)) + used

    @classmethod
    def from_claims(cls, claims: Iterable[Mapping[str, Any]]) -> Usage:
        """Usage of every claim that has a ``status.allocation``."""
        usage = cls()
        for claim in claims:
            allocation = (claim.get("status") or {}).get("allocation")
            if allocation:
                usage.add_allocation(claim_name(claim), allocation)
        return usage


def counters_left(pool: Pool, usage: Usage) -> dict[str, dict[str, Amount]]:
    """The pool's counters minus what its allocated devices consume (a shared device once).

    May go negative when the cluster is over-committed; that reads as nothing left.
    """
    left = {name: dict(counters) for name, counters in pool.counters.items()}
    allocated = usage.allocated
    for name, device in pool.all_devices.items():
        if DeviceId(pool.driver, pool.name, name) not in allocated:
            continue
        for consumption in device.get("consumesCounters") or []:
            counters = left.get(str(consumption.get("counterSet")))
            if counters is None:
                continue
            for counter, c in (consumption.get("counters") or {}).items():
                if counter in counters:
                    counters[counter] -= amount(c.get("value"), f"device {name}: counter {counter}")
    return left
