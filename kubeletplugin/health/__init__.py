"""GPU health: checkers (NVML in :mod:`.nvmlcheck`, a mock file in :mod:`.mockfile`), the state
machine (:mod:`.state`), and the monitor (:mod:`.monitor`) that turns health changes into device
taints and kubelet health-stream updates. :mod:`.flags` and :mod:`.settings` are plain
configuration; the daemon's composition root (:mod:`kubeletplugin.main`) builds the objects."""
