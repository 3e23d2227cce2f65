"""Frozen copies of release 0.2.0's validation rules, verbatim: ``gpuconfig`` (the GpuConfig
parser) and ``checkpoint`` (the checkpoint decoder). A plugin rolled back to that release judges
what this release writes with exactly these, so the rollback tests feed them the new configs and
checkpoints. Never edit them: they are what an older plugin runs."""
