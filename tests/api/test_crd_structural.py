"""The generated CRDs keep the structural-schema rule a real API server enforces for
int-or-string fields (kube-apiserver refused the GpuQuota CRD when the ``anyOf`` listed string
before integer; tests/e2e applies the CRDs to a real one)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from api.crd import CRD_PATH, QUOTA_CRD_PATH


def _int_or_string_nodes(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if node.get("x-kubernetes-int-or-string"):
            yield path, node
        for key, value in node.items():
            yield from _int_or_string_nodes(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _int_or_string_nodes(item, f"{path}[{i}]")


@pytest.mark.parametrize("crd_path", [CRD_PATH, QUOTA_CRD_PATH], ids=lambda p: p.name)
def test_int_or_string_fields_use_the_one_structural_form(crd_path: Any) -> None:
    crd = yaml.safe_load(crd_path.read_text())
    nodes = list(_int_or_string_nodes(crd["spec"]["versions"]))
    for path, node in nodes:
        assert "type" not in node, path
        assert node.get("anyOf", [{"type": "integer"}, {"type": "string"}]) == [
            {"type": "integer"},
            {"type": "string"},
        ], path
    if crd_path == QUOTA_CRD_PATH:
        # memory and limitsMemory of hard, used and claims.*
        assert len(nodes) == 6
