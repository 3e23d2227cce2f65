"""The ResourceClaims behind the prepared shares: which pods reserve them, and writing usage
into their ``status.devices``.

Reads: a claim is fetched when its share is first sampled, and again (at most once per
``refresh_s``) when a process of an unknown pod runs on a GPU the claim has a share on (a shared
claim gained a pod). Writes: :class:`UsageWriter` puts the usage of a claim's shares into the
``data`` of the claim's ``status.devices`` entries (this driver's entries only; other drivers'
entries, and the ``conditions`` and ``networkData`` of ours, are kept), with an update of the
``status`` subresource guarded by the claim's ``resourceVersion``. A claim is written at most
once per ``interval_s``, and only when its usage changed beyond the thresholds of
:func:`changed`; a change of its :attr:`~kubeletplugin.usage.model.ShareMeasurement.alerts` (what it
exceeds, an escape from MPS starting or ending) is written at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from api.names import RESOURCE_GROUP, RESOURCE_VERSION
from api.shareusage import usage_data as encode_usage_data
from kubeletplugin.usage.model import PreparedShare, ShareMeasurement
from sharegpu.kube.clock import Clock
from sharegpu.kube.rest import KubeApiError, KubeRest, resource_path

log = logging.getLogger(__name__)

#: Smallest memory change written (also at least :data:`MEMORY_CHANGE_FRACTION` of the share).
DEFAULT_MEMORY_THRESHOLD: Final = 64 * 2**20
MEMORY_CHANGE_FRACTION: Final = 0.05
#: Smallest SM utilisation change written (percent points).
SM_THRESHOLD: Final = 5

ShareKey = tuple[str, str, str, str | None]


class ClaimApi(Protocol):
    """Reads a claim and replaces its status (raises :class:`KubeApiError`)."""

    def get(self, namespace: str, name: str) -> dict[str, Any]: ...

    def put_status(self, namespace: str, name: str, claim: Mapping[str, Any]) -> dict[str, Any]: ...


class KubeClaimApi:
    """:class:`ClaimApi` over ``resource.k8s.io/v1`` ResourceClaims."""

    def __init__(self, rest: KubeRest) -> None:
        self._rest = rest

    def _path(self, namespace: str, name: str) -> str:
        return resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", namespace, name)

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self._rest.get(self._path(namespace, name), expected=(404,))

    def put_status(self, namespace: str, name: str, claim: Mapping[str, Any]) -> dict[str, Any]:
        return self._rest.request(
            "PUT", self._path(namespace, name) + "/status", body=claim, expected=(404, 409)
        )


def reserved_pod_uids(claim: Mapping[str, Any]) -> frozenset[str]:
    """UIDs of the pods in the claim's ``status.reservedFor`` (malformed entries skipped)."""
    status = claim.get("status")
    refs = status.get("reservedFor") if isinstance(status, Mapping) else None
    out = set()
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("resource") == "pods" and not ref.get("apiGroup"):
            uid = ref.get("uid")
            if isinstance(uid, str) and uid:
                out.add(uid)
    return frozenset(out)


def _uid_of(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) else ""


class ClaimPods:
    """Claim UID -> UIDs of the pods reserving it, fetched lazily (see the module docstring)."""

    def __init__(self, api: ClaimApi, clock: Clock, refresh_s: float) -> None:
        self._api = api
        self._clock = clock
        self._refresh_s = refresh_s
        self._pods: dict[str, tuple[frozenset[str], float]] = {}

    def snapshot(self) -> dict[str, frozenset[str]]:
        return {uid: pods for uid, (pods, _) in self._pods.items()}

    def update(self, shares: Iterable[PreparedShare], stale: Iterable[str] = ()) -> bool:
        """Fetch claims never fetched and the ``stale`` ones not fetched within ``refresh_s``;
        forget claims without shares. True when something was fetched."""
        claims = {s.claim_uid: s for s in shares}
        for uid in list(self._pods):
            if uid not in claims:
                del self._pods[uid]
        now = self._clock.time()
        stale_set = set(stale)
        fetched = False
        for uid, share in claims.items():
            known = self._pods.get(uid)
            if known is not None and (uid not in stale_set or now - known[1] < self._refresh_s):
                continue
            try:
                claim = self._api.get(share.namespace, share.name)
            except KubeApiError as exc:
                log.warning("usage: cannot read ResourceClaim %s: %s", share.claim_label, exc)
                continue
            pods = reserved_pod_uids(claim) if _uid_of(claim) == uid else frozenset()
            self._pods[uid] = (pods, now)
            fetched = True
        return fetched


def usage_data(usage: ShareMeasurement, sampled_at: str) -> dict[str, Any]:
    """The ``data`` of the share's ``status.devices`` entry (:func:`api.shareusage.usage_data`)."""
    return encode_usage_data(usage.reported(sampled_at))


def changed(old: ShareMeasurement | None, new: ShareMeasurement, memory_threshold: int) -> bool:
    """Whether ``new`` differs from what was written (``old``) enough to write again: another
    process count, count of processes outside MPS, or :attr:`ShareMeasurement.alerts`, utilisation
    appearing, vanishing or moving by :data:`SM_THRESHOLD` points, or memory moving by the
    larger of ``memory_threshold`` and :data:`MEMORY_CHANGE_FRACTION` of the share's
    reservation."""
    if old is None:
        return True
    if (old.processes, old.outside_mps, old.alerts) != (new.processes, new.outside_mps, new.alerts):
        return True
    if (old.sm_utilization is None) != (new.sm_utilization is None):
        return True
    if (
        old.sm_utilization is not None
        and new.sm_utilization is not None
        and abs(old.sm_utilization - new.sm_utilization) >= SM_THRESHOLD
    ):
        return True
    bound = max(memory_threshold, int(new.share.memory * MEMORY_CHANGE_FRACTION))
    return abs(old.used_memory - new.used_memory) >= bound


@dataclass
class _Written:
    at: float
    usage: dict[ShareKey, ShareMeasurement]


class UsageWriter:
    """Writes usage into the claims' ``status.devices`` (see the module docstring)."""

    def __init__(
        self,
        api: ClaimApi,
        driver_name: str,
        clock: Clock,
        interval_s: float,
        memory_threshold: int = DEFAULT_MEMORY_THRESHOLD,
    ) -> None:
        self._api = api
        self._driver = driver_name
        self._clock = clock
        self._interval_s = interval_s
        self._memory_threshold = memory_threshold
        self._written: dict[str, _Written] = {}
        #: ``(ok, failed)`` writes so far (for the metrics).
        self.writes = [0, 0]

    def publish(self, usage: Mapping[ShareKey, ShareMeasurement], sampled_at: str) -> None:
        """Write each claim whose usage is due (see :func:`changed`)."""
        by_claim: dict[str, dict[ShareKey, ShareMeasurement]] = {}
        for key, u in usage.items():
            by_claim.setdefault(key[0], {})[key] = u
        for uid in [u for u in self._written if u not in by_claim]:
            del self._written[uid]
        now = self._clock.time()
        for uid, shares in by_claim.items():
            if self._due(uid, shares, now):
                self._write(uid, shares, sampled_at, now)

    def _due(self, uid: str, shares: Mapping[ShareKey, ShareMeasurement], now: float) -> bool:
        last = self._written.get(uid)
        if last is None:
            return True
        if any(
            last.usage.get(k) is None or last.usage[k].alerts != u.alerts for k, u in shares.items()
        ):
            return True
        if now - last.at < self._interval_s:
            return False
        return any(changed(last.usage.get(k), u, self._memory_threshold) for k, u in shares.items())

    def _write(
        self, uid: str, shares: Mapping[ShareKey, ShareMeasurement], sampled_at: str, now: float
    ) -> None:
        share = next(iter(shares.values())).share
        try:
            claim = self._api.get(share.namespace, share.name)
            if _uid_of(claim) != uid:
                return
            claim = dict(claim)
            status = dict(claim.get("status") or {})
            status["devices"] = self._merged(status.get("devices"), shares, sampled_at)
            claim["status"] = status
            self._api.put_status(share.namespace, share.name, claim)
        except KubeApiError as exc:
            # 409: the claim changed since the read; the next sample writes again.
            self.writes[1] += 1
            log.info("usage: not written to ResourceClaim %s: %s", share.claim_label, exc)
            return
        self.writes[0] += 1
        self._written[uid] = _Written(now, dict(shares))

    def _merged(
        self, entries: Any, shares: Mapping[ShareKey, ShareMeasurement], sampled_at: str
    ) -> list[dict[str, Any]]:
        mine = {(k[1], k[2], k[3]): u for k, u in shares.items()}
        out: list[dict[str, Any]] = []
        for entry in entries if isinstance(entries, list) else ():
            if not isinstance(entry, Mapping):
                continue
            key = (entry.get("pool"), entry.get("device"), entry.get("shareID") or None)
            if entry.get("driver") == self._driver and key in mine:
                entry = {**entry, "data": usage_data(mine.pop(key), sampled_at)}
            out.append(dict(entry))
        for (pool, device, share_id), u in mine.items():
            new: dict[str, Any] = {"driver": self._driver, "pool": pool, "device": device}
            if share_id is not None:
                new["shareID"] = share_id
            new["data"] = usage_data(u, sampled_at)
            out.append(new)
        return out
