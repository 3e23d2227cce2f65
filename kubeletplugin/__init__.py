"""The sharegpu node daemon: GPU discovery, ResourceSlice publishing, kubelet DRA plugin."""
