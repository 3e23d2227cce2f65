"""Enforcement of GPU shares on the node: MPS, time-slicing, interception-library limits.

:mod:`kubeletplugin.sharing.enforcer` implements the state module's ``ShareEnforcer`` seam on top
of the strategies of :mod:`kubeletplugin.sharing.strategies` (one module each, reached through
its registry), which drive the per-mechanism modules; every external command goes through
:mod:`kubeletplugin.runner`.
"""
