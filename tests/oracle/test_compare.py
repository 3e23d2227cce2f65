"""The comparison of answers: what counts as a disagreement and what does not."""

from __future__ import annotations

from typing import Any

from tests.oracle.compare import compare, error_class


def _allocated(*results: dict[str, Any], config: list[Any] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"results": list(results)}
    if config is not None:
        devices["config"] = config
    return {"results": [{"devices": devices}]}


def _result(device: str, **extra: Any) -> dict[str, Any]:
    return {"request": "r", "driver": "d", "pool": "p", "device": device, **extra}


def test_selector_outcomes() -> None:
    assert compare("c", "cel", {"value": True}, {"value": True}) == []
    assert compare("c", "cel", {"evalError": "x"}, {"evalError": "y"}) == []
    (d,) = compare("c", "cel", {"compileError": "x"}, {"value": False})
    assert (d.aspect, d.upstream, d.sharegpu) == ("outcome", "compile-error", "false")


def test_error_classes_not_wording() -> None:
    assert error_class("claim a, request b: could not retrieve device class x: not found") == (
        "class-missing"
    )
    assert error_class("class gpu: selector #0 on device d/p/x: CEL runtime error: boom") == (
        "cel-runtime"
    )
    assert error_class("something else") == "other"
    upstream = {"error": 'claim a: could not retrieve device class x: deviceclasses "x" not found'}
    assert (
        compare(
            "c",
            "allocate",
            upstream,
            {"error": "claim a: could not retrieve device class x: not found"},
        )
        == []
    )
    (d,) = compare("c", "allocate", upstream, {"unsatisfiable": True})
    assert (d.upstream, d.sharegpu) == ("error:class-missing", "unsatisfiable")


def test_devices_in_order_and_amounts_exactly() -> None:
    up = _allocated(_result("a", shareID="u1", consumedCapacity={"memory": "1Gi"}), _result("b"))
    same = _allocated(
        _result("a", shareID="s9", consumedCapacity={"memory": "1073741824"}), _result("b")
    )
    assert compare("c", "allocate", up, same) == []
    swapped = _allocated(
        _result("b"), _result("a", shareID="s9", consumedCapacity={"memory": "1Gi"})
    )
    assert [d.aspect for d in compare("c", "allocate", up, swapped)] == ["devices"]
    more = _allocated(
        _result("a", shareID="s9", consumedCapacity={"memory": "1025Mi"}), _result("b")
    )
    assert [d.aspect for d in compare("c", "allocate", up, more)] == ["consumed-capacity"]
    whole = _allocated(_result("a", consumedCapacity={"memory": "1Gi"}), _result("b"))
    assert [d.aspect for d in compare("c", "allocate", up, whole)] == ["share"]


def test_config_compared() -> None:
    config = [{"source": "FromClass", "opaque": {"driver": "d", "parameters": {}}}]
    per_request = [{**config[0], "requests": ["r"]}]
    up = _allocated(_result("a"), config=config)
    assert compare("c", "allocate", up, _allocated(_result("a"), config=config)) == []
    (d,) = compare("c", "allocate", up, _allocated(_result("a"), config=per_request))
    assert d.aspect == "config"
