"""cel-spec's simple conformance tests, run against :mod:`sharegpu.cel`.

The tables are data: ``upstream/celspec_<file>.yaml``, one per ``tests/simple/testdata`` file
of google/cel-spec (repository, path and commit at the top). Each case has an ``expression``,
its ``variables`` (declared type and bound value, when the upstream case declares any) and
either the expected ``value`` (one key naming its CEL type: ``int``, ``uint``, ``double``,
``string``, ``bytes`` in base64, ``bool``, ``null``, ``list``, ``map``, ``type``,
``duration_seconds``, ``timestamp_seconds``) or the expected ``error`` (upstream's message;
any CEL error passes, at compile time or at evaluation, as Kubernetes type-checks). A case
that does not apply to the DRA selector environment carries ``skip`` with the reason; a case
that applies and does not pass carries ``divergence`` with the reason. A case upstream runs
without type-checking, which Kubernetes' checker refuses, carries ``kubernetesCompileError``
with the reason: it passes when the expression does not compile.

Every applicable case must pass, except the divergences, which must still not pass (so that a
fixed one is noticed) and must not crash: any exception other than CEL's compile and
evaluation errors is a crash. ``python -m tests.cel.test_upstream_celspec`` prints the pass
counts per file.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sharegpu.cel import CelCompileError, CelEvalError
from sharegpu.cel.celtypes import CelType
from sharegpu.cel.device import device_activation
from sharegpu.cel.environment import compile_expression
from sharegpu.cel.timevalues import Duration, Timestamp
from sharegpu.cel.values import UInt

UPSTREAM = Path(__file__).parent / "upstream"
FILES = sorted(UPSTREAM.glob("celspec_*.yaml"))
TABLES = {path.stem.removeprefix("celspec_"): yaml.safe_load(path.read_text()) for path in FILES}
#: The share of the applicable cases (not skipped) that must pass.
REQUIRED_PASS_RATE = 0.95
_NANOS = 10**9


def _double(value: Any) -> float:
    return float({"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(value, value))


def to_python(value: Mapping[str, Any]) -> Any:
    """The Python value of a table value (see the module docstring for the forms)."""
    [(kind, data)] = value.items()
    if kind == "int":
        return int(data)
    if kind == "uint":
        return UInt(data)
    if kind == "double":
        return _double(data)
    if kind in ("string", "bool"):
        return data
    if kind == "bytes":
        return base64.b64decode(data)
    if kind == "null":
        return None
    if kind == "list":
        return [to_python(item) for item in data]
    if kind == "map":
        return {to_python(entry["key"]): to_python(entry["value"]) for entry in data}
    if kind == "type":
        return CelType(data)
    if kind == "duration_seconds":
        return Duration(data[0] * _NANOS + data[1])
    if kind == "timestamp_seconds":
        return Timestamp(data[0] * _NANOS + data[1])
    raise ValueError(f"unknown table value kind {kind!r}")


def same(expected: Mapping[str, Any], actual: Any) -> bool:
    """Whether ``actual`` is the table value ``expected``, type included (``1`` is not ``1u``
    nor ``1.0``; NaN is NaN)."""
    [(kind, data)] = expected.items()
    if kind == "int":
        return type(actual) is int and actual == data
    if kind == "uint":
        return isinstance(actual, UInt) and actual == data
    if kind == "double":
        want = _double(data)
        if not isinstance(actual, float):
            return False
        return math.isnan(actual) if math.isnan(want) else actual == want
    if kind == "string":
        return isinstance(actual, str) and actual == data
    if kind == "bool":
        return isinstance(actual, bool) and actual is data
    if kind == "list":
        return (
            isinstance(actual, list | tuple)
            and len(actual) == len(data)
            and all(same(e, a) for e, a in zip(data, actual, strict=True))
        )
    if kind == "map":
        if not isinstance(actual, Mapping) or len(actual) != len(data):
            return False
        for entry in data:
            keys = [k for k in actual if same(entry["key"], k)]
            if len(keys) != 1 or not same(entry["value"], actual[keys[0]]):
                return False
        return True
    want = to_python(expected)
    return type(actual) is type(want) and bool(actual == want)


@dataclass(frozen=True)
class Outcome:
    """How one case went: ``passed``, ``failed`` or ``crashed``, and what happened."""

    status: str
    detail: str


def run_case(case: Mapping[str, Any]) -> Outcome:
    """Compile and evaluate one case and compare with what upstream expects."""
    variables = case.get("variables", {})
    types = {name: spec["type"] for name, spec in variables.items()}
    env = {name: to_python(spec["value"]) for name, spec in variables.items() if "value" in spec}
    env["device"] = device_activation("", {})
    want_error = "error" in case
    if "kubernetesCompileError" in case:
        try:
            compile_expression(case["expression"], types)
        except CelCompileError:
            return Outcome("passed", "")
        except Exception as exc:
            return Outcome("crashed", f"{type(exc).__name__}: {exc}")
        return Outcome("failed", "compiles; Kubernetes' type checker refuses it")
    try:
        program = compile_expression(case["expression"], types)
        result = program(env)
    except (CelCompileError, CelEvalError) as exc:
        if want_error:
            return Outcome("passed", "")
        return Outcome("failed", f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        return Outcome("crashed", f"{type(exc).__name__}: {exc}")
    if want_error:
        return Outcome("failed", f"expected error {case['error']!r}, got {result!r}")
    if same(case["value"], result):
        return Outcome("passed", "")
    return Outcome("failed", f"expected {case['value']!r}, got {result!r}")


def _params() -> list[Any]:
    params = []
    for file, table in TABLES.items():
        for case in table["cases"]:
            marks = [pytest.mark.skip(reason=case["skip"])] if "skip" in case else []
            params.append(pytest.param(case, id=f"{file}/{case['name']}", marks=marks))
    return params


def test_tables_record_their_source() -> None:
    assert TABLES, "no celspec tables found"
    for file, table in TABLES.items():
        source = table["source"]
        assert source["repository"] == "google/cel-spec"
        assert source["path"] == f"tests/simple/testdata/{file}.textproto"
        assert len(source["commit"]) == 40


def test_every_case_that_is_not_run_says_why() -> None:
    for table in TABLES.values():
        for case in table["cases"]:
            for key in ("skip", "divergence", "kubernetesCompileError"):
                assert case.get(key, "x").strip(), f"{case['name']}: empty {key} reason"


@pytest.mark.parametrize("case", _params())
def test_celspec_case(case: dict[str, Any]) -> None:
    outcome = run_case(case)
    assert outcome.status != "crashed", outcome.detail
    if "divergence" in case:
        assert outcome.status == "failed", (
            f"listed as a divergence ({case['divergence']}) but passes: remove it from the data"
        )
        return
    assert outcome.status == "passed", outcome.detail


def pass_counts() -> dict[str, tuple[int, int, int]]:
    """Per file: (passed, applicable, skipped as not applicable)."""
    counts = {}
    for file, table in TABLES.items():
        cases = table["cases"]
        applicable = [c for c in cases if "skip" not in c]
        passed = sum(run_case(c).status == "passed" for c in applicable)
        counts[file] = (passed, len(applicable), len(cases) - len(applicable))
    return counts


def summary(counts: Mapping[str, tuple[int, int, int]]) -> str:
    """The per-file pass counts as a small table."""
    lines = [f"{'file':<14} {'passed':>7} {'of':>5} {'skipped':>8}"]
    for file, (passed, applicable, skipped) in counts.items():
        lines.append(f"{file:<14} {passed:>7} {applicable:>5} {skipped:>8}")
    total = [sum(c[i] for c in counts.values()) for i in range(3)]
    lines.append(f"{'total':<14} {total[0]:>7} {total[1]:>5} {total[2]:>8}")
    return "\n".join(lines)


def test_pass_rate_summary(capsys: pytest.CaptureFixture[str]) -> None:
    counts = pass_counts()
    with capsys.disabled():
        print("\ncel-spec conformance\n" + summary(counts))
    passed = sum(c[0] for c in counts.values())
    applicable = sum(c[1] for c in counts.values())
    assert passed >= REQUIRED_PASS_RATE * applicable, summary(counts)


if __name__ == "__main__":
    print(summary(pass_counts()))
