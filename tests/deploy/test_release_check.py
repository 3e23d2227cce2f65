"""``make release-check`` (deploy/release_check.py): on this checkout every version agrees with
api/version.py; a chart, pyproject, changelog or image tag that disagrees is named."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from api.version import VERSION
from tests.paths import REPO_ROOT

pytestmark = pytest.mark.helm


def release_check() -> ModuleType:
    """deploy/release_check.py, a script outside the packages, loaded as a module."""
    spec = importlib.util.spec_from_file_location(
        "release_check", REPO_ROOT / "deploy" / "release_check.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("release_check", module)
    spec.loader.exec_module(module)
    return module


RC = release_check()


def copy_of_release_files(tmp_path: Path) -> Path:
    """A root with the chart, pyproject.toml and CHANGELOG.md of this checkout (no Makefile)."""
    root = tmp_path / "root"
    shutil.copytree(REPO_ROOT / "deploy" / "helm" / "sharegpu", root / "deploy/helm/sharegpu")
    for name in ("pyproject.toml", "CHANGELOG.md"):
        shutil.copy(REPO_ROOT / name, root / name)
    return root


def test_this_checkout_agrees(helm: str, tmp_path: Path) -> None:
    results = dict(RC.check(REPO_ROOT, helm, tmp_path / "out"))
    assert {name: problems for name, problems in results.items() if problems} == {}
    assert (tmp_path / "out" / f"sharegpu-{VERSION}.tgz").is_file()
    # Every check ran, the image tag of `make image` once the Makefile has that target.
    assert len(results) == 6


def test_a_chart_of_another_version_is_named_everywhere_it_shows(helm: str, tmp_path: Path) -> None:
    root = copy_of_release_files(tmp_path)
    chart_file = root / "deploy/helm/sharegpu/Chart.yaml"
    chart = yaml.safe_load(chart_file.read_text())
    chart["appVersion"] = "9.9.9"
    chart_file.write_text(yaml.safe_dump(chart))
    results = dict(RC.check(root, helm, tmp_path / "out"))
    assert results["chart version and appVersion"] == [
        f"Chart.yaml: appVersion is '9.9.9', not {VERSION!r}"
    ]
    assert results[f"helm package sharegpu-{VERSION}.tgz"] == [
        f"sharegpu-{VERSION}.tgz: appVersion is '9.9.9', not {VERSION!r}"
    ]
    rendered = results["image the chart renders"]
    assert rendered and all(
        p.endswith(f"runs sharegpu:9.9.9, not sharegpu:{VERSION}") for p in rendered
    )
    assert results["image tag of make image"] is None  # no Makefile in the copy: skipped


def test_pyproject_must_read_the_version_from_api_version() -> None:
    dynamic = {
        "project": {"dynamic": ["version"]},
        "tool": {"setuptools": {"dynamic": {"version": {"attr": "api.version.VERSION"}}}},
    }
    assert RC.pyproject_problems(dynamic, VERSION) == []
    static = {"project": {"version": "0.1.0"}}
    assert RC.pyproject_problems(static, VERSION) == [
        f"pyproject.toml: project.version is '0.1.0'; the version is read from "
        f"api.version.VERSION ({VERSION!r})",
        "pyproject.toml: the version must be dynamic, from {attr = 'api.version.VERSION'}",
    ]


def test_the_changelog_needs_a_dated_section() -> None:
    assert RC.changelog_problems("## Unreleased\n\n## 1.2.0 - 2026-01-31\n", "1.2.0") == []
    for text in ("## 1.2.0\n", "## Unreleased\n", "## 1.2.0 - soon\n"):
        assert RC.changelog_problems(text, "1.2.0") == [
            "CHANGELOG.md: no section '## 1.2.0 - YYYY-MM-DD'"
        ]


@pytest.mark.parametrize(
    ("dry_run", "problems"),
    [
        ("build --tag sharegpu:1.2.0 .\n", []),
        ("podman load < x\npodman tag localhost/sharegpu:1.2.0 reg/sharegpu:1.2.0\n", []),
        ("build --tag sharegpu:1.1.0 .\n", ["make image builds sharegpu:1.1.0, not :1.2.0"]),
        # No name on the command line: the builder's default counts.
        ("python deploy/image/build.py\n", []),
    ],
)
def test_the_tag_make_image_builds(dry_run: str, problems: list[str]) -> None:
    assert RC.image_tag_problems(dry_run, "sharegpu:1.2.0", "1.2.0") == problems
    assert RC.image_tag_problems("build\n", "sharegpu:1.1.0", "1.2.0") == [
        "make image builds sharegpu:1.1.0, not :1.2.0"
    ]
    assert RC.image_tag_problems("build\n", "other/x:1", "1.2.0") == [
        "make image: names no sharegpu:<tag> image"
    ]


def test_the_builders_default_image_is_the_charts() -> None:
    assert RC.builder_image(RC.ROOT) == f"sharegpu:{RC.VERSION}"
