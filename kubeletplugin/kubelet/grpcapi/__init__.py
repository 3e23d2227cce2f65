"""Kubelet-facing gRPC API: the .proto sources (``proto/``) and the Python code generated from
them (``gen/``, produced by :mod:`kubeletplugin.kubelet.grpcapi.generate`; never edited by hand)."""
