"""Python modules generated from ``kubeletplugin/kubelet/grpcapi/proto`` by
``python -m kubeletplugin.kubelet.grpcapi.generate``. Do not edit; regenerate.
"""
