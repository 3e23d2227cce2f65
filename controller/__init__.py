"""The sharegpu controller: admission webhook, per-GPU allocation tracker, metrics."""
