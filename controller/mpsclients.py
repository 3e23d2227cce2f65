"""Which allocations are MPS shares, and the UIDs their clients run as.

An MPS control daemon serves one UID at a time: it starts one server for the UID of its first
client, and a client of another UID is queued (no answer, no error) until every client of the
running UID has exited. The node plugin runs one daemon per claim and GPU, so the pods of one
claim that run as different UIDs wait on each other. This module finds such claims from what
the controller sees:

- :func:`mps_verdict`: whether a result is an MPS share, resolved as the node plugin resolves it
  (:meth:`api.gpuconfig.DriverConfigs.resolve` with :func:`api.sharepolicy.configured_as_share`).
  True or False only when sure; None when the configuration leaves it to a fact the controller
  does not have, unless the node plugin's own measurement of the share (an MPS share's usage
  carries ``processesOutsideMPS``) says it is one. Callers warn only on True.
- :func:`client_users`: the effective UID of every container of the reserving pods that uses the
  allocation (the container's ``runAsUser``, else the pod's; None when neither sets one: the
  image's user, which only the node sees, so it is never guessed).
- :func:`distinct_users`: the known UIDs in the order of ``reservedFor`` (the first is the
  UID of the first reserving pod that sets one).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from api.sharepolicy import configured_as_share
from controller.records import AllocatedClaim, PodInfo, PublishedDevice, ResultRecord

#: What happens to clients of several UIDs, and the fix (the Events and ``sharegpu validate``
#: say it).
QUEUE_RULE: Final = (
    "MPS serves one UID at a time per claim: clients of another UID are queued (their CUDA "
    "calls wait, without an error) until every client of the running UID exits; run the pods "
    "of a shared claim as one runAsUser"
)

#: One client container: ``(pod name, pod uid, container name, runAsUser or None)``.
Client = tuple[str, str, str, int | None]


def mps_verdict(
    result: ResultRecord, device: PublishedDevice, cores: int, memory: int
) -> bool | None:
    """Whether ``result`` (on ``device``, holding ``cores`` and ``memory``) is served by an MPS
    daemon on its node: True or False when sure, None when unknown (module text)."""
    if result.admin_access or result.mps is None:
        return False  # admin access is not enforced; an invalid config is refused by the node
    if device.has_parent and not device.partition:
        return False  # a MIG device: the node refuses every strategy but Exclusive
    as_share, as_whole = result.mps
    verdict: bool | None = as_share
    if as_share != as_whole:
        if device.memory is None:
            verdict = None
        else:
            shared = configured_as_share(
                share_id=result.share_id is not None,
                partition=device.partition,
                cores=cores,
                memory=memory,
                memory_usable=device.memory,
            )
            verdict = as_share if shared else as_whole
    if not verdict and result.usage is not None and result.usage.outside_mps is not None:
        return True  # the node plugin judged it an MPS share
    return verdict


def client_users(
    claim: AllocatedClaim, request: str, pods: Mapping[str, PodInfo]
) -> tuple[Client, ...]:
    """The containers of the claim's reserving pods that use ``request``, with their effective
    UIDs, in ``reservedFor`` order (containers by name within a pod). A pod the informer has not
    seen, or whose UID differs from the reservation's, contributes nothing."""
    out: list[Client] = []
    for pod_name, uid in claim.reserved:
        info = pods.get(f"{claim.namespace}/{pod_name}")
        if info is None or (uid and info.uid != uid):
            continue
        for container in info.containers_for(claim.name, request):
            out.append((pod_name, uid or info.uid, container, info.run_as_user(container)))
    return tuple(out)


def distinct_users(clients: Iterable[Client]) -> tuple[int, ...]:
    """The known UIDs among ``clients``, each once, in the order they first appear."""
    seen: dict[int, None] = {}
    for _, _, _, user in clients:
        if user is not None:
            seen.setdefault(user, None)
    return tuple(seen)
