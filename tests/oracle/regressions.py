"""Regression cases of the differential oracle: every disagreement found, kept as a JSON file
under ``tests/data/dra-oracle/`` with upstream's recorded answer, so it is replayed on every run
(without Go). A file is::

    {"case": {...}, "upstream": {...}, "answeredBy": "k8s.io/dynamic-resource-allocation v0.37.2",
     "finding": "what differed", "xfail": "why sharegpu still differs"   # while it does
    }
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tests.paths import DATA_DIR

from . import upstream
from .compare import (
    Disagreement,
    allocation_outcome,
    cel_outcome,
    compare,
    sharegpu_answer,
)

REGRESSION_DIR: Final = DATA_DIR / "dra-oracle"


@dataclass(frozen=True)
class Regression:
    """One recorded case."""

    path: Path
    case: dict[str, Any]
    upstream: dict[str, Any]
    finding: str
    xfail: str | None

    @property
    def name(self) -> str:
        """The file's stem."""
        return self.path.stem

    def disagreements(self) -> list[Disagreement]:
        """How sharegpu's answer now differs from upstream's recorded one."""
        ours = sharegpu_answer(self.case)
        return compare(self.name, self.case["kind"], self.upstream, ours)


def load(path: Path) -> Regression:
    """The regression case in ``path``; ``ValueError`` naming the field when malformed."""
    doc = json.loads(path.read_text())
    for key in ("case", "upstream", "finding"):
        if key not in doc:
            raise ValueError(f"{path}: {key}: required")
    if doc["case"].get("kind") not in ("cel", "allocate"):
        raise ValueError(f"{path}: case.kind: must be cel or allocate")
    return Regression(path, doc["case"], doc["upstream"], str(doc["finding"]), doc.get("xfail"))


def load_all() -> list[Regression]:
    """Every recorded case, by file name."""
    return [load(p) for p in sorted(REGRESSION_DIR.glob("*.json"))]


def signature(d: Disagreement, kind: str) -> tuple[str, ...]:
    """What identifies a kind of disagreement across cases: the case kind, the aspect and,
    for an outcome, both outcomes."""
    if d.aspect == "outcome":
        return (kind, d.aspect, str(d.upstream), str(d.sharegpu))
    return (kind, d.aspect, "", "")


def known_signatures(regressions: list[Regression] | None = None) -> dict[tuple[str, ...], str]:
    """The signatures of the disagreements recorded cases still show, each with the name of
    one such case: a batch's disagreement with one of these is of a known kind."""
    return {
        signature(d, r.case["kind"]): r.name
        for r in (load_all() if regressions is None else regressions)
        if r.xfail
        for d in r.disagreements()
    }


def record(directory: str | Path, case: dict[str, Any], answer: dict[str, Any]) -> Path:
    """Write ``case`` with upstream's ``answer`` as a regression file (named by the case id)."""
    out = Path(directory) / f"{case['id']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "case": case,
        "upstream": {k: v for k, v in answer.items() if k != "id"},
        "answeredBy": answered_by(),
        "finding": "",
    }
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return out


def answered_by() -> str:
    """What a file recorded now names in ``answeredBy``: the pinned allocator module."""
    return f"{upstream.ALLOCATOR_MODULE} {upstream.pinned_version()}"


def rerecord(regressions: list[Regression] | None = None) -> list[str]:
    """Ask the pinned oracle (built first) every recorded case again and rewrite each file's
    ``answeredBy``, and its ``upstream`` answer where the outcome changed (an answer with the
    same outcome is kept as recorded: share IDs are random and fields the oracle added since
    carry nothing); ``finding`` and ``xfail`` are kept. Returns the names of the cases whose
    outcome changed, for a reviewer to read (then the replay of ``tests/oracle/test_oracle.py``
    says which of sharegpu's answers now differ)."""
    cases = load_all() if regressions is None else regressions
    answers = upstream.ask([r.case for r in cases])
    changed = []
    for regression, answer in zip(cases, answers, strict=True):
        doc = json.loads(regression.path.read_text())
        new = {k: v for k, v in answer.items() if k != "id"}
        outcome = cel_outcome if regression.case["kind"] == "cel" else allocation_outcome
        if outcome(new) != outcome(doc["upstream"]):
            changed.append(regression.name)
            doc["upstream"] = new
        doc["answeredBy"] = answered_by()
        regression.path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return changed


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``python -m tests.oracle.regressions``."""
    parser = argparse.ArgumentParser(prog="python -m tests.oracle.regressions")
    parser.add_argument(
        "--rerecord",
        action="store_true",
        required=True,
        help="ask the pinned oracle every recorded case again and rewrite the files",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.oracle.regressions --rerecord``: see :func:`rerecord`."""
    build_parser().parse_args(argv)
    try:
        changed = rerecord()
    except upstream.OracleUnavailable as exc:
        print(f"the oracle cannot run here: {exc}")
        return 1
    print(f"{len(load_all())} files re-recorded with {answered_by()}; outcome changed: {changed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
