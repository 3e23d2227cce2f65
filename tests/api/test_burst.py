"""The rules of burstable shares (:mod:`api.burst`): what a DeviceClass allows, what a limit
may be, and the caps it gives."""

from __future__ import annotations

from typing import Any

import pytest

from api import burst
from api.gpuconfig import GpuConfigError, decode_driver_configs, parse_gpu_config
from api.names import DEFAULT_DRIVER_NAME as DRIVER

GI = 1024**3


def entry(sharing: dict[str, Any], source: str, requests: list[str] | None = None) -> Any:
    out: dict[str, Any] = {
        "source": source,
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "resource.sharegpu.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": sharing,
            },
        },
    }
    if requests is not None:
        out["requests"] = requests
    return out


def sharing(limit: dict[str, Any]) -> Any:
    return parse_gpu_config(
        {
            "apiVersion": "resource.sharegpu.dev/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "Limits", "burstLimit": limit},
        }
    ).sharing


def test_defaults_allow_compute_and_deny_memory() -> None:
    assert burst.allocation_policy(decode_driver_configs([], DRIVER), "gpu") == burst.ClassPolicy(
        compute=True, memory=False, position=None
    )


def test_the_last_class_entry_with_a_policy_for_the_request_decides() -> None:
    configs = decode_driver_configs(
        [
            entry({"burstPolicy": {"memory": "Allowed"}}, "FromClass"),
            entry({"burstPolicy": {"compute": "Denied"}}, "FromClass", ["other"]),
            entry({"strategy": "MPS"}, "FromClass"),
        ],
        DRIVER,
    )
    assert burst.allocation_policy(configs, "gpu") == burst.ClassPolicy(True, True, 0)
    assert burst.allocation_policy(configs, "other") == burst.ClassPolicy(False, False, 1)


def test_a_claim_entry_cannot_set_a_policy() -> None:
    configs = decode_driver_configs(
        [entry({"burstPolicy": {"memory": "Allowed"}}, "FromClaim", ["gpu"])], DRIVER
    )
    with pytest.raises(GpuConfigError, match=r"config\[0\]: sharing\.burstPolicy: only a Device"):
        burst.allocation_policy(configs, "gpu")
    # A claim entry for another request does not concern this one.
    assert burst.allocation_policy(configs, "other").memory is False


@pytest.mark.parametrize(
    ("limit", "caps"),
    [
        ({"cores": 90}, (90, 10 * GI)),
        ({"memory": "30Gi"}, (30, 30 * GI)),
        ({"cores": 100, "memory": "10Gi"}, (100, 10 * GI)),
    ],
)
def test_caps_are_the_limit_and_the_request_where_it_has_none(
    limit: dict[str, Any], caps: tuple[int, int]
) -> None:
    assert burst.share_caps(sharing(limit), 30, 10 * GI) == caps
    assert burst.share_caps(None, 30, 10 * GI) == (30, 10 * GI)


def test_limit_problems_name_each_field() -> None:
    allowed = burst.ClassPolicy(compute=True, memory=True)
    assert burst.limit_problems(sharing({"cores": 30}), allowed, cores=30, memory=GI) == []
    assert burst.limit_problems(
        sharing({"cores": 10, "memory": "90Gi"}), allowed, cores=30, memory=GI, gpu_memory=80 * GI
    ) == [
        "sharing.burstLimit.cores: 10 is below the share's 30 cores request (a limit is at "
        "least the request)",
        "sharing.burstLimit.memory: 90Gi is above the GPU's 80Gi of usable memory (a limit is "
        "at most the GPU)",
    ]
    # An unknown request counts as raised: the class must allow it.
    [denied] = burst.limit_problems(
        sharing({"memory": "2Gi"}), burst.ClassPolicy(), cores=None, memory=None, class_name="x"
    )
    assert denied.startswith("sharing.burstLimit.memory: memory burst is not allowed by ")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"strategy": "TimeSlicing", "burstLimit": {"cores": 50}},
            "sharing.burstLimit: only allowed with strategy MPS or Limits (strategy is "
            "TimeSlicing)",
        ),
        ({"strategy": "MPS", "burstLimit": {}}, "sharing.burstLimit: set cores, memory or both"),
        (
            {"burstPolicy": {"memory": "allowed"}},
            'sharing.burstPolicy.memory: must be one of Allowed, Denied (got "allowed")',
        ),
    ],
)
def test_bad_burst_configs_name_the_field(given: dict[str, Any], message: str) -> None:
    with pytest.raises(GpuConfigError) as info:
        parse_gpu_config(
            {"apiVersion": "resource.sharegpu.dev/v1alpha1", "kind": "GpuConfig", "sharing": given}
        )
    assert info.value.messages[0].startswith(message)
