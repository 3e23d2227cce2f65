"""The layer contracts in pyproject.toml cover the whole tree, so no package escapes the rule.

``lint-imports`` (part of ``make lint``) checks the imports against the contracts; these tests
check the contracts themselves: a new package under ``sharegpu/``, ``sharegpuctl/`` or
``kubeletplugin/`` that no layer names would otherwise be free to import anything.
"""

from __future__ import annotations

import ast
import tomllib
from typing import Any

from tests.paths import REPO_ROOT


def _importlinter() -> dict[str, Any]:
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    section: dict[str, Any] = config["tool"]["importlinter"]
    return section


def _contract(contract_id: str) -> dict[str, Any]:
    contracts = {c["id"]: c for c in _importlinter()["contracts"]}
    return contracts[contract_id]


def _layer_names(layers: list[str]) -> set[str]:
    return {name.strip() for layer in layers for name in layer.replace(":", "|").split("|")}


def _packages(parent: str) -> set[str]:
    return {
        f"{parent}.{p.name}"
        for p in (REPO_ROOT / parent).iterdir()
        if p.is_dir() and (p / "__init__.py").exists()
    }


def test_root_packages_are_the_five_top_level_folders() -> None:
    assert sorted(_importlinter()["root_packages"]) == [
        "api",
        "controller",
        "kubeletplugin",
        "sharegpu",
        "sharegpuctl",
    ]


def test_every_sharegpu_package_and_both_daemons_have_a_top_level_layer() -> None:
    named = _layer_names(_contract("top-level-layers")["layers"])
    assert _packages("sharegpu") | {"api", "kubeletplugin", "controller", "sharegpuctl"} == named


def test_the_shared_libraries_import_nothing_above_them() -> None:
    contract = _contract("shared-libraries-below-daemons")
    assert contract["type"] == "forbidden"
    assert contract["source_modules"] == ["sharegpu"]
    assert sorted(contract["forbidden_modules"]) == ["controller", "kubeletplugin", "sharegpuctl"]


def test_the_command_contract_names_every_module_and_package() -> None:
    contract = _contract("sharegpuctl-layers")
    assert contract["containers"] == ["sharegpuctl"]
    assert contract["exhaustive"] is True
    named = {f"sharegpuctl.{n}" for n in _layer_names(contract["layers"])}
    modules = {
        f"sharegpuctl.{p.stem}"
        for p in (REPO_ROOT / "sharegpuctl").glob("*.py")
        if p.stem not in {"__init__", "__main__"}
    }
    assert modules | _packages("sharegpuctl") == named


def test_the_node_plugin_contract_names_every_module_and_package() -> None:
    contract = _contract("kubeletplugin-stages")
    assert contract["containers"] == ["kubeletplugin"]
    assert contract["exhaustive"] is True
    named = {f"kubeletplugin.{n}" for n in _layer_names(contract["layers"])}
    modules = {
        f"kubeletplugin.{p.stem}"
        for p in (REPO_ROOT / "kubeletplugin").glob("*.py")
        if p.stem not in {"__init__", "__main__"}
    }
    assert modules | _packages("kubeletplugin") == named


def test_every_strategy_module_is_reached_only_through_the_registry() -> None:
    """A new strategy module is one of the independent strategy layers, and the enforcer and
    the checkpoint may not import it directly (docs/architecture.md, "Adding a strategy")."""
    folder = REPO_ROOT / "kubeletplugin" / "sharing" / "strategies"
    strategies = {p.stem for p in folder.glob("*.py")} - {"__init__", "base", "registry"}
    layers = _contract("sharing-strategies")
    assert layers["containers"] == ["kubeletplugin.sharing.strategies"]
    assert layers["exhaustive"] is True
    assert [_layer_names([layer]) for layer in layers["layers"]] == [
        {"registry"},
        strategies,
        {"base"},
    ]
    forbidden = _contract("strategies-through-the-registry")["forbidden_modules"]
    assert {f"kubeletplugin.sharing.strategies.{s}" for s in strategies} <= set(forbidden)


#: Test folders that are not a package's: data, the chart, the docs, the end-to-end run, the
#: examples, the real-GPU harness and the differential oracle.
_NON_PACKAGE_TEST_FOLDERS = {"data", "deploy", "docs", "e2e", "examples", "gpu", "oracle"}


def _test_packages(folder: str) -> set[str]:
    """The test packages (folders with ``__init__.py``) directly in ``tests/<folder>``."""
    root = REPO_ROOT / "tests" / folder
    return {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def test_the_test_folders_mirror_the_packages() -> None:
    """The layout docs/development.md states: ``tests/<top-level folder>/<package>``, and for
    the shared libraries of ``sharegpu/`` their own name."""
    libraries = {p.rsplit(".", 1)[1] for p in _packages("sharegpu")}
    tops = {"api", "controller", "kubeletplugin", "sharegpuctl"}
    assert _test_packages("") - _NON_PACKAGE_TEST_FOLDERS == tops | libraries
    for top in ("kubeletplugin", "sharegpuctl"):
        assert _test_packages(top) == {p.rsplit(".", 1)[1] for p in _packages(top)}


def test_test_modules_never_import_one_another() -> None:
    """What several tests use lives in helper modules (docs/development.md)."""
    offenders = []
    for path in (REPO_ROOT / "tests").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_"):
                    offenders.append(f"{path.relative_to(REPO_ROOT)}: {name}")
    assert offenders == []
