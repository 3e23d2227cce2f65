"""Multi-GPU claims constrained to one NVLink domain (examples/multi-gpu-nvlink) on the slices the
plugin publishes for mock boards: an NVSwitch board, a PCIe board with bridged pairs and a board
of two NVLink quads. sharegpu's allocator keeps each claim on one domain and explains why a claim
cannot fit; Kubernetes' own allocator (the Go oracle, where it can be built) gives the same
answers on the same cases."""

from __future__ import annotations

from typing import Any

import pytest

from api import names
from kubeletplugin.devices.mock import gpu_from_entry
from kubeletplugin.devices.slices import desired_slices, resource_slice_objects
from kubeletplugin.devices.table import node_devices
from sharegpu.allocator import allocate_many, allocate_pod
from tests.allocator.helpers import DRIVER, device_class
from tests.deploy.helpers import load_documents
from tests.oracle import upstream
from tests.oracle.compare import allocation_outcome, compare, sharegpu_answer
from tests.paths import EXAMPLES_DIR

NODE = "n1"
CLASSES = [device_class()]
ATTR = f"{DRIVER}/{names.ATTR_NVLINK_DOMAIN}"


def board(domains: list[str | None], mode: str = names.SHARING_MODE_CONSUMABLE) -> list[Any]:
    """The slices of a node whose GPU ``i`` is in NVLink domain ``domains[i]``."""
    gpus = [
        gpu_from_entry(NODE, i, len(domains), {"nvlinkDomain": d}) for i, d in enumerate(domains)
    ]
    objects = resource_slice_objects(
        desired_slices(node_devices(gpus, mode)), DRIVER, NODE, None, 1
    )
    for i, obj in enumerate(objects):
        obj["metadata"]["name"] = obj["metadata"]["generateName"] + f"{i:05d}"
    return objects


NVSWITCH = ["nvswitch"] * 8
PAIRS = [f"pair-{i // 2}" for i in range(8)]
QUADS = [f"quad-{i // 4}" for i in range(8)]


def example_claim(name: str) -> dict[str, Any]:
    """The example's claim template ``name`` as kube-scheduler sees its claim."""
    docs = load_documents((EXAMPLES_DIR / "multi-gpu-nvlink" / "multi-gpu-nvlink.yaml").read_text())
    (template,) = [
        d for d in docs if d["kind"] == "ResourceClaimTemplate" and d["metadata"]["name"] == name
    ]
    return {"metadata": {"name": name, "namespace": "default"}, "spec": template["spec"]["spec"]}


def holder(index: int) -> dict[str, Any]:
    """A claim of the whole GPU ``index`` (so its domain has one GPU less)."""
    selector = f"device.attributes['{DRIVER}'].index == {index}"
    return {
        "metadata": {"name": f"holds-{index}", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "g",
                        "exactly": {
                            "deviceClassName": CLASSES[0]["metadata"]["name"],
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }


def domains_of(slices: list[Any], results: list[dict[str, Any]]) -> list[str]:
    by_name = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
    return [by_name[r["device"]]["attributes"][names.ATTR_NVLINK_DOMAIN]["string"] for r in results]


def allocated(claims: list[dict[str, Any]], slices: list[Any]) -> list[list[dict[str, Any]]]:
    """Each claim allocated in turn (one pod each), its results; fails on one that does not fit."""
    found = []
    for outcome in allocate_many(claims, slices, CLASSES, node=NODE):
        assert outcome.allocation is not None, outcome.error or outcome.reports
        found.append(outcome.allocation["devices"]["results"])
    return found


def test_an_nvswitch_board_takes_both_claims_of_the_example() -> None:
    slices = board(NVSWITCH)
    two, four = allocated(
        [example_claim("two-nvlink-gpus"), example_claim("four-nvlink-gpus")], slices
    )
    devices = [r["device"] for r in two + four]
    assert len(devices) == len(set(devices)) == 6
    assert set(domains_of(slices, two + four)) == {"nvswitch"}


@pytest.mark.parametrize("mode", [names.SHARING_MODE_CONSUMABLE, names.SHARING_MODE_EXCLUSIVE])
def test_two_gpus_on_bridged_pairs_take_one_whole_pair(mode: str) -> None:
    slices = board(PAIRS, mode)
    _, two = allocated([holder(0), example_claim("two-nvlink-gpus")], slices)
    # gpu-1 is free but its pair is not: the claim skips to the next whole pair
    assert [r["device"] for r in two] == ["gpu-2", "gpu-3"]
    assert domains_of(slices, two) == ["pair-1", "pair-1"]


def test_four_gpus_do_not_fit_on_bridged_pairs_and_the_explanation_says_why() -> None:
    slices = board(PAIRS)
    (outcome,) = allocate_pod([example_claim("four-nvlink-gpus")], slices, CLASSES, node=NODE)
    assert outcome.allocation is None
    (report,) = outcome.reports
    assert f"matchAttribute {ATTR}: 4 devices must share one value, at most 2 eligible do" in (
        report.summary
    )


def test_four_gpus_take_the_quad_that_is_whole() -> None:
    slices = board(QUADS)
    _, four = allocated([holder(1), example_claim("four-nvlink-gpus")], slices)
    assert [r["device"] for r in four] == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]


def test_gpus_without_nvlink_are_never_picked() -> None:
    slices = board([None, None, "pair-0", "pair-0"])
    (two,) = allocated([example_claim("two-nvlink-gpus")], slices)
    assert [r["device"] for r in two] == ["gpu-2", "gpu-3"]
    (outcome,) = allocate_pod([example_claim("four-nvlink-gpus")], slices, CLASSES, node=NODE)
    assert outcome.allocation is None


# --- Kubernetes' allocator on the same cases -----------------------------------------------------

CASES = {
    "nvswitch-2-then-4": (
        NVSWITCH,
        [example_claim("two-nvlink-gpus"), example_claim("four-nvlink-gpus")],
    ),
    "pairs-held-gpu-0-then-2": (PAIRS, [holder(0), example_claim("two-nvlink-gpus")]),
    "pairs-4": (PAIRS, [example_claim("four-nvlink-gpus")]),
    "quads-held-gpu-1-then-4": (QUADS, [holder(1), example_claim("four-nvlink-gpus")]),
    "no-nvlink-on-two-then-4": (
        [None, None, "pair-0", "pair-0"],
        [example_claim("four-nvlink-gpus")],
    ),
}


def oracle_case(case_id: str) -> dict[str, Any]:
    domains, claims = CASES[case_id]
    return {
        "id": case_id,
        "kind": "allocate",
        "node": {"metadata": {"name": NODE, "labels": {}}},
        "slices": board(domains),
        "classes": CLASSES,
        "allocatedClaims": [],
        "claims": claims,
        "sequence": len(claims) > 1,
    }


@pytest.mark.timeout(1200)
def test_kubernetes_allocator_agrees() -> None:
    try:
        upstream.ensure_built()
    except upstream.OracleUnavailable as exc:
        pytest.skip(f"differential oracle unavailable: {exc}")
    cases = [oracle_case(c) for c in CASES]
    answers = upstream.ask(cases)
    outcomes = {c["id"]: allocation_outcome(a) for c, a in zip(cases, answers, strict=True)}
    assert outcomes == {
        "nvswitch-2-then-4": "allocated",
        "pairs-held-gpu-0-then-2": "allocated",
        "pairs-4": "unsatisfiable",
        "quads-held-gpu-1-then-4": "allocated",
        "no-nvlink-on-two-then-4": "unsatisfiable",
    }
    disagreements = [
        d.describe()
        for case, answer in zip(cases, answers, strict=True)
        for d in compare(case["id"], "allocate", answer, sharegpu_answer(case))
    ]
    assert not disagreements, "\n".join(disagreements)
