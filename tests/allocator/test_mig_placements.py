"""Dynamic MIG: what the allocator accepts on the published slices is exactly what the hardware
rule (:func:`kubeletplugin.devices.migtables.placement_problem`) accepts.

The slices are the kubelet plugin's own (an H100 80GB and an A100 40GB in MIG mode, ``--mig
dynamic``); claims pick a profile with a CEL selector on the ``profile`` attribute, or one
placement with ``placementStart`` too. Every allocation the allocator makes must be a placement
the GPU can create next to the ones before it, and whenever some placement of the profile fits,
the allocator must find one (no false refusal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api import names
from api.quantity import quantity_int
from kubeletplugin.devices import migtables
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.slices import desired_slices, resource_slice_objects
from kubeletplugin.devices.table import NodeDevices, node_devices
from kubeletplugin.model import MigPlacement, MigProfile
from sharegpu.allocator import Allocator, seeded_share_ids
from tests.allocator.helpers import DRIVER, claim, device_class, exactly

NODE = "n1"
CLASSES = [device_class()]
TABLES = {"H100": migtables.H100_80GB, "A100": migtables.A100_40GB}
PRODUCTS = {"H100": migtables.H100_80GB_PRODUCT, "A100": migtables.A100_40GB_PRODUCT}

Obj = dict[str, Any]
Instance = tuple[int, MigPlacement]


@cache
def gpu_table(gpu: str) -> NodeDevices:
    """The device table of one GPU of kind ``gpu`` in MIG mode under ``--mig dynamic``."""
    base = MockBackend(NODE, count=1).discover()[0]
    mig = dataclasses.replace(
        base, product_name=PRODUCTS[gpu], mig_mode="Enabled", mig_profiles=TABLES[gpu]
    )
    return node_devices(
        [mig], names.SHARING_MODE_PARTITIONS, mig_strategy=names.MIG_STRATEGY_DYNAMIC
    )


@cache
def _slices(gpu: str) -> tuple[Obj, ...]:
    objects = resource_slice_objects(desired_slices(gpu_table(gpu)), DRIVER, NODE, None, 1)
    for obj in objects:
        obj["metadata"]["name"] = obj["metadata"].pop("generateName") + "x"
    return tuple(objects)


def slices(gpu: str) -> list[Obj]:
    return list(_slices(gpu))


def instance_of(gpu: str, device: str) -> Instance:
    """(profile id, placement) of placement device ``device``."""
    d = gpu_table(gpu)[device]
    assert d.mig_profile is not None and d.placement is not None
    return d.mig_profile.profile_id, d.placement


def profile_named(gpu: str, name: str) -> MigProfile:
    return next(p for p in TABLES[gpu] if p.name == name)


def selector(profile: str, start: int | None = None) -> list[str]:
    attrs = f'device.attributes["{DRIVER}"]'
    exprs = [f'{attrs}.profile == "{profile}"']
    if start is not None:
        exprs.append(f"{attrs}.placementStart == {start}")
    return exprs


def profile_claim(i: int, profile: str, start: int | None = None) -> Obj:
    return claim(f"c{i}", [exactly("mig", count=1, selectors=selector(profile, start))])


def fits_somewhere(gpu: str, existing: Sequence[Instance], profile: MigProfile) -> bool:
    return any(
        migtables.placement_problem(TABLES[gpu], existing, profile.profile_id, p) is None
        for p in profile.placements
    )


class Node:
    """One GPU's slices and the allocator holding what was allocated on them so far."""

    def __init__(self, gpu: str) -> None:
        self.gpu = gpu
        self.allocator = Allocator(slices(gpu), CLASSES, (), NODE, None, seeded_share_ids(1))
        self.existing: list[Instance] = []
        self.count = 0

    def request(self, profile: str, start: int | None = None) -> str | None:
        """Allocate one claim for ``profile`` (at ``start``); the device name or None.
        Checks the pick against the hardware rule and keeps it."""
        self.count += 1
        c = profile_claim(self.count, profile, start)
        outcome = self.allocator.allocate(c)
        if outcome.allocation is None:
            return None
        (result,) = outcome.allocation["devices"]["results"]
        device = str(result["device"])
        pid, placement = instance_of(self.gpu, device)
        assert profile_named(self.gpu, profile).profile_id == pid
        problem = migtables.placement_problem(TABLES[self.gpu], self.existing, pid, placement)
        assert problem is None, f"allocator picked {device} next to {self.existing}: {problem}"
        self.allocator.commit(c, outcome.allocation)
        self.existing.append((pid, placement))
        return device

    def probe(self, profile: str, start: int) -> bool:
        """Whether the allocator would allocate ``profile`` at ``start`` now (not kept)."""
        outcome = self.allocator.allocate(profile_claim(10_000, profile, start))
        return outcome.allocation is not None


# --- the counters alone, every reachable state -------------------------------------------------


def counter_values(objects: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    return {
        c["name"]: {k: quantity_int(v["value"]) for k, v in c["counters"].items()}
        for s in objects
        for c in s["spec"].get("sharedCounters", [])
    }


def consumption(objects: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[str, str, int]]]:
    return {
        d["name"]: [
            (e["counterSet"], k, quantity_int(v["value"]))
            for e in d["consumesCounters"]
            for k, v in e["counters"].items()
        ]
        for s in objects
        for d in s["spec"].get("devices", [])
    }


def reachable_states(profiles: Sequence[MigProfile]) -> set[frozenset[Instance]]:
    """Every set of GPU instances the hardware rule lets one create, one after another."""
    every = [(p.profile_id, pl) for p in profiles for pl in p.placements]
    seen: set[frozenset[Instance]] = {frozenset()}
    frontier = [frozenset[Instance]()]
    while frontier:
        following = []
        for state in frontier:
            for inst in every:
                if inst in state:
                    continue
                if migtables.placement_problem(profiles, list(state), *inst) is None:
                    bigger = state | {inst}
                    if bigger not in seen:
                        seen.add(bigger)
                        following.append(bigger)
        frontier = following
    return seen


@pytest.mark.parametrize("gpu", sorted(TABLES))
def test_counters_accept_exactly_what_the_hardware_rule_accepts(gpu: str) -> None:
    """For every reachable set of instances and every placement device: the device's counter
    consumption fits what the set leaves of the published counters iff placement_problem
    accepts the placement next to the set."""
    objects = slices(gpu)
    values = counter_values(objects)
    consumes = consumption(objects)
    by_instance = {instance_of(gpu, name): name for name in consumes}
    states = reachable_states(TABLES[gpu])
    assert len(states) > 1000
    for state in states:
        left = {s: dict(c) for s, c in values.items()}
        for inst in state:
            for set_name, counter, value in consumes[by_instance[inst]]:
                left[set_name][counter] -= value
        for inst, device in by_instance.items():
            fits = all(left[s][c] >= v for s, c, v in consumes[device])
            rule = migtables.placement_problem(TABLES[gpu], list(state), *inst)
            assert fits == (rule is None), (sorted(state), device, rule)


# --- the allocator ----------------------------------------------------------------------------


def profile_sequences(gpu: str) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from([p.name for p in TABLES[gpu]]), min_size=1, max_size=10)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(sorted(TABLES)).flatmap(lambda g: st.tuples(st.just(g), profile_sequences(g)))
)
def test_allocator_agrees_with_the_hardware_rule(case: tuple[str, list[str]]) -> None:
    """Every pick is a placement the GPU can create; a refusal only when no placement of the
    profile fits; and at the end, each placement is allocatable iff the rule accepts it."""
    gpu, profiles = case
    node = Node(gpu)
    for name in profiles:
        before = list(node.existing)
        fits = fits_somewhere(gpu, before, profile_named(gpu, name))
        device = node.request(name)
        assert (device is not None) == fits, (name, before)
    for profile in TABLES[gpu]:
        for placement in profile.placements:
            rule = migtables.placement_problem(
                TABLES[gpu], node.existing, profile.profile_id, placement
            )
            assert node.probe(profile.name, placement.start) == (rule is None), (
                profile.name,
                placement,
                node.existing,
            )


def fill(gpu: str, *profiles: str) -> tuple[Node, list[str | None]]:
    node = Node(gpu)
    return node, [node.request(p) for p in profiles]


def test_seven_1g_10gb_fit_an_eighth_does_not() -> None:
    _, devices = fill("H100", *["1g.10gb"] * 8)
    assert devices[7] is None
    assert sorted(d for d in devices if d) == [f"gpu-0-mig-1g-10gb-{k}" for k in range(7)]


def test_4g_and_3g_fit_together() -> None:
    _, devices = fill("H100", "4g.40gb", "3g.40gb", "1g.10gb")
    assert devices == ["gpu-0-mig-4g-40gb-0", "gpu-0-mig-3g-40gb-4", None]


def test_1g_10gb_me_only_once() -> None:
    _, devices = fill("H100", "1g.10gb+me", "1g.10gb+me", "1g.10gb")
    assert devices[0] is not None and devices[1] is None and devices[2] is not None


def test_two_3g_40gb_fit_then_no_1g() -> None:
    _, devices = fill("H100", "3g.40gb", "3g.40gb", "1g.10gb", "1g.20gb")
    assert devices == ["gpu-0-mig-3g-40gb-0", "gpu-0-mig-3g-40gb-4", None, None]


def test_four_1g_20gb_fill_the_memory() -> None:
    _, devices = fill("H100", *["1g.20gb"] * 5, "1g.10gb")
    assert sorted(d for d in devices if d) == [f"gpu-0-mig-1g-20gb-{k}" for k in (0, 2, 4, 6)]
    assert devices[4] is None and devices[5] is None


def test_7g_takes_the_whole_gpu() -> None:
    _, devices = fill("A100", "7g.40gb", "1g.5gb")
    assert devices == ["gpu-0-mig-7g-40gb-0", None]


def test_after_a_4g_only_placements_from_4_fit_a_1g() -> None:
    node, _ = fill("H100", "4g.40gb")
    allowed = [s for s in range(7) if node.probe("1g.10gb", s)]
    assert allowed == [4, 5, 6]


def test_compute_slices_bound_what_memory_slices_would_allow() -> None:
    """Three 2g.20gb use 6 of 7 compute slices and memory slices 0-5: a 1g.20gb at 6 has the
    memory (slices 6-7) and the compute slice, but a second 1g does not fit anywhere."""
    _, devices = fill("H100", "2g.20gb", "2g.20gb", "2g.20gb", "1g.20gb", "1g.10gb")
    assert devices[3] == "gpu-0-mig-1g-20gb-6" and devices[4] is None
