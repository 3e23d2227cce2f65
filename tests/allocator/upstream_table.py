"""The upstream allocator test table (``upstream/allocator_cases.json``, Kubernetes 1.36, with
the cases of ``upstream/allocator_cases_1_37.json`` that 1.37 changed or added) and how one of
its cases runs through sharegpu's allocator.

Each case holds the claims of one pod, the DeviceClasses, ResourceSlices and node, what the
cluster already holds (``allocatedDevices``: devices in exclusive use, ``allocatedCapacity``:
capacity consumed on shared devices), the feature gates it needs, and either the allocation
results (one per claim, in claim order; results within a claim in any order) or an error
substring. ``upstream/not_applicable.json`` names the cases that test what sharegpu's
allocator deliberately lacks, each with the reason; ``upstream/error_wording.json`` gives, for
the cases whose error sharegpu words differently, the text its error must contain instead.
Malformed input is refused by sharegpu with :class:`AllocatorInputError`; that counts as the
allocation's error.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharegpu.allocator import AllocatorInputError, allocate_pod, seeded_share_ids

UPSTREAM = Path(__file__).parent / "upstream"
CASES_FILE = UPSTREAM / "allocator_cases.json"
#: Cases as Kubernetes 1.37 has them: each replaces the 1.36 case of its name, or is new.
CASES_1_37_FILE = UPSTREAM / "allocator_cases_1_37.json"
NOT_APPLICABLE_FILE = UPSTREAM / "not_applicable.json"
WORDING_FILE = UPSTREAM / "error_wording.json"
#: kube-scheduler's test replaces every shareID by this value before comparing.
FIXED_SHARE_ID = "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"

Obj = dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    """Whether sharegpu's result agrees with the case; ``detail`` says how it differs."""

    ok: bool
    detail: str = ""


def load_cases() -> list[Obj]:
    """Every case of the table, in table order: a 1.36 case that 1.37 changed in its 1.37
    form, then the cases new in 1.37."""
    data: Obj = json.loads(CASES_FILE.read_text(encoding="utf-8"))
    newer = {c["name"]: c for c in load_cases_1_37()}
    cases: list[Obj] = [newer.pop(c["name"], c) for c in data["cases"]]
    return cases + list(newer.values())


def load_cases_1_37() -> list[Obj]:
    """The cases of ``allocator_cases_1_37.json``."""
    data: Obj = json.loads(CASES_1_37_FILE.read_text(encoding="utf-8"))
    cases: list[Obj] = data["cases"]
    return cases


def load_not_applicable() -> dict[str, str]:
    """Case name -> why sharegpu's allocator does not model what the case tests."""
    data: dict[str, str] = json.loads(NOT_APPLICABLE_FILE.read_text(encoding="utf-8"))["cases"]
    return data


def load_wording() -> dict[str, str]:
    """Case name -> the text sharegpu's error contains instead of the upstream substring."""
    data: dict[str, Obj] = json.loads(WORDING_FILE.read_text(encoding="utf-8"))["cases"]
    return {name: str(entry["error"]) for name, entry in data.items()}


def category(case: Obj) -> str:
    """The feature gates the case needs (``core`` when none), as its pass-count bucket."""
    features: list[str] = case.get("features") or []
    return "+".join(sorted(features)) or "core"


def allocated_claims(case: Obj) -> list[Obj]:
    """The cluster's holdings as allocated claims: one claim per exclusively used device, one
    per device with consumed capacity (a share holding that capacity) and one per share ID
    held without a capacity entry (``allocatedSharedDeviceIDs``: the device counts as
    allocated, so its counters are consumed)."""
    claims: list[Obj] = []
    with_capacity = set(case.get("allocatedCapacity") or {})
    for i, shared_id in enumerate(case.get("allocatedSharedDeviceIDs") or []):
        driver, pool, device, share_id = shared_id.split("/")
        if f"{driver}/{pool}/{device}" in with_capacity:
            continue  # the share below holds it
        share = {"request": "r", "driver": driver, "pool": pool, "device": device}
        claims.append(_held(f"share-{i}", [{**share, "shareID": share_id}]))
    for i, device_id in enumerate(case.get("allocatedDevices") or []):
        driver, pool, device = device_id.split("/")
        result = {"request": "r", "driver": driver, "pool": pool, "device": device}
        claims.append(_held(f"held-{i}", [result]))
    for i, (device_id, consumed) in enumerate((case.get("allocatedCapacity") or {}).items()):
        driver, pool, device = device_id.split("/")
        share = {
            "request": "r",
            "driver": driver,
            "pool": pool,
            "device": device,
            "shareID": f"00000000-0000-4000-8000-{i:012d}",
            "consumedCapacity": dict(consumed),
        }
        claims.append(_held(f"shared-{i}", [share]))
    return claims


def _held(name: str, results: list[Obj]) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "held"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def _normalise_result(result: Obj) -> str:
    out = {k: v for k, v in result.items() if v not in (None, [], {})}
    if "shareID" in out:
        out["shareID"] = FIXED_SHARE_ID
    if out.get("adminAccess") is False:
        del out["adminAccess"]
    return json.dumps(out, sort_keys=True)


def _normalise_selector(selector: Obj | None) -> Any:
    if not selector:
        return None
    terms = []
    for term in selector.get("nodeSelectorTerms") or []:
        norm = {}
        for part in ("matchExpressions", "matchFields"):
            reqs = sorted(
                json.dumps({**r, "values": sorted(r.get("values") or [])}, sort_keys=True)
                for r in term.get(part) or []
            )
            if reqs:
                norm[part] = reqs
        terms.append(json.dumps(norm, sort_keys=True))
    return sorted(terms)


def _normalise_allocation(allocation: Obj) -> Obj:
    devices = allocation.get("devices") or {}
    return {
        "results": sorted(Counter(_normalise_result(r) for r in devices.get("results") or [])),
        "config": devices.get("config") or [],
        "nodeSelector": _normalise_selector(allocation.get("nodeSelector")),
    }


def run_case(case: Obj) -> Verdict:
    """Allocate the case's claims jointly and compare with the expected outcome."""
    node = case["node"]
    try:
        outcomes = allocate_pod(
            case["claims"],
            case["slices"],
            case["classes"],
            allocated_claims(case),
            node["name"],
            node_labels=node["labels"],
            share_ids=seeded_share_ids(0),
        )
    except AllocatorInputError as exc:
        outcomes = []
        errors = [str(exc)]
    else:
        errors = [o.error for o in outcomes if o.error is not None]
    if "expectError" in case:
        want = str(load_wording().get(case["name"], case["expectError"]))
        if not errors:
            return Verdict(False, f"expected error containing {want!r}, got none")
        if not any(want in e for e in errors):
            return Verdict(False, f"expected error containing {want!r}, got {errors}")
        return Verdict(True)
    if errors:
        return Verdict(False, f"unexpected error {errors}")
    expected: list[Obj] = case["expectResults"]
    if not expected:
        got = [o.allocation for o in outcomes if o.allocation is not None]
        return Verdict(not got, f"expected no allocation, got {got}")
    if len(outcomes) != len(expected) or any(o.allocation is None for o in outcomes):
        return Verdict(False, "expected an allocation, got none")
    for i, (outcome, want_alloc) in enumerate(zip(outcomes, expected, strict=True)):
        assert outcome.allocation is not None
        got_norm = _normalise_allocation(outcome.allocation)
        want_norm = _normalise_allocation(want_alloc)
        if got_norm != want_norm:
            return Verdict(False, f"claim #{i}: expected {want_norm}, got {got_norm}")
    return Verdict(True)
