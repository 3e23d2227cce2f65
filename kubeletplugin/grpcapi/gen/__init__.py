"""Python modules generated from ``kubeletplugin/grpcapi/proto`` by
``python -m kubeletplugin.grpcapi.generate``. Do not edit; regenerate.
"""
