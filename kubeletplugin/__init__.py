"""The sharegpu node daemon, by stage (each may import the ones below it, never above; the
``kubeletplugin-stages`` contract in ``pyproject.toml`` enforces it):

- :mod:`.main` (composition root: every factory), :mod:`.claimservice`, :mod:`.config`;
- :mod:`.publish`, :mod:`.prepare`, :mod:`.health`: the three things the daemon does;
- :mod:`.sharing`: share enforcement (MPS, time-slicing, limits);
- :mod:`.devices` (GPU discovery, slice contents) and :mod:`.kubelet` (the generic DRA kit:
  gRPC server, DRA and health services, registration, sockets, generated code);
- :mod:`.containeredits`, :mod:`.fsutil`, :mod:`.runner`, and at the bottom :mod:`.model`.
"""
