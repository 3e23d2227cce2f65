"""Strategy ``Exclusive``: the device's GPU is the claim's alone; nothing runs on the node and
the container gets no limits (a whole GPU, a MIG device, or a share that takes its whole GPU)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from api.gpuconfig import STRATEGY_EXCLUSIVE, GpuConfig
from kubeletplugin.devicerecord import DeviceRecord, Enforcement
from kubeletplugin.sharing.strategies.base import (
    NoNodeEffects,
    StrategySetup,
    enforced_caps,
    no_setting,
)


class ExclusiveStrategy:
    """See the module docstring."""

    name: Final = STRATEGY_EXCLUSIVE
    shares_gpu_with: Final = frozenset[str]()
    mixes_in_claim: Final = True
    on_mig: Final = True

    def plan(
        self, share: DeviceRecord, config: GpuConfig, setup: StrategySetup, label: str
    ) -> Enforcement:
        cores, memory = enforced_caps(share, label)
        return Enforcement(strategy=self.name, limit_cores=cores, limit_memory=memory)

    def check_claim(self, held: Sequence[DeviceRecord]) -> None:
        return None

    def conflict(self, ours: Enforcement, theirs: Enforcement) -> str | None:
        return None

    def setting_from_json(self, value: Any, where: str) -> str | None:
        no_setting(self.name, value, where)
        return None

    def on_node(self, setup: StrategySetup) -> NoNodeEffects:
        return NoNodeEffects()
