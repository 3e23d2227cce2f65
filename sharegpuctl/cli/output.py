"""How every ``sharegpu`` command prints: tables on a terminal, plain text otherwise,
JSON or YAML with ``-o json|yaml``.

Commands build plain data (dicts/lists of JSON types) and, for humans, :class:`Table` objects;
this module is the only place that decides how they look.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

OUTPUT_FORMATS = ("table", "text", "json", "yaml")


@dataclass
class Table:
    """A titled table: ``rows`` are lists of cell strings, one per header."""

    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    title: str = ""

    def add(self, *cells: object) -> None:
        """Append a row; cells are converted with ``str``."""
        self.rows.append([str(c) for c in cells])


def resolve_format(requested: str | None, stream: TextIO | None = None) -> str:
    """The effective format: the requested one, else ``table`` on a terminal, else ``text``."""
    if requested:
        return requested
    stream = stream or sys.stdout
    return "table" if stream.isatty() else "text"


def fit_width(table: Table, width: int) -> Table:
    """``table`` re-flowed to print within ``width`` columns where it can: the title and the
    last column wrapped at spaces (continuation rows leave the other cells empty). Columns
    before the last are kept whole."""
    if not table.rows:
        return Table(table.headers, [], "\n".join(textwrap.wrap(table.title, width)))
    widths = [len(h) for h in table.headers]
    for row in table.rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    room = max(width - sum(w + 2 for w in widths[:-1]), 20)
    rows: list[list[str]] = []
    for row in table.rows:
        pieces = textwrap.wrap(row[-1], room, break_on_hyphens=False) or [""]
        rows.append([*row[:-1], pieces[0]])
        rows.extend([*([""] * (len(row) - 1)), piece] for piece in pieces[1:])
    return Table(table.headers, rows, "\n".join(textwrap.wrap(table.title, width)))


def render_table(table: Table, fmt: str) -> str:
    """Render ``table`` as aligned columns with a rule (``table``) or tab-free plain text."""
    lines: list[str] = []
    if table.title:
        lines.append(table.title)
    if not table.rows:
        lines.append("  (none)")
        return "\n".join(lines)
    widths = [len(h) for h in table.headers]
    for row in table.rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def fmt_row(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    lines.append(fmt_row(table.headers))
    if fmt == "table":
        lines.append("  ".join("-" * w for w in widths))
    lines.extend(fmt_row(row) for row in table.rows)
    return "\n".join(lines)


def emit(data: Any, tables: Sequence[Table], fmt: str, stream: TextIO | None = None) -> None:
    """Print ``data`` as JSON/YAML, or ``tables`` for humans, to ``stream`` (stdout)."""
    out = stream or sys.stdout
    if fmt == "json":
        out.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    elif fmt == "yaml":
        import yaml  # only for -o yaml: the other formats start without it

        out.write(yaml.safe_dump(data, sort_keys=False))
    else:
        out.write("\n\n".join(render_table(t, fmt) for t in tables) + "\n")
