"""GpuConfig decoding, validation messages, precedence and the generated JSON Schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from api import schema
from api.gpuconfig import (
    DriverConfigs,
    GpuConfig,
    GpuConfigError,
    decode_driver_configs,
    parse_gpu_config,
)
from api.names import GROUP_VERSION
from tests.api.helpers import (
    BAD,
    BASE,
    GOOD,
    SHARING_FIELDS,
    cfg,
    config_entries_from,
    resolve_config,
)
from tests.paths import DOCS_DIR

DRIVER = "gpu.sharegpu.dev"


@pytest.mark.parametrize(("name", "given", "expected"), GOOD, ids=[g[0] for g in GOOD])
def test_good_configs_decode_and_round_trip(
    name: str, given: Any, expected: dict[str, Any]
) -> None:
    config = parse_gpu_config(given)
    assert config.to_json_dict() == expected
    assert parse_gpu_config(config.to_json_dict()) == config


@pytest.mark.parametrize(("name", "given", "messages"), BAD, ids=[b[0] for b in BAD])
def test_bad_configs_give_exact_messages(name: str, given: Any, messages: list[str]) -> None:
    with pytest.raises(GpuConfigError) as info:
        parse_gpu_config(given)
    assert list(info.value.messages) == messages
    assert str(info.value) == "; ".join(messages)


def test_api_version_literal_matches_shared_name() -> None:
    assert parse_gpu_config({"apiVersion": GROUP_VERSION, "kind": "GpuConfig"}).api_version == (
        GROUP_VERSION
    )


def test_quantities_expose_bytes() -> None:
    config = parse_gpu_config(
        cfg({"strategy": "MPS", "mps": {"pinnedMemoryLimit": "10Gi"}}),
    )
    assert config.sharing is not None and config.sharing.mps is not None
    assert config.sharing.mps.pinned_memory_limit_bytes() == 10 * 2**30


# --- precedence -------------------------------------------------------------------------------


def entry(
    strategy: str | None,
    *,
    source: str = "FromClaim",
    requests: list[str] | None = None,
    driver: str = DRIVER,
    sharing: dict[str, Any] | None = None,
) -> dict[str, Any]:
    params: dict[str, Any] = dict(BASE)
    if sharing is not None:
        params["sharing"] = sharing
    elif strategy is not None:
        params["sharing"] = {"strategy": strategy}
    result: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        result["requests"] = requests
    return result


def test_defaults_without_entries() -> None:
    assert resolve_config([], "gpu", DRIVER).strategy == "Exclusive"
    assert resolve_config([], "gpu", DRIVER, shared=True).strategy == "MPS"


def test_claim_entries_win_over_class_entries_regardless_of_order() -> None:
    entries = [entry("TimeSlicing", source="FromClaim"), entry("Limits", source="FromClass")]
    assert resolve_config(entries, "gpu", DRIVER).strategy == "TimeSlicing"


def test_later_entries_win() -> None:
    entries = [
        entry("MPS", source="FromClass"),
        entry("Limits", source="FromClass"),
        entry("TimeSlicing"),
        entry("Exclusive"),
    ]
    assert resolve_config(entries, "gpu", DRIVER).strategy == "Exclusive"


def test_entries_with_requests_apply_only_to_those_requests() -> None:
    entries = [entry("Limits"), entry("TimeSlicing", requests=["other"])]
    assert resolve_config(entries, "gpu", DRIVER).strategy == "Limits"
    assert resolve_config(entries, "other", DRIVER).strategy == "TimeSlicing"


def test_base_request_name_covers_subrequests() -> None:
    entries = [entry("TimeSlicing", requests=["gpu"]), entry("Limits", requests=["gpu/large"])]
    assert resolve_config(entries, "gpu/small", DRIVER).strategy == "TimeSlicing"
    assert resolve_config(entries, "gpu/large", DRIVER).strategy == "Limits"
    assert resolve_config(entries, "gpu", DRIVER).strategy == "TimeSlicing"


def test_other_drivers_are_ignored_even_when_invalid() -> None:
    other = {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"x": 1}}}
    entries = [entry("Limits"), other]
    assert resolve_config(entries, "gpu", DRIVER).strategy == "Limits"


def test_entry_without_strategy_wins_and_gets_the_default() -> None:
    entries = [entry("TimeSlicing", source="FromClass"), entry(None)]
    assert resolve_config(entries, "gpu", DRIVER).strategy == "Exclusive"
    assert resolve_config(entries, "gpu", DRIVER, shared=True).strategy == "MPS"


def test_last_entry_wins_as_a_whole() -> None:
    entries = [
        entry(None, sharing={"strategy": "MPS", "mps": {"activeThreadPercentage": 20}}),
        entry("MPS"),
    ]
    resolved = resolve_config(entries, "gpu", DRIVER, shared=True)
    assert resolved.sharing is not None and resolved.sharing.mps is None


def test_invalid_entries_are_reported_with_their_position() -> None:
    entries = [entry("MPS"), entry("Mps", requests=["other"]), entry(None, sharing={"x": 1})]
    with pytest.raises(GpuConfigError) as info:
        resolve_config(entries, "gpu", DRIVER)
    assert info.value.messages == (
        "config[1]: sharing.strategy: must be one of Exclusive, TimeSlicing, MPS, Limits"
        ' (got "Mps")',
        f"config[2]: sharing.x: unknown field {SHARING_FIELDS}",
    )


def test_entries_from_class_and_claim_specs() -> None:
    class_cfg = [{"opaque": {"driver": DRIVER, "parameters": cfg({"strategy": "Limits"})}}]
    claim_cfg = [{"opaque": {"driver": DRIVER, "parameters": cfg({"strategy": "MPS"})}}]
    tagged = config_entries_from(class_cfg, claim_cfg)
    assert [e["source"] for e in tagged] == ["FromClass", "FromClaim"]
    assert resolve_config(list(reversed(tagged)), "gpu", DRIVER).strategy == "MPS"


# --- JSON Schema ------------------------------------------------------------------------------


def test_committed_schema_is_up_to_date() -> None:
    for name in schema.SCHEMAS:
        committed = (schema.SCHEMA_DIR / name).read_text()
        assert committed == schema.render(name), "run: python -m api.schema"
    assert schema.main(["--check"]) == 0


def test_schema_check_reports_stale_files(tmp_path: Any) -> None:
    assert schema.main(["--check", "--dir", str(tmp_path)]) == 1
    assert schema.main(["--dir", str(tmp_path)]) == 0
    assert schema.main(["--check", "--dir", str(tmp_path)]) == 0


def _validator() -> Any:
    document = json.loads((schema.SCHEMA_DIR / "gpuconfig.schema.json").read_text())
    cls = jsonschema.validators.validator_for(document)
    cls.check_schema(document)
    return cls(document)


@pytest.mark.parametrize(("name", "given", "expected"), GOOD, ids=[g[0] for g in GOOD])
def test_schema_accepts_good_configs(name: str, given: Any, expected: dict[str, Any]) -> None:
    _validator().validate(given)


#: Rules the schema cannot express: quantity syntax and which section goes with which strategy.
MODEL_ONLY_RULES = {
    "pinned limit not a quantity",
    "pinned limit too small",
    "section of another strategy",
    "section without strategy",
}
STRUCTURAL_BAD = [b for b in BAD if b[0] not in MODEL_ONLY_RULES]


@pytest.mark.parametrize(
    ("name", "given", "messages"), STRUCTURAL_BAD, ids=[b[0] for b in STRUCTURAL_BAD]
)
def test_schema_rejects_structurally_bad_configs(
    name: str, given: Any, messages: list[str]
) -> None:
    assert not _validator().is_valid(given)


def test_gpuconfig_model_is_the_schema_source() -> None:
    assert schema.SCHEMAS["gpuconfig.schema.json"] is GpuConfig


def _gpuconfigs_in(node: Any) -> list[dict[str, Any]]:
    """Every mapping with ``kind: GpuConfig`` inside a YAML document, at any depth."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if node.get("kind") == "GpuConfig":
            found.append(node)
        for value in node.values():
            found += _gpuconfigs_in(value)
    elif isinstance(node, list):
        for value in node:
            found += _gpuconfigs_in(value)
    return found


def test_every_gpuconfig_example_in_the_docs_is_valid() -> None:
    import re

    import yaml

    docs = DOCS_DIR
    configs: list[dict[str, Any]] = []
    for page in sorted(docs.glob("*.md")):
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S):
            for document in yaml.safe_load_all(block):
                configs += _gpuconfigs_in(document)
    assert configs, "the docs show no GpuConfig example"
    for config in configs:
        parse_gpu_config(config)


def test_entries_are_decoded_once_in_precedence_order_with_their_positions() -> None:
    entries = [
        entry("TimeSlicing", requests=["gpu"]),
        "not an object",
        entry("Limits", source="FromClass"),
        {"opaque": {"driver": "gpu.nvidia.com", "parameters": {}}},
        entry("MPS", source="FromClass", requests=["gpu/small"]),
    ]
    decoded = decode_driver_configs(entries, DRIVER)
    assert decoded.problems == ()
    assert [(e.position, e.source, e.requests, e.config.strategy) for e in decoded.entries] == [
        (2, "FromClass", (), "Limits"),
        (4, "FromClass", ("gpu/small",), "MPS"),
        (0, "FromClaim", ("gpu",), "TimeSlicing"),
    ]
    # One decoded list answers every request: the claim's entry for "gpu" wins over the class's.
    assert decoded.resolve("gpu/small").strategy == "TimeSlicing"
    assert decoded.resolve("other").strategy == "Limits"


def test_problems_keep_their_entry_and_refuse_every_request() -> None:
    entries = [entry("MPS"), entry("Mps", requests=["other"])]
    decoded = decode_driver_configs(entries, DRIVER)
    (problem,) = decoded.problems
    assert (problem.position, problem.requests) == (1, ("other",))
    assert problem.applies_to("other") and not problem.applies_to("gpu")
    error = decoded.error()
    assert error is not None
    assert error.messages == (
        "config[1]: sharing.strategy: must be one of Exclusive, TimeSlicing, MPS, Limits"
        ' (got "Mps")',
    )
    with pytest.raises(GpuConfigError) as info:
        decoded.resolve("gpu")
    assert info.value.messages == error.messages


def test_no_entries_resolve_to_the_defaults() -> None:
    assert DriverConfigs().error() is None
    assert DriverConfigs().resolve("gpu").strategy == "Exclusive"
    assert DriverConfigs().resolve("gpu", shared=True).strategy == "MPS"


def test_a_quantity_beyond_int64_is_named_out_of_range() -> None:
    from api.gpuconfig import GpuConfigError, parse_gpu_config

    with pytest.raises(GpuConfigError) as info:
        parse_gpu_config(
            {
                "apiVersion": "resource.sharegpu.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mps": {"pinnedMemoryLimit": "1e1500000"}},
            }
        )
    assert info.value.messages == (
        "sharing.mps.pinnedMemoryLimit: must be at most 9223372036854775807 bytes "
        '(got "1e1500000")',
    )
