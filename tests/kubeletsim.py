"""A kubelet simulator for the tests: :mod:`sharegpu.local.kubelet` under its test-suite name.

Import with ``from kubeletsim import KubeletSim`` (pytest puts tests/ on sys.path); see
:mod:`sharegpu.local.kubelet` for the API.
"""

from __future__ import annotations

from sharegpu.local.kubelet import (
    CALL_TIMEOUT_S,
    KUBELET_VERSIONS,
    HealthWatch,
    KubeletSim,
    RegisteredPlugin,
    RegistrationRejected,
    SimClaimResult,
    SimDevice,
    SimDeviceHealth,
    SimPluginInfo,
)

__all__ = [
    "CALL_TIMEOUT_S",
    "KUBELET_VERSIONS",
    "HealthWatch",
    "KubeletSim",
    "RegisteredPlugin",
    "RegistrationRejected",
    "SimClaimResult",
    "SimDevice",
    "SimDeviceHealth",
    "SimPluginInfo",
]
