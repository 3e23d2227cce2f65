"""Hints in the messages of the shared checks: what is wrong, where, and how to fix it.

The admission webhook and ``sharegpu validate`` share these checks, so every hint here only
improves the message of a finding that exists, or is used by ``validate`` alone
(:func:`checks.request_field_hints`); none adds a denial.
"""

from __future__ import annotations

from typing import Any

import pytest

from api.gpuconfig import GpuConfigError, parse_gpu_config
from api.names import DEFAULT_DRIVER_NAME as DRIVER
from api.quantity import quantity_hint
from sharegpu.admission import checks

Obj = dict[str, Any]
CAP = "spec.devices.requests[0].exactly.capacity.requests["


def claim(request: Obj, version: str = "resource.k8s.io/v1") -> Obj:
    return {
        "apiVersion": version,
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {"devices": {"requests": [request]}},
    }


def share(cores: Any, memory: Any) -> Obj:
    requests = {"cores": cores, "memory": memory}
    return claim(
        {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "capacity": {"requests": requests}}}
    )


def gpu_config_messages(**fields: Any) -> list[str]:
    with pytest.raises(GpuConfigError) as info:
        parse_gpu_config({"apiVersion": "resource.sharegpu.dev/v1alpha1", **fields})
    return list(info.value.messages)


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("10GB", '"10GB" is not a Kubernetes quantity: use 10G (10^9 bytes) or 10Gi (2^30 bytes)'),
        ("10gi", '"10gi" is not a Kubernetes quantity: use 10G (10^9 bytes) or 10Gi (2^30 bytes)'),
        (
            "512MiB",
            '"512MiB" is not a Kubernetes quantity: use 512M (10^6 bytes) or 512Mi (2^20 bytes)',
        ),
        ("1KB", '"1KB" is not a Kubernetes quantity: use 1k (10^3 bytes) or 1Ki (2^10 bytes)'),
        (
            "30%",
            '"30%" is not a Kubernetes quantity: write 30 without "%"; cores are a number from '
            "1 to 100 (percent of a GPU), memory is bytes such as 10Gi",
        ),
        ("10Gi", None),
        ("500m", None),
        ("lots", None),
        (30, None),
    ],
)
def test_quantity_hint_is_one_rule_for_near_misses(text: Any, hint: str | None) -> None:
    assert quantity_hint(text) == hint


def test_malformed_quantities_get_the_hint_and_no_false_half_share_warning() -> None:
    findings = checks.check_object(share("30%", "10GB"), DRIVER)
    assert [(f.severity, f.path, f.message) for f in findings] == [
        ("error", f"{CAP}cores]", quantity_hint("30%")),
        ("error", f"{CAP}memory]", quantity_hint("10GB")),
    ]
    # Memory is requested, only misspelled: no "memory not requested" warning.
    findings = checks.check_object(share("30", "10gi"), DRIVER)
    assert [(f.severity, f.message) for f in findings] == [("error", quantity_hint("10gi"))]


def test_gpuconfig_quantity_field_gets_the_hint() -> None:
    messages = gpu_config_messages(
        kind="GpuConfig", sharing={"strategy": "MPS", "mps": {"pinnedMemoryLimit": "10GB"}}
    )
    assert messages == [
        'sharing.mps.pinnedMemoryLimit: must be a quantity such as "10Gi" (got "10GB"); '
        '"10GB" is not a Kubernetes quantity: use 10G (10^9 bytes) or 10Gi (2^30 bytes)'
    ]


def test_gpuconfig_unknown_field_gets_a_did_you_mean() -> None:
    assert gpu_config_messages(kind="GpuConfig", sharing={"stratgy": "MPS"}) == [
        "sharing.stratgy: unknown field; did you mean strategy? "
        "(fields here: strategy, timeSlicing, mps, limits, burstLimit, burstPolicy)"
    ]


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("GPUConfig", 'kind: must be GpuConfig (got "GPUConfig") (names are case-sensitive)'),
        ("GpuConfg", 'kind: must be GpuConfig (got "GpuConfg")'),
    ],
)
def test_gpuconfig_kind_says_the_right_name(kind: str, message: str) -> None:
    assert gpu_config_messages(kind=kind) == [message]


def test_v1beta1_request_shape_in_v1_says_to_use_exactly() -> None:
    flat = {"name": "gpu", "deviceClassName": DRIVER, "count": 1, "capacity": {"requests": {}}}
    hints = checks.request_field_hints(claim(flat))
    assert [(h.severity, h.path, h.message) for h in hints] == [
        (
            "error",
            "spec.devices.requests[0]",
            "deviceClassName, count, capacity: in resource.k8s.io/v1, put deviceClassName, "
            "count, selectors and capacity under `exactly:`",
        )
    ]
    # The same request is right in v1beta1, and the webhook's checks never carry this hint.
    assert checks.request_field_hints(claim(flat, "resource.k8s.io/v1beta1")) == []
    assert not any("exactly:" in f.message for f in checks.check_object(claim(flat), DRIVER))


@pytest.mark.parametrize("key", ["exact", "Exactly"])
def test_misspelled_exactly_gets_a_did_you_mean(key: str) -> None:
    hints = checks.request_field_hints(claim({"name": "gpu", key: {"deviceClassName": DRIVER}}))
    assert [h.message for h in hints] == [
        f"{key!r} is not a field of a request; did you mean 'exactly'? "
        "(fields: name, exactly, firstAvailable)"
    ]


def test_template_requests_get_the_same_hints() -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exact": {}}]}}},
    }
    [hint] = checks.request_field_hints(template)
    assert hint.path == "spec.spec.devices.requests[0]"
    assert "did you mean 'exactly'?" in hint.message


def test_comparing_a_capacity_with_a_string_suggests_compare_to() -> None:
    expr = f"device.capacity['{DRIVER}'].memory >= '70Gi'"
    [finding] = checks.check_selector(expr, "p", DRIVER)
    assert finding.severity == "error"
    assert finding.message.endswith(
        f"compare them with compareTo: device.capacity['{DRIVER}'].memory"
        ".compareTo(quantity('70Gi')) >= 0"
    )
    # A literal on the left is mirrored, and a number becomes a quantity too.
    [finding] = checks.check_selector(f"30 < device.capacity['{DRIVER}'].cores", "p", DRIVER)
    assert finding.message.endswith(
        f"device.capacity['{DRIVER}'].cores.compareTo(quantity('30')) > 0"
    )


def test_other_compile_errors_get_no_compare_to_hint() -> None:
    [finding] = checks.check_selector(f"device.attributes['{DRIVER}'].index ==", "p", DRIVER)
    assert "compareTo" not in finding.message
