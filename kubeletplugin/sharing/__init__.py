"""Enforcement of GPU shares on the node: MPS daemons, time-slicing, interception-library limits.

:mod:`kubeletplugin.sharing.enforcer` implements the state module's ``ShareEnforcer`` seam on top
of the per-mechanism modules; every external command goes through :mod:`kubeletplugin.runner`.
"""
