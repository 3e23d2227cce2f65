"""A local Kubernetes for ``sharegpu demo`` and the tests: the embedded API server
(:mod:`.apiserver`) and a kubelet client that drives a plugin over its real sockets
(:mod:`.kubelet`). Never imported by the daemons."""
