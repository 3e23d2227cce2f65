"""The registry of sharing strategies: strategy name -> :class:`SharingStrategy`.

:data:`DEFAULT_REGISTRY` holds the four GpuConfig strategies. The order of a registry is the
order in which the enforcer drives the node (acquire and release, restore) and lists the
names; the default one acquires a claim's Limits lock directory first, then its MPS daemons,
then its time-slice intervals."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType

from kubeletplugin.sharing.strategies.base import SharingStrategy
from kubeletplugin.sharing.strategies.exclusive import ExclusiveStrategy
from kubeletplugin.sharing.strategies.limits import LimitsStrategy
from kubeletplugin.sharing.strategies.mps import MpsStrategy
from kubeletplugin.sharing.strategies.timeslicing import TimeSlicingStrategy


class StrategyRegistry(Mapping[str, SharingStrategy]):
    """An immutable, ordered mapping of strategy name to strategy (each under its own
    :attr:`SharingStrategy.name`)."""

    def __init__(self, *strategies: SharingStrategy) -> None:
        by_name: dict[str, SharingStrategy] = {}
        for strategy in strategies:
            if strategy.name in by_name:
                raise ValueError(f"strategy {strategy.name!r} is registered twice")
            by_name[strategy.name] = strategy
        self._by_name = MappingProxyType(by_name)

    def __getitem__(self, name: str) -> SharingStrategy:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def with_strategy(self, strategy: SharingStrategy) -> StrategyRegistry:
        """This registry with ``strategy`` added last."""
        return StrategyRegistry(*self.values(), strategy)

    def known(self) -> str:
        """The names, for messages (``Exclusive, Limits, ...``)."""
        return ", ".join(self)


DEFAULT_REGISTRY = StrategyRegistry(
    ExclusiveStrategy(), LimitsStrategy(), MpsStrategy(), TimeSlicingStrategy()
)
