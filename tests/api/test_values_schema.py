"""The chart value ``deviceClasses.gpu.config``: its schema is generated from the GpuConfig model
(``python -m api.crd``) and agrees with :func:`api.gpuconfig.parse_gpu_config`, so a config the
driver would refuse fails ``helm install`` at render time, naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import jsonschema
import pytest

from api.crd import (
    CONFIG_VALUES_PATH,
    VALUES_SCHEMA_PATH,
    config_values_schema,
    render_values_schema,
)
from api.gpuconfig import SECTION_STRATEGY, parse_gpu_config
from tests.api.helpers import BAD, GOOD
from tests.deploy.helpers import CHART_DIR, load_documents, run_helm

#: GpuConfig fields the chart writes itself (the template adds them around the value).
TEMPLATE_FIELDS = ("apiVersion", "kind")
#: Fields whose values the schema types but does not parse (quantity syntax and bounds).
QUANTITY_FIELDS = ("pinnedMemoryLimit", "deviceMemoryLimit")


def committed_config_schema() -> dict[str, Any]:
    node: dict[str, Any] = json.loads(VALUES_SCHEMA_PATH.read_text())
    for key in CONFIG_VALUES_PATH:
        node = node["properties"][key]
    return node


def as_value(config: dict[str, Any]) -> dict[str, Any]:
    """A GpuConfig as the chart value holds it: without the fields the template adds."""
    return {k: v for k, v in config.items() if k not in TEMPLATE_FIELDS}


def only_unchecked_fields(messages: list[str]) -> bool:
    """True when every problem is about a field the values schema leaves to the driver."""
    paths = [m.split(":", 1)[0] for m in messages]
    return all(p in TEMPLATE_FIELDS or p.rsplit(".", 1)[-1] in QUANTITY_FIELDS for p in paths)


def test_committed_values_schema_is_up_to_date() -> None:
    current = VALUES_SCHEMA_PATH.read_text()
    assert render_values_schema(current) == current, "run `python -m api.crd`"
    assert committed_config_schema() == config_values_schema()


@pytest.mark.process
def test_crd_module_check_covers_the_values_schema() -> None:
    out = subprocess.run([sys.executable, "-m", "api.crd", "--check"], capture_output=True)
    assert out.returncode == 0, out.stderr


def test_render_values_schema_is_idempotent_and_keeps_the_rest() -> None:
    current = VALUES_SCHEMA_PATH.read_text()
    stale = json.loads(current)
    stale["properties"]["deviceClasses"]["properties"]["gpu"]["properties"]["config"] = {
        "type": "object"
    }
    fixed = render_values_schema(json.dumps(stale))
    assert fixed == current
    assert render_values_schema(fixed) == fixed


def test_schema_makes_the_template_fields_optional_and_states_the_section_rule() -> None:
    schema = config_values_schema()
    assert set(schema["properties"]) == {"apiVersion", "kind", "sharing"}
    # A pasted whole GpuConfig may carry them, with exactly these values; the chart adds them.
    assert schema["properties"]["apiVersion"] == {"const": "resource.sharegpu.dev/v1alpha1"}
    assert schema["properties"]["kind"] == {"const": "GpuConfig"}
    assert "required" not in schema and schema["additionalProperties"] is False
    dependencies = schema["properties"]["sharing"]["dependencies"]
    assert {s: d["properties"]["strategy"]["const"] for s, d in dependencies.items()} == dict(
        SECTION_STRATEGY
    )
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema


@pytest.mark.parametrize(("name", "config", "_normalized"), GOOD, ids=[g[0] for g in GOOD])
def test_schema_accepts_every_valid_config(
    name: str, config: dict[str, Any], _normalized: dict[str, Any]
) -> None:
    parse_gpu_config(config)
    jsonschema.Draft7Validator(config_values_schema()).validate(as_value(config))


@pytest.mark.parametrize(("name", "config", "messages"), BAD, ids=[b[0] for b in BAD])
def test_schema_rejects_invalid_configs(name: str, config: Any, messages: list[str]) -> None:
    """Every invalid config is rejected by the schema too, except for problems with quantity
    syntax or bounds (checked by the webhook and the plugin) and with apiVersion or kind."""
    if not isinstance(config, dict) or only_unchecked_fields(messages):
        pytest.skip("not expressible as the chart value")
    validator = jsonschema.Draft7Validator(config_values_schema())
    assert not validator.is_valid(as_value(config)), messages


def test_unchecked_cases_stay_few() -> None:
    unchecked = [n for n, c, m in BAD if isinstance(c, dict) and only_unchecked_fields(m)]
    assert len(unchecked) <= 5, unchecked


# --- rendering with helm ---


def template(helm: str, config: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return run_helm(
        helm,
        "template",
        "sharegpu",
        str(CHART_DIR),
        "--set-json",
        f"deviceClasses.gpu.config={json.dumps(config)}",
    )


@pytest.mark.helm
@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"sharing": {"strategy": "Mps"}}, "/deviceClasses/gpu/config/sharing/strategy"),
        ({"sharing": {"stratgy": "MPS"}}, "stratgy"),
        ({"sharnig": {"strategy": "MPS"}}, "sharnig"),
        (
            {"sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 150}}},
            "/deviceClasses/gpu/config/sharing/mps/activeThreadPercentage",
        ),
        ({"sharing": {"mps": {"activeThreadPercentage": 50}}}, "strategy"),
        ({"sharing": {"strategy": "Exclusive", "mps": {}}}, "/deviceClasses/gpu/config/sharing"),
        (
            {
                "apiVersion": "resource.sharegpu.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "Mps"},
            },
            "/deviceClasses/gpu/config/sharing/strategy",
        ),
        ({"kind": "GPUConfig", "sharing": {"strategy": "MPS"}}, "/deviceClasses/gpu/config/kind"),
    ],
)
def test_a_bad_class_config_fails_at_render_time(
    helm: str, config: dict[str, Any], field: str
) -> None:
    result = template(helm, config)
    assert result.returncode != 0
    assert field in result.stderr, result.stderr


@pytest.mark.helm
@pytest.mark.parametrize(
    "config",
    [
        {"sharing": {"strategy": "MPS"}},
        {"sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 50}}},
        {"sharing": {"strategy": "MPS", "mps": {"pinnedMemoryLimit": "10Gi"}}},
        {"sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}},
        {"sharing": {"strategy": "Limits", "limits": {"smLimit": 30, "deviceMemoryLimit": 2**30}}},
        {"sharing": {}},
        # A whole GpuConfig pasted as it is: the chart writes apiVersion and kind once.
        {
            "apiVersion": "resource.sharegpu.dev/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS"},
        },
    ],
)
def test_valid_class_configs_render_into_the_device_class(
    helm: str, config: dict[str, Any]
) -> None:
    result = template(helm, config)
    assert result.returncode == 0, result.stderr
    (device_class,) = [
        d
        for d in load_documents(result.stdout)
        if d["kind"] == "DeviceClass" and d["metadata"]["name"] == "gpu.sharegpu.dev"
    ]
    (entry,) = device_class["spec"]["config"]
    parameters = entry["opaque"]["parameters"]
    assert as_value(parameters) == as_value(config)
    assert parameters["kind"] == "GpuConfig"
    parse_gpu_config(parameters)
