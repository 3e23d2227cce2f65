"""``make release-check``: package the Helm chart and check that every version a release carries
is the one written in ``api/version.py``.

Checked, each against :data:`api.version.VERSION`:

- the chart's ``version`` and ``appVersion`` (``Chart.yaml``), and those of the package that
  ``helm package`` writes (``sharegpu-<version>.tgz``);
- the Python package's version: ``pyproject.toml`` reads it from ``api.version.VERSION`` and
  writes none of its own;
- the image every workload of the packaged chart runs with its defaults (``sharegpu:<version>``,
  the tag derived from ``appVersion``);
- the image tag ``make image`` builds (a name ``make --dry-run image`` passes, else the builder's
  default; skipped, and said so, while the Makefile has no such target);
- a dated section ``## <version> - YYYY-MM-DD`` in ``CHANGELOG.md``.

Prints one line per check and exits 1 when any disagrees.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from api.version import VERSION

ROOT: Final = Path(__file__).resolve().parent.parent
CHART_NAME: Final = "sharegpu"
#: The image repository of the chart's defaults (``image.repository``).
IMAGE_REPOSITORY: Final = "sharegpu"
_IMAGE_TAG: Final = re.compile(rf"(?<![\w.-]){IMAGE_REPOSITORY}:([0-9A-Za-z_.+-]+)")
VERSION_ATTR: Final = "api.version.VERSION"


def chart_problems(chart: Mapping[str, Any], where: str, version: str) -> list[str]:
    """The chart's ``version`` and ``appVersion`` that are not ``version``."""
    return [
        f"{where}: {key} is {chart.get(key)!r}, not {version!r}"
        for key in ("version", "appVersion")
        if str(chart.get(key)) != version
    ]


def pyproject_problems(pyproject: Mapping[str, Any], version: str) -> list[str]:
    """The Python package's version must come from :data:`VERSION_ATTR` alone."""
    project = pyproject.get("project") or {}
    dynamic = ((pyproject.get("tool") or {}).get("setuptools") or {}).get("dynamic") or {}
    problems = []
    if "version" in project:
        problems.append(
            f"pyproject.toml: project.version is {project['version']!r}; the version is "
            f"read from {VERSION_ATTR} ({version!r})"
        )
    if "version" not in (project.get("dynamic") or []) or dynamic.get("version") != {
        "attr": VERSION_ATTR
    }:
        problems.append(
            f"pyproject.toml: the version must be dynamic, from {{attr = {VERSION_ATTR!r}}}"
        )
    return problems


def changelog_problems(changelog: str, version: str) -> list[str]:
    """A dated section of ``version`` must exist."""
    heading = re.compile(rf"^## {re.escape(version)} - \d{{4}}-\d{{2}}-\d{{2}}$", re.MULTILINE)
    if heading.search(changelog):
        return []
    return [f"CHANGELOG.md: no section '## {version} - YYYY-MM-DD'"]


def _containers(doc: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every container and init container of a workload or of a Pod template in a ConfigMap."""
    if doc.get("kind") == "ConfigMap":
        for text in (doc.get("data") or {}).values():
            pod = yaml.safe_load(text) if "kind: Pod" in text else None
            if isinstance(pod, Mapping):
                yield from _containers(pod)
        return
    spec = doc.get("spec") or {}
    pod_spec = ((spec.get("template") or {}).get("spec")) if "template" in spec else spec
    for key in ("initContainers", "containers"):
        yield from (pod_spec or {}).get(key) or []


def rendered_image_problems(docs: Sequence[Mapping[str, Any]], version: str) -> list[str]:
    """Every image the rendered chart runs must be ``sharegpu:<version>``."""
    wanted = f"{IMAGE_REPOSITORY}:{version}"
    images = {
        f"{d['kind']}/{d['metadata']['name']}": str(c.get("image"))
        for d in docs
        for c in _containers(d)
    }
    if not images:
        return ["the packaged chart renders no container"]
    return [
        f"{what} runs {image}, not {wanted}" for what, image in images.items() if image != wanted
    ]


def image_tag_problems(dry_run: str, default_image: str, version: str) -> list[str]:
    """The ``sharegpu:<tag>`` names ``make --dry-run image`` prints, or where it names none the
    builder's own default ``default_image``, must all be ``version``."""
    tags = set(_IMAGE_TAG.findall(dry_run)) or set(_IMAGE_TAG.findall(default_image))
    if not tags:
        return [f"make image: names no {IMAGE_REPOSITORY}:<tag> image"]
    return [
        f"make image builds {IMAGE_REPOSITORY}:{t}, not :{version}"
        for t in sorted(tags - {version})
    ]


def builder_image(root: Path) -> str:
    """The name ``deploy/image/build.py`` gives the image without ``--name``."""
    path = root / "deploy" / "image" / "build.py"
    spec = importlib.util.spec_from_file_location("sharegpu_image_build", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.chart_image())


def make_image_dry_run(root: Path) -> str | None:
    """What ``make --dry-run image`` prints; None when the Makefile has no ``image`` target."""
    result = subprocess.run(
        ["make", "--no-print-directory", "--dry-run", "image"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0 and "No rule to make target" in result.stderr:
        return None
    if result.returncode != 0:
        raise RuntimeError(f"make --dry-run image failed:\n{result.stderr}")
    return result.stdout


def package(helm: str, chart_dir: Path, out_dir: Path) -> Path:
    """``helm package`` the chart into ``out_dir``; the package's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [helm, "package", str(chart_dir), "--destination", str(out_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm package failed:\n{result.stderr}")
    return Path(result.stdout.strip().rsplit(": ", 1)[-1])


def packaged_chart(path: Path) -> dict[str, Any]:
    """``Chart.yaml`` of a packaged chart."""
    with tarfile.open(path) as tar:
        member = tar.extractfile(f"{CHART_NAME}/Chart.yaml")
        assert member is not None
        return dict(yaml.safe_load(member.read()))


def render(helm: str, chart: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [helm, "template", CHART_NAME, str(chart), "--namespace", "release-check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm template of {chart} failed:\n{result.stderr}")
    return [d for d in yaml.safe_load_all(result.stdout) if d]


Results = list[tuple[str, list[str] | None]]


def check(root: Path, helm: str, out_dir: Path, version: str = VERSION) -> Results:
    """``(check, problems)`` of every check of the module docstring, in order; problems None:
    skipped (no ``image`` target)."""
    chart_dir = root / "deploy" / "helm" / CHART_NAME
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    results: Results = [
        ("chart version and appVersion", chart_problems(chart, "Chart.yaml", version))
    ]
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    results.append(("Python package version", pyproject_problems(pyproject, version)))
    results.append(
        ("CHANGELOG section", changelog_problems((root / "CHANGELOG.md").read_text(), version))
    )
    packaged = package(helm, chart_dir, out_dir)
    wanted_name = f"{CHART_NAME}-{version}.tgz"
    name_problem = [] if packaged.name == wanted_name else [f"{packaged.name}, not {wanted_name}"]
    results.append(
        (
            f"helm package {packaged.name}",
            name_problem + chart_problems(packaged_chart(packaged), packaged.name, version),
        )
    )
    results.append(
        ("image the chart renders", rendered_image_problems(render(helm, packaged), version))
    )
    dry_run = make_image_dry_run(root)
    tag_problems = (
        None if dry_run is None else image_tag_problems(dry_run, builder_image(root), version)
    )
    results.append(("image tag of make image", tag_problems))
    return results


def main(argv: list[str]) -> int:
    helm = argv[0] if argv else str(ROOT / ".venv" / "bin" / "helm")
    results = check(ROOT, helm, ROOT / "build" / "release")
    for name, problems in results:
        if problems is None:
            print(f"skip {name}: the Makefile has no image target")
            continue
        print(f"{'ok  ' if not problems else 'FAIL'} {name}")
        for problem in problems:
            print(f"     {problem}")
    failed = any(problems for _, problems in results)
    print(f"release {VERSION}: {'versions disagree' if failed else 'every version agrees'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
