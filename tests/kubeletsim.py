"""A kubelet simulator for the tests: :mod:`sharegpu.kubeletclient` under its test-suite name.

Import with ``from kubeletsim import KubeletSim`` (pytest puts tests/ on sys.path); see
:mod:`sharegpu.kubeletclient` for the API.
"""

from __future__ import annotations

from sharegpu.kubeletclient import (
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
