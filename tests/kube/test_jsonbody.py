"""JSON bodies nested as deep as the API server allows decode, pruned to a safe depth."""

from __future__ import annotations

import json
import threading

import pytest

from sharegpu.kube import jsonbody
from sharegpu.kube.jsonbody import KEPT_DEPTH, MAX_DEPTH, PRUNED, NestingError, decode


def _nested(depth: int, leaf: str = "1") -> str:
    return '{"a":' * depth + leaf + "}" * depth


def _depth(value: object) -> int:
    depth = 0
    while isinstance(value, dict):
        depth += 1
        value = value.get("a")
    return depth


def test_shallow_bodies_decode_exactly_as_json_loads() -> None:
    body = '{"kind": "ResourceClaim", "spec": {"devices": {"requests": [{"name": "gpu"}]}}}'
    assert decode(body) == json.loads(body)
    assert decode(body.encode()) == json.loads(body)


@pytest.mark.parametrize("depth", [3_000, 5_000, MAX_DEPTH - 1])
def test_bodies_as_deep_as_the_api_server_accepts_decode_pruned(depth: int) -> None:
    body = '{"keep": {"x": 1}, "deep": ' + _nested(depth) + "}"
    obj = decode(body)
    assert obj["keep"] == {"x": 1}
    assert _depth(obj["deep"]) == KEPT_DEPTH - 1
    inner = obj["deep"]
    for _ in range(KEPT_DEPTH - 2):
        inner = inner["a"]
    assert inner == {"a": PRUNED}
    # The result can be walked by anything recursive again.
    json.dumps(obj)


def test_lists_are_pruned_like_objects() -> None:
    body = "[" * 4_000 + "1" + "]" * 4_000
    obj = decode(body)
    depth = 0
    while isinstance(obj, list):
        depth += 1
        obj = obj[0]
    assert depth == KEPT_DEPTH and obj == PRUNED


def test_deeper_than_the_api_server_allows_is_an_error() -> None:
    with pytest.raises(NestingError, match=f"nested deeper than {MAX_DEPTH} levels"):
        decode(_nested(3 * MAX_DEPTH))


def test_invalid_deep_json_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        decode(_nested(5_000)[:-1])


def test_the_recursion_limit_is_restored_and_threads_keep_their_stack() -> None:
    import sys

    limit, stack = sys.getrecursionlimit(), threading.stack_size()
    decode(_nested(5_000))
    assert (sys.getrecursionlimit(), threading.stack_size()) == (limit, stack)


def test_bodies_are_encoded_as_go_encodes_them() -> None:
    """An opaque config's parameters come back in a claim as Go wrote them (compact, HTML
    characters escaped, the rest as UTF-8); a status update must send them back byte for byte,
    or the API server refuses it as a change of the immutable allocation (found on a real
    kube-apiserver 1.37.2: 'status.allocation: field cannot be modified once set')."""
    parameters = {"kind": "GpuConfig", "note": "<a & b> é\u2028", "sharing": {"strategy": "MPS"}}
    go = (
        b'{"kind":"GpuConfig","note":"\\u003ca \\u0026 b\\u003e \xc3\xa9\\u2028",'
        b'"sharing":{"strategy":"MPS"}}'
    )
    assert jsonbody.encode(parameters) == go
    assert jsonbody.decode(jsonbody.encode(parameters)) == parameters
    assert jsonbody.encode([1, 2.5, None, True, "\n\u001f"]) == b'[1,2.5,null,true,"\\n\\u001f"]'
    with pytest.raises(ValueError):
        jsonbody.encode({"x": float("nan")})
