"""The real-GPU test of the node plugin and the harness it needs (emulated containers, a CUDA
probe, a host-process MPS launcher); see docs/development.md, "Real-GPU test"."""
