"""GPU discovery behind :class:`.backend.DeviceBackend` (:mod:`.nvml`, :mod:`.mock`), version
normalisation (:mod:`.versions`) and the ResourceSlice contents of each sharing mode
(:mod:`.slices`)."""
