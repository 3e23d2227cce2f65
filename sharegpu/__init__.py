"""sharegpu's user-facing library: the CLI, the Kubernetes CEL environment, the allocator,
and an in-process Kubernetes API server for demos and tests."""
