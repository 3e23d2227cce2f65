"""The generic kubelet DRA plugin kit: the gRPC server on kubelet's sockets, the DRA (v1,
v1beta1) and device-health services, plugin registration, socket handling and the generated
protobuf code. The driver plugs in through :class:`.preparer.ClaimPreparer` and
:class:`.healthservice.HealthSource`; nothing here knows about GPUs."""
