"""The documentation: the generated configuration reference is current, links resolve, the index
lists every page."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from deploy_helpers import REPO_ROOT

DOCS = REPO_ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_config_reference", DOCS / "gen_config_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markdown_files() -> list[Path]:
    files = [*DOCS.glob("*.md"), REPO_ROOT / "README.md", *REPO_ROOT.glob("examples/**/*.md")]
    return sorted(files)


def test_configuration_reference_is_current() -> None:
    expected = generator().render()
    actual = (DOCS / "configuration.md").read_text()
    assert actual == expected, (
        "docs/configuration.md is stale: run python docs/gen_config_reference.py"
    )


def test_relative_links_resolve() -> None:
    broken = []
    for page in markdown_files():
        text = re.sub(r"`[^`\n]*`", "", page.read_text())
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if not (page.parent / path).resolve().exists():
                broken.append(f"{page.relative_to(REPO_ROOT)} -> {target}")
    assert broken == []


def test_index_lists_every_page() -> None:
    index = (DOCS / "README.md").read_text()
    linked = set(LINK.findall(index))
    pages = {p.name for p in DOCS.glob("*.md") if p.name != "README.md"}
    assert pages - linked == set()
