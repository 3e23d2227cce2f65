"""The user-facing ``sharegpu`` command and the local cluster it runs, above both daemons:

- :mod:`sharegpuctl.cli`: the ``sharegpu`` command (``python -m sharegpuctl``);
- :mod:`sharegpuctl.local`: an embedded API server and kubelet client (``sharegpu demo``, tests).

Nothing below (``kubeletplugin``, ``controller``, ``sharegpu``, ``api``) imports this package.
"""
