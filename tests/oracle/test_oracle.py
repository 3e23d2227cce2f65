"""sharegpu against Kubernetes' own allocator and CEL environment.

The recorded regression cases replay everywhere (no Go needed). The random batch and the check
of the recorded answers need the Go oracle; without a Go toolchain or module cache they skip,
naming what is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.oracle import upstream
from tests.oracle.batch import DEFAULT_COUNTS, DEFAULT_SEED, draw_cases, run_batch
from tests.oracle.compare import allocation_outcome, cel_outcome
from tests.oracle.regressions import Regression, known_signatures, load_all, record, signature
from tests.oracle.typedgen import coverage

REGRESSIONS = load_all()
#: The kinds of the batch, every one of which must agree on every case.
AGREEING = dict(DEFAULT_COUNTS)
#: Operation by operand-tag combinations the typed cases of the fixed seed reach, at least.
TYPED_COVERAGE_FLOOR = 1568
#: A generous deadline for a test that may first build the oracle (minutes on a fresh machine)
#: and then runs the batch on a busy two-core machine (one to two minutes when idle).
BUILD_AND_RUN_S = 1200


def _oracle() -> None:
    try:
        upstream.ensure_built()
    except upstream.OracleUnavailable as exc:
        pytest.skip(f"differential oracle unavailable: {exc}")


def _outcome(kind: str, answer: dict[str, object]) -> str:
    return cel_outcome(answer) if kind == "cel" else allocation_outcome(answer)


@pytest.mark.parametrize(
    "regression",
    [
        pytest.param(r, marks=pytest.mark.xfail(reason=r.xfail, strict=True)) if r.xfail else r
        for r in REGRESSIONS
    ],
    ids=[r.name for r in REGRESSIONS],
)
def test_recorded_case_agrees_with_upstream(regression: Regression) -> None:
    found = regression.disagreements()
    assert not found, f"{regression.finding}\n" + "\n".join(d.describe() for d in found)


def test_every_recorded_case_names_its_finding() -> None:
    assert REGRESSIONS
    for regression in REGRESSIONS:
        assert regression.finding.strip(), f"{regression.path}: finding: empty"
        assert regression.case.get("id") == regression.name, f"{regression.path}: case.id"


@pytest.mark.timeout(BUILD_AND_RUN_S)
def test_recorded_answers_are_still_upstreams() -> None:
    _oracle()
    answers = upstream.ask([r.case for r in REGRESSIONS])
    for regression, answer in zip(REGRESSIONS, answers, strict=True):
        kind = regression.case["kind"]
        assert _outcome(kind, answer) == _outcome(kind, regression.upstream), regression.name


def test_the_generators_are_reproducible() -> None:
    for kind in ("cel", "typed", "allocate", "wide"):
        assert draw_cases(kind, 20, 7) == draw_cases(kind, 20, 7)
        assert draw_cases(kind, 20, 7) != draw_cases(kind, 20, 8)


@pytest.mark.timeout(BUILD_AND_RUN_S)
def test_fixed_seed_batch_agrees_with_upstream_on_every_case(tmp_path: Path) -> None:
    """At least 5,000 random cases, every one answered as upstream answers it. A disagreement
    is written (with upstream's answer) into ``tmp_path``, ready to become a regression case;
    the message says whether a recorded case already shows that kind."""
    _oracle()
    assert sum(AGREEING.values()) >= 5000
    result = run_batch(DEFAULT_SEED, dict(AGREEING))
    assert sum(result.counts.values()) == sum(AGREEING.values())
    known = known_signatures(REGRESSIONS)
    kinds = {case_id: case["kind"] for case_id, case in result.cases.items()}
    for case_id in sorted(result.cases):
        record(tmp_path, result.cases[case_id], result.answers[case_id])
    lines = [
        f"{known.get(signature(d, kinds[d.case_id])) or 'NEW'}: {d.describe()[:400]}"
        for d in result.disagreements[:20]
    ]
    assert not result.disagreements, (
        f"seed {DEFAULT_SEED}: {result.summary()}; cases in {tmp_path}\n" + "\n".join(lines)
    )


def test_typed_cases_cover_at_least_the_committed_floor() -> None:
    """The type-directed generator's coverage (operation by operand tags) of the fixed seed's
    batch does not drop below the committed floor."""
    cases = draw_cases("typed", DEFAULT_COUNTS["typed"], DEFAULT_SEED)
    reached, whole = coverage(cases)
    assert whole > 5000
    assert reached >= TYPED_COVERAGE_FLOOR, f"typed coverage {reached}/{whole}"
