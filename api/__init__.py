"""The sharegpu API group ``resource.sharegpu.dev/v1alpha1`` and names shared by components."""
