"""The one manifest loader of the ``sharegpu`` commands: files, directories (``*.yaml``, ``*.yml``,
``*.json``), ``-``, multi-document streams, YAML lists and ``kind: *List``, each object with
where it came from (:class:`Manifest`).

Invariants: every byte is bounded here, before any check sees an object: the :class:`Limits`
(bytes, files, documents, objects, nesting, nodes with aliases expanded, integer literal length)
are checked in one linear pass over the parser's events, so a hostile file costs time in
proportion to its size and an alias to a collection containing it is refused. Every problem is a
one-line :class:`CliError` (exit 1) naming the file and, for a limit, the limit; a problem of one
file is a :class:`FileProblem` with its line and column, collected into ``problems`` when the
caller passes one (a limit always ends the load). A named path yields at least one non-empty
document; objects are plain dicts in their JSON shape. The limits are in docs/troubleshooting.md."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import yaml

from api.jsontypes import Obj
from sharegpuctl.cli.common import CliError

try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # PyYAML built without libyaml: the same rules, parsed in pure Python
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

MANIFEST_SUFFIXES: Final = (".yaml", ".yml", ".json")
MIB: Final = 1024 * 1024
#: Longest integer literal accepted (characters, sign and base prefix included).
MAX_INT_CHARS: Final = 100


@dataclass(frozen=True)
class Limits:
    """Bounds on one call of :func:`load_manifests` (see the module docstring)."""

    #: Bytes of one file.
    file_bytes: int = 4 * MIB
    #: Bytes of all files of the call together.
    total_bytes: int = 16 * MIB
    #: Manifest files of the call (after expanding directories).
    files: int = 1000
    #: YAML documents of one file.
    documents: int = 1000
    #: Objects of the call, after expanding YAML lists and ``kind: *List``.
    objects: int = 1000
    #: YAML nodes of all files of the call, counting each alias as the nodes it stands for.
    nodes: int = 500_000
    #: Collections nested in collections (aliases count with the depth they expand to).
    depth: int = 100


#: Limits for manifests a user writes: claims, classes, pods, configs.
MANIFEST_LIMITS: Final = Limits()
#: Limits for ResourceSlices dumped from a cluster (``explain --slices``): a node publishes up
#: to 15 devices per GPU in ``partitions`` mode, so a dump of many nodes is larger; nesting,
#: aliases and integers are bounded the same way.
SLICE_LIMITS: Final = replace(
    MANIFEST_LIMITS,
    file_bytes=64 * MIB,
    total_bytes=64 * MIB,
    documents=10_000,
    objects=10_000,
    nodes=4_000_000,
)


def _size(n: int) -> str:
    """``4 MiB`` / ``20.3 MiB`` / ``512 bytes``."""
    if n < MIB:
        return f"{n} bytes"
    mib = n / MIB
    return f"{mib:.0f} MiB" if mib == int(mib) else f"{mib:.1f} MiB"


def _limit_error(where: str, problem: str, limit: str) -> CliError:
    return CliError(f"{where}: {problem} (limit: {limit})")


class FileProblem(CliError):
    """A problem confined to one file: ``file``, ``where`` in it (``line 7, column 4``, or
    empty when not known) and ``problem``; the message is ``FILE: WHERE: PROBLEM``.

    ``limit`` marks input refused by a bound of the loader (size, documents, nesting, integer
    length, a recursive alias): such a file may be hostile, so it ends the load even when the
    caller collects problems."""

    def __init__(self, file: str, problem: str, where: str = "", *, limit: bool = False) -> None:
        super().__init__(": ".join(part for part in (file, where, problem) if part))
        self.file = file
        self.where = where
        self.problem = problem
        self.limit = limit


def _position(mark: Any) -> str:
    """``line L, column C`` of a parser mark (1-based), or empty."""
    return "" if mark is None else f"line {mark.line + 1}, column {mark.column + 1}"


# --- objects ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """One object of a manifest file; ``document`` counts from 1 within the file."""

    file: str
    document: int
    obj: Obj

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind") or "?")

    @property
    def name(self) -> str:
        md = self.obj.get("metadata") or {}
        if not isinstance(md, dict):
            return "?"
        return str(md.get("name") or md.get("generateName") or "?")

    @property
    def label(self) -> str:
        """``KIND/NAME``."""
        return f"{self.kind}/{self.name}"


def _expand(doc: Any, file: str, number: int, line: int | None = None) -> list[Manifest]:
    """The objects of document ``number`` (starting at ``line`` when known)."""
    if doc is None:
        return []
    if isinstance(doc, list):
        return [m for item in doc for m in _expand(item, file, number, line)]
    if not isinstance(doc, dict):
        what = "a string" if isinstance(doc, str) else f"a {type(doc).__name__}"
        raise FileProblem(
            file,
            f"document {number} is {what}, not an object: a manifest is a mapping with "
            "apiVersion, kind and metadata",
            "" if line is None else f"line {line}",
        )
    if str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
        return [m for item in doc["items"] for m in _expand(item, file, number, line)]
    return [Manifest(file, number, doc)]


# --- YAML -------------------------------------------------------------------------------------


class _Refused(yaml.constructor.ConstructorError):
    """Valid YAML beyond a limit, found while constructing."""


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    text = str(node.value)
    if len(text) > MAX_INT_CHARS:
        raise _Refused(
            None,
            None,
            f"integer of {len(text)} characters (limit: {MAX_INT_CHARS} characters)",
            node.start_mark,
        )
    return yaml.SafeLoader.construct_yaml_int(loader, node)


class _Loader(_SafeLoader):
    """PyYAML's safe loader (libyaml's parser when available) with bounded integer literals."""


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _where(name: str, mark: Any) -> str:
    if mark is None:
        return name
    return f"{name}: line {mark.line + 1}, column {mark.column + 1}"


_NODE_EVENTS: Final = (yaml.CollectionStartEvent, yaml.ScalarEvent, yaml.AliasEvent)


@dataclass
class _Open:
    """A collection whose end event has not come yet."""

    anchor: str | None
    #: The file's node count before this collection.
    start: int
    #: Levels of collections from this one down (1: no collection inside).
    height: int = 1


@dataclass
class _Budget:
    """What one call of :func:`load_manifests` has used of its limits."""

    limits: Limits
    bytes: int = 0
    objects: int = 0
    nodes: int = 0


@dataclass
class _EventPass:
    """The bounds of one file, checked event by event (no recursion, nothing constructed)."""

    name: str
    budget: _Budget
    documents: int = 0
    #: The line (1-based) where each document's content starts (-1: empty document).
    lines: list[int] = field(default_factory=list)
    stack: list[_Open] = field(default_factory=list)
    #: Anchor -> (expanded nodes, collection height) of the current document.
    anchors: dict[str, tuple[int, int]] = field(default_factory=dict)

    def run(self, text: str) -> None:
        for event in yaml.parse(text, Loader=_Loader):
            mark = event.start_mark
            if self.lines and self.lines[-1] < 0 and isinstance(event, _NODE_EVENTS) and mark:
                self.lines[-1] = mark.line + 1
            if isinstance(event, yaml.DocumentStartEvent):
                self.documents += 1
                self.lines.append(-1)
                self.anchors.clear()
                if self.documents > self.budget.limits.documents:
                    limit = self.budget.limits.documents
                    raise FileProblem(
                        self.name,
                        f"more than {limit} YAML documents (limit: {limit} per file)",
                        _position(event.start_mark),
                        limit=True,
                    )
            elif isinstance(event, yaml.CollectionStartEvent):
                self._enter(event.start_mark, 1)
                self.stack.append(_Open(event.anchor, self.budget.nodes))
                self._add(1, event.start_mark, None)
            elif isinstance(event, yaml.CollectionEndEvent):
                done = self.stack.pop()
                self._child(done.height)
                if done.anchor is not None:
                    self.anchors[done.anchor] = (self.budget.nodes - done.start, done.height)
            elif isinstance(event, yaml.ScalarEvent):
                self._add(1, event.start_mark, None)
                if event.anchor is not None:
                    self.anchors[event.anchor] = (1, 0)
            elif isinstance(event, yaml.AliasEvent):
                self._alias(event)

    def _alias(self, event: yaml.AliasEvent) -> None:
        anchor = str(event.anchor)
        where = _position(event.start_mark)
        if any(o.anchor == anchor for o in self.stack):
            raise FileProblem(
                self.name,
                f"alias *{anchor} refers to a collection that contains it; a recursive "
                "document has no JSON form",
                where,
                limit=True,
            )
        found = self.anchors.get(anchor)
        if found is None:
            raise FileProblem(self.name, f"invalid YAML: found undefined alias *{anchor}", where)
        size, height = found
        self._enter(event.start_mark, height, anchor)
        self._child(height)
        self._add(size, event.start_mark, anchor)

    def _enter(self, mark: Any, height: int, alias: str | None = None) -> None:
        """Refuse a node of ``height`` collection levels at the current depth beyond the limit."""
        limit = self.budget.limits.depth
        if len(self.stack) + height > limit:
            through = f" (through alias *{alias})" if alias else ""
            raise _depth_error(self.name, _position(mark), limit, through)

    def _child(self, height: int) -> None:
        if self.stack:
            self.stack[-1].height = max(self.stack[-1].height, height + 1)

    def _add(self, count: int, mark: Any, alias: str | None) -> None:
        self.budget.nodes += count
        limit = self.budget.limits.nodes
        if self.budget.nodes <= limit:
            return
        problem = (
            f"alias *{alias} expands the input to more than {limit} YAML nodes"
            if alias
            else f"more than {limit} YAML nodes"
        )
        raise _limit_error(
            _where(self.name, mark), problem, f"{limit} nodes for all files, aliases expanded"
        )


def _depth_error(file: str, where: str, limit: int, through: str = "") -> FileProblem:
    return FileProblem(
        file,
        f"nested more than {limit} levels deep{through} (limit: {limit} levels)",
        where,
        limit=True,
    )


#: The parser's ``context`` when it names the construct it was in (``a flow sequence``).
_CONSTRUCT: Final = re.compile(r"while (?:scanning|parsing) (an? [a-z ]+)")
#: libyaml's own nesting bound (1000 levels), reached while it scans ahead of the events.
_LIBYAML_NESTING: Final = "exceeded maximum nesting depth"


def _yaml_error(name: str, exc: yaml.YAMLError, limits: Limits, text: str) -> FileProblem:
    """One line for a parser error, at the place to fix: where the parser stopped, with the
    construct it was in (``in the flow sequence that starts at line 6, column 6``); when it
    stopped at the end of the file, at the start of that unclosed construct instead."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if problem == _LIBYAML_NESTING:
        return _depth_error(name, _position(mark), limits.depth)
    if isinstance(exc, _Refused):
        return FileProblem(name, problem, _position(mark), limit=True)
    if mark is not None and text[mark.index : mark.index + 1] == "\t":
        problem += " (a tab: indent YAML with spaces)"
    context = _CONSTRUCT.fullmatch(str(getattr(exc, "context", None) or ""))
    context_mark = getattr(exc, "context_mark", None)
    if context is None or context_mark is None:
        return FileProblem(name, f"invalid YAML: {problem}", _position(mark))
    construct = context.group(1)
    at_end = mark is None or not text[mark.index :].strip()
    if at_end:
        return FileProblem(
            name,
            f"invalid YAML: {construct} that starts here is not closed ({problem} at "
            f"{_position(mark) or 'the end of the file'})",
            _position(context_mark),
        )
    return FileProblem(
        name,
        f"invalid YAML: {problem} (in {construct} that starts at {_position(context_mark)})",
        _position(mark),
    )


def _parse(text: str, name: str, budget: _Budget) -> tuple[list[Any], list[int]]:
    """The documents of ``text`` and the line where each starts."""
    try:
        events = _EventPass(name, budget)
        events.run(text)
        return list(yaml.load_all(text, Loader=_Loader)), events.lines
    except yaml.YAMLError as exc:
        raise _yaml_error(name, exc, budget.limits, text) from None


# --- files --------------------------------------------------------------------------------------


def _read(path: Path, budget: _Budget) -> str:
    """The text of one file (``-``: standard input), within the byte limits."""
    name = str(path)
    limit = budget.limits.file_bytes
    try:
        if name == "-":
            stream = getattr(sys.stdin, "buffer", None)
            raw = stream.read(limit + 1) if stream else sys.stdin.read(limit + 1).encode()
        else:
            size = path.stat().st_size
            if size > limit:
                raise FileProblem(
                    name, f"too large: {_size(size)} (limit: {_size(limit)} per file)", limit=True
                )
            with path.open("rb") as f:
                raw = f.read(limit + 1)
    except OSError as exc:
        raise FileProblem(name, f"cannot read: {exc}") from None
    if len(raw) > limit:
        raise FileProblem(
            name,
            f"too large: more than {_size(limit)} (limit: {_size(limit)} per file)",
            limit=True,
        )
    budget.bytes += len(raw)
    if budget.bytes > budget.limits.total_bytes:
        total = _size(budget.limits.total_bytes)
        raise _limit_error(
            name,
            f"too much input: the files read so far total more than {total}",
            f"{total} for all files",
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileProblem(name, f"cannot read: {exc}") from None


def manifest_files(raw: str, limits: Limits = MANIFEST_LIMITS) -> list[Path]:
    """The files one path names: itself, or a directory's manifest files (recursive, sorted).

    A missing path, or a directory with more than ``limits.files`` manifest files, fails."""
    path = Path(raw)
    if path.is_dir():
        found: list[Path] = []
        for p in path.rglob("*"):
            if p.suffix in MANIFEST_SUFFIXES and p.is_file():
                found.append(p)
                if len(found) > limits.files:
                    raise _limit_error(
                        raw, f"more than {limits.files} manifest files", f"{limits.files} files"
                    )
        return sorted(found)
    if path.is_file() or raw == "-":
        return [path]
    raise CliError(f"{raw}: no such file or directory")


def _read_file(path: Path, budget: _Budget) -> tuple[list[Manifest], int]:
    """Every object of one file, and how many of its documents are not empty."""
    name = str(path)
    docs, lines = _parse(_read(path, budget), name, budget)
    manifests = [
        m
        for i, doc in enumerate(docs, start=1)
        for m in _expand(
            doc, name, i, lines[i - 1] if i <= len(lines) and lines[i - 1] > 0 else None
        )
    ]
    budget.objects += len(manifests)
    limit = budget.limits.objects
    if budget.objects > limit:
        raise _limit_error(name, f"more than {limit} objects", f"{limit} objects for all files")
    return manifests, sum(doc is not None for doc in docs)


def _why_empty(raw: str, files: Sequence[Path]) -> str:
    if raw == "-":
        return "standard input is empty or holds only comments"
    if not Path(raw).is_dir():
        return "the file is empty or holds only comments"
    if not files:
        return "the directory has no *.yaml, *.yml or *.json file"
    return "its files are empty or hold only comments"


def load_manifests(
    paths: Iterable[str],
    limits: Limits = MANIFEST_LIMITS,
    problems: list[FileProblem] | None = None,
) -> list[Manifest]:
    """All objects of the files and directories named (see the module docstring).

    Without ``problems`` the first problem ends the load; with it, each file's
    :class:`FileProblem` is appended there instead and the other files are loaded (a path whose
    files all have problems is then not reported as empty)."""
    budget = _Budget(limits)
    out: list[Manifest] = []
    files = 0
    for raw in paths:
        documents = 0
        failed = False
        files_here = manifest_files(raw, limits)
        for path in files_here:
            files += 1
            if files > limits.files:
                raise _limit_error(
                    raw, f"more than {limits.files} manifest files", f"{limits.files} files"
                )
            try:
                manifests, count = _read_file(path, budget)
            except FileProblem as problem:
                if problems is None or problem.limit:
                    raise
                problems.append(problem)
                failed = True
                continue
            out += manifests
            documents += count
        if documents == 0 and not failed:
            raise CliError(f"no Kubernetes objects found in {raw}: {_why_empty(raw, files_here)}")
    return out


def load_objects(
    paths: Iterable[str], kinds: Sequence[str] | None = None, limits: Limits = MANIFEST_LIMITS
) -> list[Obj]:
    """The objects of ``paths`` (only those of ``kinds`` when given)."""
    return [m.obj for m in load_manifests(paths, limits) if kinds is None or m.kind in kinds]
