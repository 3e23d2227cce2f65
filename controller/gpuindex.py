"""The tracker's incremental index: slices, claims and pods, by the GPUs they touch.

Every handler updates the index for one object and marks *dirty* exactly the GPU objects whose
desired content may have changed: a slice marks the GPUs of its pool (before and after), a claim
the GPUs it was and is allocated on, a pod the GPUs of the claims reserved for it. Nothing is
recomputed beyond that, so the cost of an event does not grow with the size of the cluster.

Invariants (between calls):

- ``_hardware`` and ``_devices`` hold exactly the GPUs and devices of each pool's current
  generation (:func:`controller.reconcile.newest_generation` of the pool's slices);
- ``_allocs[k]`` is :func:`controller.reconcile.claim_allocations` of claim ``k`` over the current
  hardware and pods, and ``_gpu_claims[g]`` is the set of claims with an allocation on ``g``;
- ``_pool_claims`` and ``_pod_claims`` map a pool and a pod key to the claims whose results name
  the pool or whose ``reservedFor`` names the pod;
- every GPU of ``_hardware`` carries the taints of the DeviceTaintRules of ``_rules`` that select
  its devices (:func:`controller.reconcile.with_rule_taints`); a rule marks dirty only the GPUs
  whose taints it changes.

Not thread-safe: the tracker calls it under its lock. Records are those of
:mod:`controller.records`, shared with the informers' stores (never copied).
"""

from __future__ import annotations

from collections.abc import Iterator

from controller.reconcile import (
    Alloc,
    DeviceInfo,
    GpuHardware,
    claim_allocations,
    newest_generation,
    pool_hardware,
    with_rule_taints,
)
from controller.records import AllocatedClaim, PodInfo, SliceRecord, TaintRuleRecord


class GpuIndex:
    """Inputs of the desired GPU objects, indexed for per-event updates."""

    def __init__(self, driver: str = "") -> None:
        #: The driver whose devices DeviceTaintRules are matched against.
        self.driver = driver
        self._rules: dict[str, TaintRuleRecord] = {}
        self._slices: dict[str, dict[str, SliceRecord]] = {}  # pool -> slice name -> record
        self._hardware: dict[str, GpuHardware] = {}
        self._pool_gpus: dict[str, tuple[str, ...]] = {}
        self._devices: dict[tuple[str, str], DeviceInfo] = {}
        self._pool_devices: dict[str, tuple[str, ...]] = {}
        self._claims: dict[str, AllocatedClaim] = {}
        self._allocs: dict[str, tuple[Alloc, ...]] = {}
        self._gpu_claims: dict[str, set[str]] = {}
        self._pool_claims: dict[str, set[str]] = {}
        self._pods: dict[str, PodInfo] = {}
        self._pod_claims: dict[str, set[str]] = {}
        #: GPU object names whose desired content may have changed since :meth:`take_dirty`.
        self.dirty: set[str] = set()

    # --- updates -------------------------------------------------------------------------------

    def set_slice(self, old: SliceRecord | None, new: SliceRecord | None) -> None:
        """A slice was added (``old`` None), changed, or removed (``new`` None)."""
        pools = set()
        if old is not None and old.pool is not None:
            _pop(self._slices, old.pool, old.name)
            pools.add(old.pool)
        if new is not None and new.pool is not None:
            self._slices.setdefault(new.pool, {})[new.name] = new
            pools.add(new.pool)
        for pool in sorted(pools):
            self._rebuild_pool(pool)

    def set_rule(self, key: str, new: TaintRuleRecord | None) -> None:
        """DeviceTaintRule ``key`` is now ``new`` (None: gone, malformed or without selector)."""
        old = self._rules.pop(key, None)
        if new is not None:
            self._rules[key] = new
        pools: set[str] | None = set()
        for rule in (old, new):
            pool = dict(rule.selector).get("pool") if rule is not None else None
            if rule is not None and pool is None:
                pools = None  # the rule may select devices of every pool
            elif pools is not None and pool is not None:
                pools.add(pool)
        names = (
            list(self._hardware)
            if pools is None
            else [n for p in sorted(pools) for n in self._pool_gpus.get(p, ())]
        )
        for name in names:
            hw = self._hardware[name]
            tainted = with_rule_taints(hw, self._rules.values(), self.driver)
            if tainted is not hw:
                self._hardware[name] = tainted
                self.dirty.add(name)

    def set_claim(self, key: str, new: AllocatedClaim | None) -> None:
        """Claim ``key`` (``<namespace>/<name>``) is now ``new`` (None: gone or not ours)."""
        self._forget_claim(key)
        if new is None:
            return
        self._claims[key] = new
        for r in new.results:
            self._pool_claims.setdefault(r.pool, set()).add(key)
        for pod_name, _ in new.reserved:
            self._pod_claims.setdefault(f"{new.namespace}/{pod_name}", set()).add(key)
        self._recompute_claim(key)

    def set_pod(self, key: str, new: PodInfo | None) -> None:
        """Pod ``key`` (``<namespace>/<name>``) is now ``new`` (None: gone)."""
        if new is None:
            self._pods.pop(key, None)
        else:
            self._pods[key] = new
        for claim_key in sorted(self._pod_claims.get(key, ())):
            self._recompute_claim(claim_key)

    def take_dirty(self) -> set[str]:
        """The dirty GPU names; the set is emptied."""
        dirty, self.dirty = self.dirty, set()
        return dirty

    # --- reads ---------------------------------------------------------------------------------

    def hardware(self, name: str) -> GpuHardware | None:
        """The published GPU named ``name``, None when no current slice publishes it."""
        return self._hardware.get(name)

    def allocations(self, name: str) -> list[Alloc]:
        """The allocations on GPU ``name`` (unordered)."""
        return [
            a
            for claim_key in self._gpu_claims.get(name, ())
            for a in self._allocs[claim_key]
            if a.gpu == name
        ]

    def names(self, node: str | None = None) -> Iterator[str]:
        """Names of all GPUs, or of those of ``node`` (its pool), in no particular order."""
        if node is None:
            yield from self._hardware
        else:
            yield from self._pool_gpus.get(node, ())

    def counts(self) -> dict[str, int]:
        """How many records of each kind the index holds (for benchmarks and logs)."""
        return {
            "pools": len(self._slices),
            "gpus": len(self._hardware),
            "devices": len(self._devices),
            "claims": len(self._claims),
            "allocations": sum(len(a) for a in self._allocs.values()),
            "pods": len(self._pods),
        }

    # --- internals -----------------------------------------------------------------------------

    def _rebuild_pool(self, pool: str) -> None:
        slices = newest_generation(self._slices.get(pool, {}).values()).get(pool, [])
        gpus, devices = pool_hardware(pool, slices) if slices else ({}, {})
        rules = self._rules.values()
        gpus = {n: with_rule_taints(hw, rules, self.driver) for n, hw in gpus.items()}
        for name in self._pool_gpus.pop(pool, ()):
            self._hardware.pop(name, None)
            self.dirty.add(name)
        for dev_name in self._pool_devices.pop(pool, ()):
            self._devices.pop((pool, dev_name), None)
        self._hardware.update(gpus)
        if gpus:
            self._pool_gpus[pool] = tuple(gpus)
        self._devices.update({(pool, n): d for n, d in devices.items()})
        if devices:
            self._pool_devices[pool] = tuple(devices)
        self.dirty.update(gpus)
        for claim_key in sorted(self._pool_claims.get(pool, ())):
            self._recompute_claim(claim_key)

    def _forget_claim(self, key: str) -> None:
        self._set_allocs(key, ())
        self._allocs.pop(key, None)
        old = self._claims.pop(key, None)
        if old is None:
            return
        for r in old.results:
            _discard(self._pool_claims, r.pool, key)
        for pod_name, _ in old.reserved:
            _discard(self._pod_claims, f"{old.namespace}/{pod_name}", key)

    def _recompute_claim(self, key: str) -> None:
        claim = self._claims.get(key)
        if claim is not None:
            self._set_allocs(
                key, claim_allocations(claim, self._devices, self._hardware, self._pods)
            )

    def _set_allocs(self, key: str, allocs: tuple[Alloc, ...]) -> None:
        for a in self._allocs.get(key, ()):
            _discard(self._gpu_claims, a.gpu, key)
            self.dirty.add(a.gpu)
        self._allocs[key] = allocs
        for a in allocs:
            self._gpu_claims.setdefault(a.gpu, set()).add(key)
            self.dirty.add(a.gpu)


def _pop(index: dict[str, dict[str, SliceRecord]], pool: str, name: str) -> None:
    members = index.get(pool)
    if members is not None:
        members.pop(name, None)
        if not members:
            del index[pool]


def _discard(index: dict[str, set[str]], k: str, member: str) -> None:
    """Remove ``member`` from the set ``index[k]``, dropping the set when it becomes empty."""
    members = index.get(k)
    if members is not None:
        members.discard(member)
        if not members:
            del index[k]
