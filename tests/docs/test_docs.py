"""The documentation: the generated configuration reference is current, links resolve, the index
lists every page."""

from __future__ import annotations

import argparse
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import yaml

from tests.deploy.helpers import REPO_ROOT

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
    files = [*DOCS.glob("*.md"), *REPO_ROOT.glob("*.md"), *REPO_ROOT.glob("examples/**/*.md")]
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


def prose_files() -> list[Path]:
    """Hand-written pages (the generated reference is checked by regeneration)."""
    return [p for p in markdown_files() if p.name != "configuration.md"]


def code_of(markdown: str) -> str:
    """The code in a page: fenced blocks and inline code spans, one span per line."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", markdown, re.MULTILINE | re.DOTALL)
    outside = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    return "\n".join([*fenced, *re.findall(r"`([^`\n]+)`", outside)])


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    from sharegpuctl.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_documented_sharegpu_commands_and_flags_exist() -> None:
    parsers = subcommand_parsers()
    problems = []
    command = re.compile(r"^(?:\$ )?(?:\S+=\S+ )?sharegpu ([a-z]+)(.*)$", re.MULTILINE)
    for page in prose_files():
        for sub, rest in command.findall(code_of(page.read_text())):
            if sub not in parsers:
                problems.append(f"{page.name}: sharegpu {sub}")
                continue
            known = {o for a in parsers[sub]._actions for o in a.option_strings}
            problems += [
                f"{page.name}: sharegpu {sub} {flag}"
                for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", rest)
                if flag not in known
            ]
    assert problems == []


def _value_paths(node: object, prefix: str = "") -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}{key}"
            yield path
            yield from _value_paths(value, f"{path}.")


def test_documented_chart_values_exist() -> None:
    values = yaml.safe_load((REPO_ROOT / "deploy/helm/sharegpu/values.yaml").read_text())
    known = set(_value_paths(values))
    roots = "|".join(re.escape(k) for k in values)
    mention = re.compile(rf"(?<![\w./-])((?:{roots})(?:\.[A-Za-z][A-Za-z0-9]*)+)")
    problems = []
    for page in prose_files():
        for path in mention.findall(page.read_text()):
            if path not in known and not path.endswith(".*"):
                problems.append(f"{page.name}: {path}")
    assert problems == []


#: Flags of other tools the pages show (helm, kubectl, nvidia-smi, ruff, pytest, the generators).
OTHER_TOOLS_FLAGS = {
    "--namespace",
    "--set",
    "--field-selector",
    "--set-timeslice",
    "--strict",
    "--check",
    "--strict-markers",
    # nvidia-ctk cdi generate / runtime configure (docs/install.md, sharing.md)
    "--device-name-strategy",
    # nvidia-smi compute-policy and nvidia-smi nvlink (docs/development.md)
    "--list",
    "--status",
    # kubectl delete (examples)
    "--ignore-not-found",
    "--output",
    "--runtime",
    "--set-as-default",
    # helm package / helm upgrade (docs/install.md)
    "--destination",
    "--reuse-values",
    # helm install's flag the changelog's past entries name, kubectl apply without OpenAPI
    # (docs/development.md)
    "--skip-crds",
    "--validate",
    # podman save, kube-apiserver (docs/development.md, the node side of the e2e run)
    "--format",
    "--kubelet-preferred-address-types",
    # kube-apiserver, kubelet and kubectl apply of the real node (docs/development.md)
    "--kubelet-certificate-authority",
    "--node-ip",
    "--server-side",
    # nsenter, kube-proxy and helm of the sealed e2e run (docs/development.md)
    "--net",
    "--conntrack-max-per-core",
    "--take-ownership",
    "--force-conflicts",
    # kubectl drain of the e2e run's fault step (docs/development.md)
    "--ignore-daemonsets",
    # kubectl create token / create --dry-run=server (docs/development.md, the e2e run)
    "--bound-object-kind",
    "--dry-run",
    # the real-GPU suite's pytest options (docs/development.md)
    "--keep-gpu-settings",
    "--gpu-report",
    # kubectl create clusterrole / clusterrolebinding (docs/observability.md)
    "--verb",
    "--resource",
    "--clusterrole",
    "--serviceaccount",
    # kube-apiserver's admission configuration (docs/install.md, docs/security.md)
    "--admission-control-config-file",
    # kubectl create token --audience, curl --cacert (docs/observability.md)
    "--audience",
    "--cacert",
}


def test_documented_daemon_flags_exist() -> None:
    from controller.main import build_parser as controller_parser
    from kubeletplugin.config import build_parser as plugin_parser
    from tests.e2e.cluster import build_parser as cluster_parser
    from tests.oracle.batch import build_parser as oracle_parser
    from tests.oracle.regressions import build_parser as rerecord_parser
    from tests.upstream_pins import build_parser as pins_parser

    known = set(OTHER_TOOLS_FLAGS)
    for parser in [
        plugin_parser(),
        controller_parser(),
        cluster_parser(),
        oracle_parser(),
        rerecord_parser(),
        pins_parser(),
        *subcommand_parsers().values(),
    ]:
        known |= {o for a in parser._actions for o in a.option_strings}
    problems = [
        f"{page.name}: {flag}"
        for page in prose_files()
        if page.name != "performance.md"  # benchmark script flags
        # A long option has a name of two letters or more (``--x`` is CEL's double negation).
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", code_of(page.read_text()))
        if flag not in known
    ]
    assert problems == []
