"""sharegpu's shared library and user CLI, in layers (top may import down, never up; the
contracts in ``pyproject.toml`` enforce it):

- :mod:`sharegpu.cli`: the ``sharegpu`` command;
- :mod:`sharegpu.local`: an embedded API server and kubelet client (``sharegpu demo``, tests);
- :mod:`sharegpu.admission`, :mod:`sharegpu.allocator`, :mod:`sharegpu.cel`: pure libraries
  (claim checks, kube-scheduler's allocator, Kubernetes CEL);
- :mod:`sharegpu.kube`: the Kubernetes runtime both daemons share.
"""
