"""Run a batch of random oracle cases: draw them, ask upstream, answer with sharegpu, compare.

Usage: ``python -m tests.oracle.batch [--seed N] [--count N] [--kinds cel,typed,allocate,wide]
[--record DIR] [--progress]``. Kinds: ``cel`` (selectors of ``celgen``), ``typed``
(type-directed selectors of ``typedgen``), ``allocate`` (``allocgen``), ``wide``
(``allocwide``). The kinds take turns, :data:`CHUNK` cases at a time. Prints one line per
disagreement as its chunk finishes, marked ``known (<recorded case>)`` when a recorded case
shows the same kind of disagreement and ``NEW`` otherwise (``--progress``: and the running
summary after each round), and a summary with the typed cases' coverage; exits 1 when any
case disagrees, 2 when the oracle cannot run here (naming what is missing). ``--record``
writes each disagreeing case, with upstream's answer, as a regression file into DIR.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from hypothesis import strategies as st
from hypothesis.control import BuildContext
from hypothesis.internal.conjecture.data import ConjectureData
from hypothesis.internal.conjecture.providers import Constants, HypothesisProvider

from . import upstream
from .allocgen import allocation_cases
from .allocwide import wide_allocation_cases
from .celgen import cel_cases
from .compare import Disagreement, compare, sharegpu_answer
from .regressions import known_signatures, record, signature
from .typedgen import coverage, typed_cel_cases

#: The fixed seed of the batch ``make test`` runs, and how many cases of each kind it draws.
DEFAULT_SEED: Final = 20260137
DEFAULT_COUNTS: Final = {"cel": 3000, "typed": 3000, "allocate": 2000, "wide": 300}
#: The most cases of each kind one run draws.
MAX_COUNT: Final = 1_000_000
#: Cases of each kind drawn, asked and compared at a time: only one chunk (and the disagreeing
#: cases) is held in memory, and the kinds take turns, so a long run stopped early has covered
#: every kind.
CHUNK: Final = 2000
STRATEGIES: Final[dict[str, Callable[[], st.SearchStrategy[dict[str, Any]]]]] = {
    "cel": cel_cases,
    "typed": typed_cel_cases,
    "allocate": allocation_cases,
    "wide": wide_allocation_cases,
}


class _FixedProvider(HypothesisProvider):
    """Hypothesis's provider without the constants it collects from the modules loaded so far
    (which would make a draw depend on what the process imported before)."""

    @property
    def _local_constants(self) -> Constants:
        return Constants()


def draw_cases(kind: str, count: int, seed: int, start: int = 0) -> list[dict[str, Any]]:
    """``count`` cases of ``kind`` from number ``start`` on, case ``n`` drawn from its own
    random seed ``<seed>-<n>`` and named ``<kind>-<seed>-<n>``: the same in every process and
    on its own, so one case of a batch can be drawn again by its id.

    Each case is one draw of the hypothesis strategy from fresh conjecture data, with a provider
    that leaves out the constants Hypothesis collects from loaded modules. (Hypothesis's test
    engine is not used: it adapts what it generates to earlier examples and to what the process
    imported, so the same seed would not give the same batch under pytest and the command.)
    """
    strategy = STRATEGIES[kind]()
    cases = []
    for n in range(start, start + count):
        data = ConjectureData(random=random.Random(f"{seed}-{n}"), provider=_FixedProvider)
        with BuildContext(data, wrapped_test=None):
            case = data.draw(strategy)
        cases.append({"id": f"{kind}-{seed}-{n}", **case})
    return cases


@dataclass
class BatchResult:
    """What a batch found: cases run per kind, the disagreements, the seconds taken."""

    counts: Counter[str] = field(default_factory=Counter)
    disagreements: list[Disagreement] = field(default_factory=list)
    cases: dict[str, dict[str, Any]] = field(default_factory=dict)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0
    #: Operation by operand-tag combinations the typed cases reached, and the universe's size.
    typed_coverage: tuple[int, int] = (0, 0)
    #: Cases upstream gave no answer to: its search ran past the oracle's bound, or it
    #: panicked (these are not compared).
    unanswered: int = 0

    def summary(self) -> str:
        """One line: cases per kind, disagreements per aspect, time."""
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.counts.items()))
        aspects = Counter(d.aspect for d in self.disagreements)
        found = ", ".join(f"{n} {a}" for a, n in sorted(aspects.items())) or "none"
        total = sum(self.counts.values())
        line = f"{total} cases ({kinds}); disagreements: {found}; {self.seconds:.1f}s"
        if self.unanswered:
            line += f"; {self.unanswered} unanswered by upstream (timeout or panic)"
        if self.counts["typed"]:
            reached, whole = self.typed_coverage
            line += f"; typed coverage {reached}/{whole} ({100 * reached / whole:.1f} %)"
        return line


def run_batch(
    seed: int,
    counts: dict[str, int],
    chunk: int = CHUNK,
    progress: Callable[[BatchResult], None] | None = None,
) -> BatchResult:
    """Draw ``counts[kind]`` cases of each kind from ``seed`` and compare every answer, ``chunk``
    cases of each kind at a time (kinds in turn); ``progress`` is called after each chunk."""
    start = time.monotonic()
    result = BatchResult()
    reached: set[str] = set()
    for offset in range(0, max(counts.values(), default=0), chunk):
        for kind, count in counts.items():
            if offset >= count:
                continue
            cases = draw_cases(kind, min(chunk, count - offset), seed, offset)
            if kind == "typed":
                for case in cases:
                    reached.update(case.get("overloads") or ())
                result.typed_coverage = coverage([{"overloads": sorted(reached)}])
            _compare_chunk(result, cases)
            result.counts[kind] += len(cases)
        result.seconds = time.monotonic() - start
        if progress is not None:
            progress(result)
    result.seconds = time.monotonic() - start
    return result


def _compare_chunk(result: BatchResult, cases: list[dict[str, Any]]) -> None:
    """Ask upstream about ``cases`` and add what differs to ``result``."""
    answers = upstream.ask(cases)
    for case, answer in zip(cases, answers, strict=True):
        panicked = str(answer.get("inputError", "")).startswith("upstream panicked")
        result.unanswered += bool(answer.get("timedOut")) or panicked
        found = compare(case["id"], case["kind"], answer, sharegpu_answer(case))
        if found:
            result.disagreements.extend(found)
            result.cases[case["id"]] = case
            result.answers[case["id"]] = answer


def build_parser() -> argparse.ArgumentParser:
    """The command line's options."""
    parser = argparse.ArgumentParser(prog="python -m tests.oracle.batch", description=__doc__)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--count", type=int, help=f"cases of each kind (default: {DEFAULT_COUNTS})")
    parser.add_argument(
        "--kinds",
        default="cel,typed,allocate,wide",
        help="comma-separated: cel, typed, allocate, wide",
    )
    parser.add_argument("--record", metavar="DIR", help="write disagreeing cases here")
    parser.add_argument(
        "--progress", action="store_true", help=f"print the summary after every {CHUNK} cases"
    )
    return parser


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in STRATEGIES]
    if unknown or not kinds:
        parser.error(
            f"--kinds: {','.join(unknown) or '(empty)'} not among cel, typed, allocate, wide"
        )
    if args.count is not None and not 1 <= args.count <= MAX_COUNT:
        parser.error(f"--count: must be from 1 to {MAX_COUNT}, got {args.count}")
    args.kinds = kinds
    return args


class _Reporter:
    """Prints each disagreement once, as its chunk finishes, marked ``known (<recorded case>)``
    or ``NEW``, and (with ``--progress``) the running summary after each chunk."""

    def __init__(self, summaries: bool) -> None:
        self.summaries = summaries
        self.known = known_signatures()
        self.printed = 0
        self.new = 0

    def __call__(self, result: BatchResult) -> None:
        for d in result.disagreements[self.printed :]:
            like = self.known.get(signature(d, result.cases[d.case_id]["kind"]))
            self.new += like is None
            print(f"{'NEW' if like is None else f'known ({like})'}: {d.describe()}", flush=True)
        self.printed = len(result.disagreements)
        if self.summaries:
            print(f"progress: {result.summary()}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; see the module's docstring."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        upstream.ensure_built()
    except upstream.OracleUnavailable as exc:
        print(f"oracle unavailable: {exc}", file=sys.stderr)
        return 2
    counts = {k: args.count or DEFAULT_COUNTS[k] for k in args.kinds}
    reporter = _Reporter(args.progress)
    result = run_batch(args.seed, counts, progress=reporter)
    if args.record and result.disagreements:
        for case_id in result.cases:
            path = record(args.record, result.cases[case_id], result.answers[case_id])
            print(f"recorded {path}")
    new = reporter.new
    print(f"seed {args.seed}: {result.summary()}; {new} of a kind no recorded case shows")
    return 1 if result.disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
