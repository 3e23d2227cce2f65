"""Static checks of ResourceClaims, templates and DeviceClasses against this driver's rules,
shared by the admission webhook and ``sharegpu validate`` (:mod:`.checks`). Pure: no I/O."""
