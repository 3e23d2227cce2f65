"""The hardware the node daemon drives: a :class:`~kubeletplugin.hosts.host.Host`, real
(:class:`~kubeletplugin.hosts.nvidia.NvidiaHost`) or simulated
(:class:`~kubeletplugin.hosts.simulated.SimulatedHost`), chosen once in :mod:`kubeletplugin.main`.
"""
