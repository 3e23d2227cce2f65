"""The admission checks take any decoded JSON: a field of the wrong type, or beyond one of
Kubernetes' limits, is an error finding with its path (marked ``malformed``), never an
exception; and the work spent on one object is bounded whatever it holds."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.names import DEFAULT_DRIVER_NAME as DRIVER
from sharegpu.admission import checks, shape
from sharegpu.admission.checks import ERROR, WARNING, Finding, check_object
from sharegpu.cel import cache_info, clear_cache
from tests.helpers import HANG_GUARD_S
from tests.jsondata import json_paths

D = f"device.attributes['{DRIVER}']"
PARAMETERS = {
    "apiVersion": "resource.sharegpu.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 20}},
}


def exact(selectors: list[str] | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "deviceClassName": DRIVER,
        "capacity": {"requests": {"cores": "30", "memory": "4Gi"}},
        **fields,
    }
    if selectors is not None:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return body


def claim(requests: list[Any] | None = None, config: list[Any] | None = None) -> dict[str, Any]:
    if requests is None:
        requests = [
            {"name": "gpu", "exactly": exact([f"{D}.productName == 'H100'"])},
            {"name": "any", "firstAvailable": [{"name": "big", **exact()}]},
        ]
    if config is None:
        config = [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": PARAMETERS}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": requests, "config": config}},
    }


def template() -> dict[str, Any]:
    spec = claim()["spec"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"metadata": {"labels": {"a": "b"}}, "spec": spec},
    }


def device_class(selectors: list[str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {
            "selectors": [
                {"cel": {"expression": e}}
                for e in (selectors if selectors is not None else [f"device.driver == '{DRIVER}'"])
            ],
            "config": [{"opaque": {"driver": DRIVER, "parameters": PARAMETERS}}],
        },
    }


def with_value(obj: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(obj)
    node: Any = changed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return changed


def malformed(findings: list[Finding]) -> list[str]:
    """The malformed-shape errors of ``findings``, as ``path: message``."""
    marked = [f for f in findings if getattr(f, "malformed", False)]
    assert all(f.severity == ERROR for f in marked)
    return [str(f) for f in marked]


def test_the_valid_objects_have_no_errors() -> None:
    for obj in (claim(), template(), device_class()):
        assert checks.errors(check_object(obj, DRIVER)) == [], obj["kind"]


REQ0 = ("spec", "devices", "requests", 0)
SHAPES: list[tuple[str, Callable[[], dict[str, Any]], tuple[str | int, ...], Any, str]] = [
    ("metadata a list", claim, ("metadata",), [1], "metadata: must be an object, got a list"),
    ("name a number", claim, ("metadata", "name"), 1, "metadata.name: must be a string, got a"),
    ("spec a string", claim, ("spec",), "x", "spec: must be an object, got a string"),
    ("devices a list", claim, ("spec", "devices"), [], "spec.devices: must be an object, got a"),
    (
        "requests an object",
        claim,
        ("spec", "devices", "requests"),
        {"a": 1},
        "spec.devices.requests: must be a list, got an object",
    ),
    ("a request a string", claim, REQ0, "x", "spec.devices.requests[0]: must be an object"),
    ("a request null", claim, REQ0, None, "spec.devices.requests[0]: must not be null"),
    (
        "a request name a list",
        claim,
        (*REQ0, "name"),
        [1],
        "spec.devices.requests[0].name: must be a string, got a list",
    ),
    (
        "exactly a boolean",
        claim,
        (*REQ0, "exactly"),
        True,
        "spec.devices.requests[0].exactly: must be an object, got a boolean",
    ),
    (
        "deviceClassName a list",
        claim,
        (*REQ0, "exactly", "deviceClassName"),
        [DRIVER],
        "spec.devices.requests[0].exactly.deviceClassName: must be a string, got a list",
    ),
    (
        "selectors an object",
        claim,
        (*REQ0, "exactly", "selectors"),
        {"cel": {}},
        "spec.devices.requests[0].exactly.selectors: must be a list, got an object",
    ),
    (
        "cel a string",
        claim,
        (*REQ0, "exactly", "selectors", 0, "cel"),
        "true",
        "spec.devices.requests[0].exactly.selectors[0].cel: must be an object, got a string",
    ),
    (
        "expression a number",
        claim,
        (*REQ0, "exactly", "selectors", 0, "cel", "expression"),
        1,
        "spec.devices.requests[0].exactly.selectors[0].cel.expression: must be a string",
    ),
    (
        "capacity a list",
        claim,
        (*REQ0, "exactly", "capacity"),
        [],
        "spec.devices.requests[0].exactly.capacity: must be an object, got a list",
    ),
    (
        "capacity.requests a list",
        claim,
        (*REQ0, "exactly", "capacity", "requests"),
        ["cores"],
        "spec.devices.requests[0].exactly.capacity.requests: must be an object, got a list",
    ),
    (
        "a capacity request an object",
        claim,
        (*REQ0, "exactly", "capacity", "requests", "cores"),
        {"value": 30},
        "capacity.requests[cores]: must be a quantity (a string such as '4Gi', or a number), "
        "got an object",
    ),
    (
        "a capacity request a boolean",
        claim,
        (*REQ0, "exactly", "capacity", "requests", "memory"),
        True,
        "capacity.requests[memory]: must be a quantity",
    ),
    (
        "a capacity request null",
        claim,
        (*REQ0, "exactly", "capacity", "requests", "memory"),
        None,
        "capacity.requests[memory]: must be a quantity (a string such as '4Gi', or a number), "
        "got null",
    ),
    (
        "firstAvailable a string",
        claim,
        ("spec", "devices", "requests", 1, "firstAvailable"),
        "x",
        "spec.devices.requests[1].firstAvailable: must be a list, got a string",
    ),
    (
        "a subrequest a number",
        claim,
        ("spec", "devices", "requests", 1, "firstAvailable", 0),
        7,
        "spec.devices.requests[1].firstAvailable[0]: must be an object, got a number",
    ),
    (
        "a subrequest name an object",
        claim,
        ("spec", "devices", "requests", 1, "firstAvailable", 0, "name"),
        {},
        "spec.devices.requests[1].firstAvailable[0].name: must be a string, got an object",
    ),
    (
        "config an object",
        claim,
        ("spec", "devices", "config"),
        {},
        "spec.devices.config: must be a list, got an object",
    ),
    (
        "a config entry a string",
        claim,
        ("spec", "devices", "config", 0),
        "x",
        "spec.devices.config[0]: must be an object, got a string",
    ),
    (
        "config requests a string",
        claim,
        ("spec", "devices", "config", 0, "requests"),
        "gpu",
        "spec.devices.config[0].requests: must be a list, got a string",
    ),
    (
        "a config request a number",
        claim,
        ("spec", "devices", "config", 0, "requests", 0),
        1,
        "spec.devices.config[0].requests[0]: must be a string, got a number",
    ),
    (
        "opaque a list",
        claim,
        ("spec", "devices", "config", 0, "opaque"),
        [],
        "spec.devices.config[0].opaque: must be an object, got a list",
    ),
    (
        "driver a number",
        claim,
        ("spec", "devices", "config", 0, "opaque", "driver"),
        1,
        "spec.devices.config[0].opaque.driver: must be a string, got a number",
    ),
    ("template spec a list", template, ("spec",), [], "spec: must be an object, got a list"),
    (
        "template spec.spec a string",
        template,
        ("spec", "spec"),
        "x",
        "spec.spec: must be an object, got a string",
    ),
    (
        "template spec.metadata a list",
        template,
        ("spec", "metadata"),
        [],
        "spec.metadata: must be an object, got a list",
    ),
    (
        "template request a number",
        template,
        ("spec", "spec", "devices", "requests", 0),
        1,
        "spec.spec.devices.requests[0]: must be an object, got a number",
    ),
    ("class spec a number", device_class, ("spec",), 1, "spec: must be an object, got a number"),
    (
        "class selectors a string",
        device_class,
        ("spec", "selectors"),
        "x",
        "spec.selectors: must be a list, got a string",
    ),
    (
        "class config entry a list",
        device_class,
        ("spec", "config", 0),
        [],
        "spec.config[0]: must be an object, got a list",
    ),
]


@pytest.mark.parametrize(
    ("build", "path", "value", "expected"), [c[1:] for c in SHAPES], ids=[c[0] for c in SHAPES]
)
def test_a_field_of_the_wrong_type_is_an_error_naming_its_path(
    build: Callable[[], dict[str, Any]], path: tuple[str | int, ...], value: Any, expected: str
) -> None:
    found = check_object(with_value(build(), path, value), DRIVER)
    problems = malformed(found)
    assert any(expected in p for p in problems), problems
    assert len(checks.errors(found)) == len(problems)  # the rules did not run


def test_null_is_an_absent_field() -> None:
    obj = claim()
    obj["metadata"]["name"] = None
    obj["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = None
    obj["spec"]["devices"]["config"] = None
    assert checks.errors(check_object(obj, DRIVER)) == []


def test_an_object_that_is_not_a_json_object_is_malformed_at_the_root() -> None:
    for check in (checks.check_resource_claim, checks.check_resource_claim_template):
        assert malformed(check([1], DRIVER)) == ["<root>: must be an object, got a list"]  # type: ignore[arg-type]
    assert malformed(checks.check_device_class("x", DRIVER)) == [  # type: ignore[arg-type]
        "<root>: must be an object, got a string"
    ]
    assert check_object([1], DRIVER) == []  # type: ignore[arg-type]


# --- Kubernetes' limits ----------------------------------------------------------------------


def selectors(count: int) -> list[str]:
    return [f"{D}.productName == 'H{i}'" for i in range(count)]


LIMITS: list[tuple[str, dict[str, Any], str]] = [
    (
        "33 selectors in a request",
        claim([{"name": "gpu", "exactly": exact(selectors(33))}]),
        "spec.devices.requests[0].exactly.selectors: must have at most 32 items "
        "(Kubernetes' DeviceSelectorsMaxSize is 32), got 33",
    ),
    (
        "33 requests",
        claim([{"name": f"r{i}", "exactly": exact()} for i in range(33)]),
        "spec.devices.requests: must have at most 32 items (Kubernetes' DeviceRequestsMaxSize "
        "is 32), got 33",
    ),
    (
        "9 subrequests",
        claim([{"name": "r", "firstAvailable": [{"name": f"s{i}", **exact()} for i in range(9)]}]),
        "spec.devices.requests[0].firstAvailable: must have at most 8 items "
        "(Kubernetes' FirstAvailableDeviceRequestMaxSize is 8), got 9",
    ),
    (
        "33 config entries",
        claim(config=[{"opaque": {"driver": "other.example.com", "parameters": {}}}] * 33),
        "spec.devices.config: must have at most 32 items (Kubernetes' DeviceConfigMaxSize is 32), "
        "got 33",
    ),
    (
        "a selector over 10 KiB",
        claim([{"name": "gpu", "exactly": exact(["'" + "x" * 10240 + "' == ''"])}]),
        "spec.devices.requests[0].exactly.selectors[0].cel.expression: must be at most 10240 "
        "bytes long (Kubernetes' CELSelectorExpressionMaxLength is 10240), got 10248",
    ),
    (
        "a selector over 10 KiB in UTF-8 only",
        claim([{"name": "gpu", "exactly": exact(["'" + "é" * 5200 + "' == ''"])}]),
        "cel.expression: must be at most 10240 bytes long (Kubernetes' "
        "CELSelectorExpressionMaxLength is 10240), got 10408",
    ),
    (
        "opaque parameters over 10 KiB",
        claim(
            config=[{"opaque": {"driver": "other.example.com", "parameters": {"x": "y" * 10240}}}]
        ),
        "spec.devices.config[0].opaque.parameters: must be at most 10240 bytes of JSON "
        "(Kubernetes' OpaqueParametersMaxLength is 10240)",
    ),
    (
        "33 class selectors",
        device_class(selectors(33)),
        "spec.selectors: must have at most 32 items (Kubernetes' DeviceSelectorsMaxSize is 32), "
        "got 33",
    ),
]


@pytest.mark.parametrize(("obj", "expected"), [c[1:] for c in LIMITS], ids=[c[0] for c in LIMITS])
def test_beyond_a_kubernetes_limit_is_an_error_naming_the_limit(
    obj: dict[str, Any], expected: str
) -> None:
    clear_cache()
    problems = malformed(check_object(obj, DRIVER))
    assert any(expected in p for p in problems), problems
    assert cache_info().misses == 0  # refused before any selector was compiled


def test_deeply_nested_parameters_are_measured_without_recursion() -> None:
    deep: Any = "leaf"
    for _ in range(100_000):
        deep = [deep]
    obj = claim(config=[{"opaque": {"driver": "other.example.com", "parameters": deep}}])
    problems = malformed(check_object(obj, DRIVER))
    assert any("OpaqueParametersMaxLength" in p for p in problems), problems
    assert not shape.json_length_above({"a": [1, 2.5, None, True, "é"]}, 40)
    assert shape.json_length_above({"a": [1, 2.5, None, True, "é"]}, 20)


# --- the work of one object ------------------------------------------------------------------


def distinct_selectors(count: int, size: int) -> list[str]:
    """``count`` distinct selectors of ``size`` bytes naming the driver."""
    out = []
    for i in range(count):
        head = f"{D}.productName == '{i}"
        out.append(head + "x" * (size - len(head) - 1) + "'")
    return out


def spread(exprs: list[str]) -> list[dict[str, Any]]:
    """Requests of at most 32 selectors each, holding ``exprs``."""
    return [
        {"name": f"r{i}", "exactly": exact(exprs[j : j + 32])}
        for i, j in enumerate(range(0, len(exprs), 32))
    ]


@pytest.mark.parametrize(
    ("exprs", "what"),
    [
        (distinct_selectors(3, 6 * 1024), "3 distinct selectors naming gpu.sharegpu.dev, 18432 "),
        (distinct_selectors(65, 60), "65 distinct selectors naming"),
        (distinct_selectors(250, 10 * 1024), "250 distinct selectors naming"),
    ],
    ids=["bytes", "count", "250 of 10 KiB"],
)
@pytest.mark.timeout(HANG_GUARD_S)
def test_too_much_selector_text_is_refused_without_compiling_it(
    exprs: list[str], what: str
) -> None:
    clear_cache()
    for obj in (
        claim(spread(exprs)),
        with_value(template(), ("spec", "spec"), claim(spread(exprs))["spec"]),
    ):
        found = check_object(obj, DRIVER)
        # Kubernetes accepts the object: it is not denied, its selectors are not compiled.
        assert [f.severity for f in found] == [WARNING], found
        assert found[0].message.startswith("not checked: ")
        assert what in found[0].message
        assert "compiles at most 64 selectors and 16384 bytes of them per object" in (
            found[0].message
        )
    assert cache_info().misses == 0  # bounded work: not one selector was compiled


def test_the_class_selector_budget() -> None:
    clear_cache()
    found = check_object(device_class(distinct_selectors(3, 6 * 1024)), DRIVER)
    assert [f.path for f in found] == ["spec.selectors"]
    assert "per object" in found[0].message and cache_info().misses == 0


def test_repeated_and_foreign_selectors_do_not_count_against_the_budget() -> None:
    same = distinct_selectors(1, 4 * 1024) * 200  # one distinct selector, 200 times
    foreign = [f"device.attributes['x.example.com'].n == {i}" + " " * 8000 for i in range(20)]
    found = check_object(claim(spread(same + foreign)), DRIVER)
    assert checks.errors(found) == [], found


def test_unknown_capacities_are_reported_a_few_at_a_time() -> None:
    requests = {f"c{i}": "1" for i in range(10_000)}
    obj = claim([{"name": "gpu", "exactly": exact(capacity={"requests": requests})}])
    found = checks.errors(check_object(obj, DRIVER))
    assert len(found) == 9  # 8 named, then how many more
    assert "and 9992 more capacities gpu.sharegpu.dev devices do not have" in found[-1].message


# --- any value anywhere ------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


VALID = [claim(), template(), device_class()]
PLACES = [(obj, path) for obj in VALID for path in json_paths(obj) if path]


@settings(max_examples=300)
@given(st.sampled_from(PLACES), JSON)
def test_any_value_anywhere_gives_findings_never_an_exception(
    place: tuple[dict[str, Any], tuple[str | int, ...]], value: Any
) -> None:
    obj, path = place
    found = check_object(with_value(obj, path, value), DRIVER, [DRIVER])
    assert all(isinstance(f, Finding) and f.severity in (ERROR, "warning") for f in found)
