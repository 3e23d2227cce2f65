"""sharegpu's shared runtime libraries, below both daemons (top may import down, never up; the
contracts in ``pyproject.toml`` enforce it, and nothing here imports ``kubeletplugin``,
``controller`` or ``sharegpuctl``):

- :mod:`sharegpu.admission`, :mod:`sharegpu.allocator`: pure libraries (claim checks,
  kube-scheduler's allocator);
- :mod:`sharegpu.cel`: Kubernetes CEL for DRA selectors;
- :mod:`sharegpu.kube`: the Kubernetes runtime both daemons share.
"""
