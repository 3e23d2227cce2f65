"""GPU health: checkers (NVML, mock file), the state machine, and the monitor that turns
health changes into device taints and kubelet health-stream updates."""

from kubeletplugin.health.events import DEFAULT_IGNORED_XIDS, EventKind, HealthEvent
from kubeletplugin.health.flags import (
    HealthFlagError,
    HealthOptions,
    add_health_flags,
    build_health,
    health_options,
)
from kubeletplugin.health.mockfile import MockHealthChecker
from kubeletplugin.health.monitor import HealthChecker, HealthMonitor, HealthSettings
from kubeletplugin.health.nvmlcheck import NvmlHealthChecker
from kubeletplugin.health.restore import PublishedFault, published_unhealthy

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "EventKind",
    "HealthChecker",
    "HealthEvent",
    "HealthFlagError",
    "HealthMonitor",
    "HealthOptions",
    "HealthSettings",
    "MockHealthChecker",
    "NvmlHealthChecker",
    "PublishedFault",
    "add_health_flags",
    "build_health",
    "health_options",
    "published_unhealthy",
]
