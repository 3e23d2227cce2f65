"""Hostile input to ``sharegpu validate`` and ``sharegpu explain``: one bounded loader.

Every input beyond a limit (file and total size, documents, objects, nesting, alias expansion,
integer literals) fails fast with one line on stderr naming the file, the problem and the
limit, exit code 1 (like invalid YAML), and never a traceback. The timeouts are hang guards:
each input is refused after reading its own text, in well under a second.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from sharegpuctl.cli import main
from sharegpuctl.cli.loading import MANIFEST_LIMITS, MAX_INT_CHARS
from tests.helpers import HANG_GUARD_S

LIMITS = MANIFEST_LIMITS
CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "c"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
}


def refused(capsys: pytest.CaptureFixture[str], *argv: str, command: str = "validate") -> str:
    """Run the command; it must fail with exit code 1 and exactly one line on stderr."""
    code = main([command, *argv])
    captured = capsys.readouterr()
    assert code == 1, captured.out + captured.err
    assert "Traceback" not in captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err[:2000]
    assert lines[0].startswith(f"sharegpu {command}: error: ")
    return lines[0]


def laughs(levels: int) -> str:
    """A ConfigMap whose last alias expands to 9**levels strings ("billion laughs")."""
    lines = ["apiVersion: v1", "kind: ConfigMap", "metadata: {name: lol}", "data:"]
    lines.append('  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]')
    for i in range(1, levels):
        lines.append(f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(60)
def test_alias_bomb_is_refused_before_expansion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(laughs(7))  # 9**7 = 4.8 million strings from 400 bytes
    line = refused(capsys, "-f", str(bomb))
    # one of the uses of *a4 (about 66 000 nodes each) on line 10 passes the limit
    assert line.startswith(f"sharegpu validate: error: {bomb}: line 10, column 42: ")
    assert f"alias *a4 expands the input to more than {LIMITS.nodes} YAML nodes" in line
    assert f"(limit: {LIMITS.nodes} nodes for all files, aliases expanded)" in line


def test_small_aliases_stay_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Anchors for repeated blocks (merge keys included) are what real manifests use."""
    f = tmp_path / "anchors.yaml"
    f.write_text(
        "apiVersion: v1\nkind: List\nitems:\n"
        "- {apiVersion: v1, kind: ConfigMap, metadata: &md {name: a, labels: {x: y}}}\n"
        "- {apiVersion: v1, kind: ConfigMap, metadata: {<<: *md, name: b}, data: &d {k: v}}\n"
        "- {apiVersion: v1, kind: ConfigMap, metadata: {name: c, labels: *d}}\n"
    )
    assert main(["validate", "-f", str(f), "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["objects"], report["errors"]) == (3, 0)


def test_recursive_alias_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "loop.yaml"
    f.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: &d {a: *d}\n")
    line = refused(capsys, "-f", str(f))
    assert line == (
        f"sharegpu validate: error: {f}: line 4, column 14: alias *d refers to a collection "
        "that contains it; a recursive document has no JSON form"
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        "".join(" " * i + "- \n" for i in range(150)) + " " * 150 + "x\n",
        "a: &deep " + "[" * 60 + "]" * 60 + "\nb: " + "[" * 50 + "*deep" + "]" * 50 + "\n",
    ],
    ids=["flow", "block", "through-alias"],
)
def test_deep_nesting_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    f = tmp_path / "deep.yaml"
    f.write_text(text)
    line = refused(capsys, "-f", str(f))
    assert line.startswith(f"sharegpu validate: error: {f}: line ")
    assert line.endswith(f"nested more than {LIMITS.depth} levels deep (limit: 100 levels)") or (
        line.endswith("nested more than 100 levels deep (through alias *deep) (limit: 100 levels)")
    )


def test_nesting_up_to_the_limit_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "ok.yaml"
    f.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\nbinaryData: {}\n"
        "x: " + "[" * 99 + "]" * 99 + "\n"
    )
    assert main(["validate", "-f", str(f), "-o", "json"]) == 1  # a schema error, not a limit
    report = json.loads(capsys.readouterr().out)
    assert report["objects"] == 1
    assert report["findings"][0]["message"].startswith("schema (Kubernetes 1.37): ")


@pytest.mark.timeout(60)
def test_file_larger_than_the_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "big.yaml"
    f.write_text(yaml.safe_dump(CLAIM) + "#" * (LIMITS.file_bytes))
    line = refused(capsys, "-f", str(f))
    assert line.startswith(f"sharegpu validate: error: {f}: too large: 4.0 MiB")
    assert line.endswith("(limit: 4 MiB per file)")


@pytest.mark.timeout(120)
def test_directory_larger_than_the_total_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    padding = "#" * (LIMITS.file_bytes - 4096) + "\n"
    for i in range(5):  # each file is under the per-file limit, together over 16 MiB
        (tmp_path / f"part-{i}.yaml").write_text(yaml.safe_dump(CLAIM) + padding)
    line = refused(capsys, "-f", str(tmp_path))
    assert line == (
        f"sharegpu validate: error: {tmp_path / 'part-4.yaml'}: too much input: the files read "
        "so far total more than 16 MiB (limit: 16 MiB for all files)"
    )


def test_standard_input_larger_than_the_limit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("#" * (LIMITS.file_bytes + 1)))
    line = refused(capsys, "-f", "-")
    assert line == (
        "sharegpu validate: error: -: too large: more than 4 MiB (limit: 4 MiB per file)"
    )


@pytest.mark.timeout(60)
def test_too_many_documents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "many.yaml"
    f.write_text("---\na: 1\n" * (LIMITS.documents + 1))
    line = refused(capsys, "-f", str(f))
    assert line == (
        f"sharegpu validate: error: {f}: line {2 * LIMITS.documents + 1}, column 1: more than "
        f"{LIMITS.documents} YAML documents (limit: {LIMITS.documents} per file)"
    )


@pytest.mark.timeout(60)
def test_too_many_objects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "list.json"
    items = [{**CLAIM, "metadata": {"name": f"c{i}"}} for i in range(LIMITS.objects + 1)]
    f.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    line = refused(capsys, "-f", str(f))
    assert line == (
        f"sharegpu validate: error: {f}: more than {LIMITS.objects} objects "
        f"(limit: {LIMITS.objects} objects for all files)"
    )


@pytest.mark.timeout(60)
def test_too_many_nodes_without_aliases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "wide.yaml"
    f.write_text("items: [" + ",".join(["1"] * LIMITS.nodes) + "]\n")
    line = refused(capsys, "-f", str(f))
    assert line.startswith(f"sharegpu validate: error: {f}: line 1, column ")
    assert line.endswith(
        f"more than {LIMITS.nodes} YAML nodes "
        f"(limit: {LIMITS.nodes} nodes for all files, aliases expanded)"
    )


@pytest.mark.timeout(60)
def test_long_integer_literal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Python refuses to convert more than 4300 digits; the loader refuses long ones first."""
    f = tmp_path / "int.yaml"
    f.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: " + "9" * 5000 + "}"
    )
    line = refused(capsys, "-f", str(f))
    assert line == (
        f"sharegpu validate: error: {f}: line 4, column 11: integer of 5000 characters "
        f"(limit: {MAX_INT_CHARS} characters)"
    )


@pytest.mark.timeout(HANG_GUARD_S)
def test_huge_quantity_is_an_error_answered_quickly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "q.yaml"
    claim = json.loads(json.dumps(CLAIM))
    exactly = claim["spec"]["devices"]["requests"][0]["exactly"]
    exactly.update(
        deviceClassName="gpu.sharegpu.dev",
        capacity={"requests": {"cores": "30", "memory": "1e1000000"}},
    )
    f.write_text(yaml.safe_dump(claim))
    code = main(["validate", "-f", str(f), "-o", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    [error] = [x for x in report["findings"] if x["severity"] == "error"]
    assert error["path"] == "spec.devices.requests[0].exactly.capacity.requests[memory]"
    assert error["message"].startswith("invalid quantity '1e1000000': out of range")


def test_long_schema_messages_are_shortened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A schema message quotes the offending value; a large value does not flood the output."""
    f = tmp_path / "cm.yaml"
    f.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"
        "data: {a: [" + ",".join(f"v{i}" for i in range(50_000)) + "]}\n"
    )
    assert main(["validate", "-f", str(f), "-o", "json"]) == 1
    [finding] = json.loads(capsys.readouterr().out)["findings"]
    assert finding["message"].startswith("schema (Kubernetes 1.37): ['v0', 'v1'")
    assert " ... " in finding["message"]
    assert finding["message"].endswith("is not of type 'string', 'null'")
    assert len(finding["message"]) < 500


@pytest.mark.timeout(60)
def test_explain_reads_through_the_same_loader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(laughs(7))
    line = refused(capsys, "-f", str(bomb), command="explain")
    assert f"{bomb}: line 10, column 42: alias *a4 expands the input to more than" in line
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    line = refused(capsys, "-f", str(bomb), "--classes", str(empty), command="explain")
    assert "alias *a4" in line  # -f is read first
    claims = tmp_path / "c.yaml"
    claims.write_text(yaml.safe_dump(CLAIM))
    line = refused(capsys, "-f", str(claims), "--classes", str(empty), command="explain")
    assert line == (
        f"sharegpu explain: error: no Kubernetes objects found in {empty}: the file is empty "
        "or holds only comments"
    )
