"""The shell blocks of the install documentation that are run as written.

A block is run when the line before its opening fence is :data:`MARKER`; it must be a ``sh``
block. ``tests/e2e/test_local_cluster.py`` runs the marked blocks of :data:`PAGES` in order,
command by command, against the cluster of ``make local-cluster`` (with its ``kubectl``,
``helm`` and ``ctr`` wrappers first on ``PATH``), from the checkout.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Final

from tests.paths import REPO_ROOT

#: The line that marks a block as run (an HTML comment: invisible where the page is rendered).
MARKER: Final = "<!-- run on make local-cluster -->"
#: The pages whose marked blocks are run, in this order.
PAGES: Final = (REPO_ROOT / "README.md", REPO_ROOT / "docs" / "install.md")
_FENCE: Final = re.compile(r"^```(\S*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Command:
    """One command of a marked block: its text as written (continuation lines joined, its
    trailing comment kept), and where it is."""

    page: str
    line: int
    text: str

    @property
    def bare(self) -> str:
        """The command without its trailing comment and surplus whitespace."""
        return " ".join(self.text.split(" #", 1)[0].split())


def marked_blocks(page: Path) -> list[tuple[int, str, str]]:
    """``(line of the fence, language, body)`` of each block of ``page`` after :data:`MARKER`."""
    text = page.read_text()
    blocks = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if before.strip() == MARKER:
            blocks.append((text.count("\n", 0, match.start()) + 1, match.group(1), match.group(2)))
    return blocks


def commands(page: Path) -> list[Command]:
    """The commands of ``page``'s marked blocks, in order."""
    found = []
    for fence_line, _language, body in marked_blocks(page):
        pending: list[str] = []
        start = 0
        for offset, line in enumerate(body.splitlines(), start=1):
            if not pending:
                start = fence_line + offset
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
            if line.rstrip().endswith("\\"):
                pending.append(line.rstrip()[:-1].rstrip())
                continue
            pending.append(line.strip() if pending else line.rstrip())
            found.append(Command(page.name, start, " ".join(p.strip() for p in pending)))
            pending = []
    return found


def all_commands() -> list[Command]:
    """The commands of every page's marked blocks, in the order they are run."""
    return [command for page in PAGES for command in commands(page)]
