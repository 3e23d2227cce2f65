"""Every example directory applies in one ``kubectl apply -f examples/<name>/``.

kubectl reads a directory's ``.json``, ``.yaml`` and ``.yml`` files in file name order (it walks
the directory like Go's ``filepath.Walk``, which sorts names bytewise) and each file's documents
in order, and creates each object before reading the next. So an object that the admission of a
later one depends on must come first: a Namespace before the objects in it, a DeviceClass before
the claims and templates that name it, a GpuQuota before the claims it charges.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.helpers import EXAMPLES_DIR, describe, load_documents

MANIFEST_SUFFIXES = (".json", ".yaml", ".yml")
CLAIM_KINDS = frozenset({"ResourceClaim", "ResourceClaimTemplate"})


def apply_order(directory: Path) -> list[dict[str, Any]]:
    """The objects of ``directory`` in the order ``kubectl apply -f <directory>/`` creates them."""
    files = sorted(
        (p for p in directory.iterdir() if p.is_file() and p.suffix in MANIFEST_SUFFIXES),
        key=lambda p: p.name.encode(),
    )
    return [doc for path in files for doc in load_documents(path.read_text())]


def _claim_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc.get("spec") or {}
    return dict(spec.get("spec") or {}) if doc["kind"] == "ResourceClaimTemplate" else dict(spec)


def device_classes_named(doc: dict[str, Any]) -> set[str]:
    """The DeviceClasses a claim or template names (exactly, or as a first-available choice)."""
    if doc["kind"] not in CLAIM_KINDS:
        return set()
    names = set()
    for request in (_claim_spec(doc).get("devices") or {}).get("requests") or []:
        for choice in [request.get("exactly") or {}, *(request.get("firstAvailable") or [])]:
            if choice.get("deviceClassName"):
                names.add(choice["deviceClassName"])
    return names


def order_problems(objects: list[dict[str, Any]]) -> list[str]:
    """Each object that ``kubectl apply`` would create before an object it depends on."""
    position = {(d["kind"], d["metadata"]["name"]): i for i, d in enumerate(objects)}
    quotas: dict[str, list[int]] = {}
    for i, d in enumerate(objects):
        if d["kind"] == "GpuQuota":
            quotas.setdefault(d["metadata"].get("namespace", ""), []).append(i)
    problems = []
    for i, doc in enumerate(objects):
        needs = []
        namespace = doc["metadata"].get("namespace")
        if namespace:
            needs.append(("Namespace", namespace))
        needs += [("DeviceClass", name) for name in sorted(device_classes_named(doc))]
        for kind, name in needs:
            at = position.get((kind, name))
            if at is not None and at > i:
                problems.append(f"{describe(doc)} comes before the {kind} {name} it needs")
        if doc["kind"] in CLAIM_KINDS and any(q > i for q in quotas.get(namespace or "", [])):
            problems.append(f"{describe(doc)} comes before the GpuQuota that charges it")
    return problems


@pytest.mark.parametrize(
    "directory", sorted(p for p in EXAMPLES_DIR.iterdir() if p.is_dir()), ids=lambda p: p.name
)
def test_each_example_directory_applies_in_one_go(directory: Path) -> None:
    objects = apply_order(directory)
    assert objects, f"{directory.name} has no manifest"
    assert order_problems(objects) == []


def test_the_order_check_sees_a_namespace_a_class_and_a_quota_applied_late() -> None:
    namespace = {"kind": "Namespace", "metadata": {"name": "team"}}
    quota = {"kind": "GpuQuota", "metadata": {"name": "q", "namespace": "team"}}
    device_class = {"kind": "DeviceClass", "metadata": {"name": "big.gpu.sharegpu.dev"}}
    claim = {
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "team"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "g", "exactly": {"deviceClassName": device_class["metadata"]["name"]}}
                ]
            }
        },
    }
    assert order_problems([namespace, device_class, quota, claim]) == []
    assert order_problems([claim, namespace, device_class, quota]) == [
        "ResourceClaim/c comes before the Namespace team it needs",
        "ResourceClaim/c comes before the DeviceClass big.gpu.sharegpu.dev it needs",
        "ResourceClaim/c comes before the GpuQuota that charges it",
    ]
    assert order_problems([quota, namespace]) == [
        "GpuQuota/q comes before the Namespace team it needs"
    ]
