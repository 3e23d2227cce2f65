"""The install documentation's commands: the blocks marked to run are shell blocks the local
cluster test can run, and every namespace the install and observability pages name for the
release is the one the chart is documented, and run, in."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.runnable import MARKER, PAGES, all_commands, commands, marked_blocks
from tests.e2e.driver import NAMESPACE
from tests.paths import REPO_ROOT

#: Pages that name the release's namespace.
NAMESPACED_PAGES = (REPO_ROOT / "docs" / "install.md", REPO_ROOT / "docs" / "observability.md")
#: Namespaces the pages name that are not the release's: the quota example's, and the one a
#: Prometheus or dashboard ServiceAccount lives in.
OTHER_NAMESPACES = frozenset({"gpu-quota-demo", "monitoring"})
_NAMESPACE_MENTIONS = (
    # not ctr's containerd namespace (-n k8s.io): Kubernetes namespaces hold no dot
    re.compile(r"(?:-n|--namespace)[ =]([a-z0-9][a-z0-9-]*)\b(?![.\w-])"),
    re.compile(r"\bkubectl (?:create|label|delete|get) (?:namespace|ns) ([a-z0-9][a-z0-9-]*)"),
    re.compile(r"\b[a-z0-9-]+\.([a-z0-9][a-z0-9-]*)\.svc\b"),
)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_marked_blocks_are_shell_blocks(page: Path) -> None:
    blocks = marked_blocks(page)
    assert blocks, f"{page.name}: no block marked {MARKER}"
    assert [language for _line, language, _body in blocks] == ["sh"] * len(blocks)
    assert all(commands(page))


def test_marker_is_only_used_before_a_block() -> None:
    for page in PAGES:
        text = page.read_text()
        assert text.count(MARKER) == len(marked_blocks(page)), page.name


def test_continued_lines_join_into_one_command() -> None:
    command = next(c for c in all_commands() if c.bare.startswith("kubectl -n sharegpu-system"))
    assert "\\" not in command.text and command.line > 0


def namespaces_named(text: str) -> set[str]:
    """The namespaces ``text`` names in kubectl/helm flags, ``namespace <name>`` and Service DNS
    names (``<service>.<namespace>.svc``)."""
    code = "\n".join(
        re.findall(r"`([^`\n]+)`", text) + re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
    )
    found: set[str] = set()
    for pattern in _NAMESPACE_MENTIONS:
        found.update(pattern.findall(code))
    return found


def test_namespace_mentions_are_found() -> None:
    text = (
        "`kubectl get pods -n a-ns`\n```sh\nhelm install x --namespace=b\n"
        "kubectl label namespace d x=y  # the namespace must\nctr -n k8s.io images ls\n```\n"
        "`svc.c.svc`"
    )
    assert namespaces_named(text) == {"a-ns", "b", "c", "d"}


@pytest.mark.parametrize("page", NAMESPACED_PAGES, ids=lambda p: p.name)
def test_pages_name_the_release_namespace_only(page: Path) -> None:
    named = namespaces_named(page.read_text())
    assert NAMESPACE in named
    assert named - OTHER_NAMESPACES == {NAMESPACE}, (
        f"{page.name} names namespaces other than the release's {NAMESPACE}"
    )
