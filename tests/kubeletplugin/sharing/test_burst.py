"""Burstable shares on the node: a ``burstLimit`` becomes the strategy's caps while the request
stays what the GPU's accounting counts; the DeviceClass decides what may burst; the checkpoint
records the caps, and the previous release's rules refuse both the config and the record."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kubeletplugin.main import prepared_shares
from kubeletplugin.prepare.checkpoint import device_from_json
from kubeletplugin.usage.attribution import overcommitted
from tests.kubeletplugin.prepare import helpers as h
from tests.kubeletplugin.sharing.helpers import GI, LIBRARY, Tools, claim_env, gpu_config
from tests.kubeletplugin.sharing.previous import checkpoint as previous_checkpoint
from tests.kubeletplugin.sharing.previous import gpuconfig as previous_gpuconfig

SHARE = {"cores": 30, "memory": 10 * GI}


def class_config(policy: dict[str, str], requests: list[str] | None = None) -> dict[str, Any]:
    """An allocation's config entry from the DeviceClass carrying ``burstPolicy``."""
    entry = gpu_config({"burstPolicy": policy}, requests or ["gpu"])
    entry["source"] = "FromClass"
    return entry


MEMORY_ALLOWED = class_config({"memory": "Allowed"})


def burst(strategy: str, limit: dict[str, Any]) -> dict[str, Any]:
    return gpu_config({"strategy": strategy, "burstLimit": limit})


def setup(tmp_path: Path, library: str | None = None) -> tuple[h.Node, h.FakeClaims, Tools, Any]:
    node, claims, tools = h.Node(tmp_path), h.FakeClaims(), Tools.new()
    return node, claims, tools, node.state(claims, enforcer=tools.enforcer(node.data_dir, library))


def prepare(state: Any, obj: dict[str, Any]) -> str:
    return str(state.prepare([h.ref(obj)])[obj["metadata"]["uid"]].error)


def share_claim(name: str, configs: list[dict[str, Any]], share: Any = None) -> dict[str, Any]:
    return h.claim(name, [h.result("gpu", "gpu-0", share=share or SHARE)], configs=configs)


def test_mps_burst_sets_the_limit_as_caps_and_records_both(tmp_path: Path) -> None:
    node, claims, tools, state = setup(tmp_path)
    c = share_claim("c", [MEMORY_ALLOWED, burst("MPS", {"cores": 80, "memory": "20Gi"})])
    claims.add(c)
    assert prepare(state, c) == ""
    uuid = h.gpus()[0].uuid
    [env] = claim_env(node, c["metadata"]["uid"])
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "80"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{uuid}=20480M"
    [device] = node.checkpoint()["claims"][c["metadata"]["uid"]]["devices"]
    assert (device["cores"], device["memory"]) == (30, 10 * GI)
    assert device["enforcement"] == {"strategy": "MPS", "limitCores": 80, "limitMemory": 20 * GI}
    # The GPU's accounting counts the request: a 70-core share still fits beside it.
    other = h.claim("o", [h.result("gpu", "gpu-0", share={"cores": 70, "memory": 10 * GI})])
    claims.add(other)
    assert prepare(state, other) == ""
    # After a restart the daemon is adopted with the recorded caps.
    tools.fake.clear()
    enforcer = tools.enforcer(node.data_dir)
    node.state(claims, enforcer=enforcer)
    held = enforcer.held()[c["metadata"]["uid"]]
    assert [(d.enforced.limit_cores, d.enforced.limit_memory) for d in held] == [(80, 20 * GI)]


def test_limits_burst_sets_the_library_caps(tmp_path: Path) -> None:
    node, claims, _, state = setup(tmp_path, LIBRARY)
    c = share_claim("c", [burst("Limits", {"cores": 100})])
    claims.add(c)
    assert prepare(state, c) == ""
    [env] = claim_env(node, c["metadata"]["uid"])
    assert env["CUDA_DEVICE_SM_LIMIT_0"] == "100"
    # Memory left out of the limit is the request's.
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10240m"


def test_an_override_may_go_up_to_the_limit_not_above(tmp_path: Path) -> None:
    node, claims, _, state = setup(tmp_path)
    within = gpu_config(
        {"strategy": "MPS", "burstLimit": {"cores": 60}, "mps": {"activeThreadPercentage": 50}}
    )
    above = gpu_config(
        {"strategy": "MPS", "burstLimit": {"cores": 60}, "mps": {"activeThreadPercentage": 70}}
    )
    a, b = share_claim("a", [within]), share_claim("b", [above])
    claims.add(a, b)
    assert prepare(state, a) == ""
    assert claim_env(node, a["metadata"]["uid"])[0]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert prepare(state, b).endswith(
        'device gpu-0 (request "gpu"): sharing.mps.activeThreadPercentage 70 is above the '
        "share's burstLimit 60 cores"
    )


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        (
            [burst("MPS", {"memory": "20Gi"})],
            "sharing.burstLimit.memory: memory burst is not allowed by the request's DeviceClass "
            "(it sets no sharing.burstPolicy.memory, which defaults to Denied; an admin allows "
            "it with sharing.burstPolicy.memory: Allowed in the class's config)",
        ),
        (
            [class_config({"compute": "Denied"}), burst("MPS", {"cores": 50})],
            "sharing.burstLimit.cores: compute burst is not allowed by the request's DeviceClass "
            "(its config[0] sets sharing.burstPolicy.compute: Denied)",
        ),
        (
            [burst("MPS", {"cores": 20})],
            "sharing.burstLimit.cores: 20 is below the share's 30 cores request (a limit is at "
            "least the request)",
        ),
        (
            [MEMORY_ALLOWED, burst("MPS", {"memory": "8Gi"})],
            "sharing.burstLimit.memory: 8Gi is below the share's 10Gi memory request (a limit "
            "is at least the request)",
        ),
        (
            [MEMORY_ALLOWED, burst("MPS", {"memory": "100Gi"})],
            "sharing.burstLimit.memory: 100Gi is above the GPU's 81032Mi of usable memory "
            "(a limit is at most the GPU)",
        ),
        (
            [gpu_config({"strategy": "MPS", "burstPolicy": {"memory": "Allowed"}})],
            "invalid GpuConfig: config[0]: sharing.burstPolicy: only a DeviceClass config may "
            "set it (a claim cannot allow itself to burst; ask for a DeviceClass that allows it)",
        ),
    ],
    ids=[
        "memory-not-opted-in",
        "compute-denied",
        "below-cores",
        "below-memory",
        "above-gpu",
        "claim",
    ],
)
def test_refused_limits_are_per_claim_errors_naming_the_field(
    tmp_path: Path, configs: list[dict[str, Any]], message: str
) -> None:
    node, claims, tools, state = setup(tmp_path)
    c = share_claim("c", configs)
    claims.add(c)
    assert prepare(state, c).endswith(f'device gpu-0 (request "gpu"): {message}')
    assert tools.fake.argvs() == [] and node.spec_files() == []


def test_a_limit_equal_to_the_request_needs_no_permission(tmp_path: Path) -> None:
    node, claims, _, state = setup(tmp_path)
    c = share_claim(
        "c", [class_config({"compute": "Denied"}), burst("MPS", {"cores": 30, "memory": "10Gi"})]
    )
    claims.add(c)
    assert prepare(state, c) == ""
    assert claim_env(node, c["metadata"]["uid"])[0]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"


# --- a plugin rolled back to the previous release -------------------------------------------


def test_the_previous_parser_refuses_a_burst_config() -> None:
    parameters = burst("MPS", {"cores": 80})["opaque"]["parameters"]
    with pytest.raises(previous_gpuconfig.GpuConfigError) as info:
        previous_gpuconfig.parse_gpu_config(parameters)
    assert info.value.messages == (
        "sharing.burstLimit: unknown field (fields here: strategy, timeSlicing, mps, limits)",
    )
    policy = class_config({"memory": "Allowed"})["opaque"]["parameters"]
    with pytest.raises(previous_gpuconfig.GpuConfigError, match=r"sharing\.burstPolicy: unknown"):
        previous_gpuconfig.parse_gpu_config(policy)


@pytest.mark.parametrize(
    ("limit", "field"),
    [({"cores": 80}, "limitCores 80 is outside 0..30"), ({"memory": "20Gi"}, "limitMemory")],
)
def test_the_previous_checkpoint_decoder_refuses_a_burst_record(
    tmp_path: Path, limit: dict[str, Any], field: str
) -> None:
    node, claims, _, state = setup(tmp_path)
    c = share_claim("c", [MEMORY_ALLOWED, burst("MPS", limit)])
    claims.add(c)
    assert prepare(state, c) == ""
    [raw] = node.checkpoint()["claims"][c["metadata"]["uid"]]["devices"]
    # This release reads its own record back ...
    assert device_from_json(raw, "d").enforcement is not None
    # ... the previous one refuses it, so its claim is rolled back rather than enforced with
    # the wrong cap (its CheckpointError makes the claim undecodable).
    with pytest.raises(
        previous_checkpoint.CheckpointError, match=re.escape(f"d.enforcement.{field}")
    ):
        previous_checkpoint.device_from_json(raw, "d")


def test_the_previous_release_still_reads_a_share_without_burst(tmp_path: Path) -> None:
    node, claims, _, state = setup(tmp_path)
    c = share_claim("c", [gpu_config({"strategy": "MPS"})])
    claims.add(c)
    assert prepare(state, c) == ""
    [raw] = node.checkpoint()["claims"][c["metadata"]["uid"]]["devices"]
    assert previous_checkpoint.device_from_json(raw, "d") == device_from_json(raw, "d")
    previous_gpuconfig.parse_gpu_config(gpu_config({"strategy": "MPS"})["opaque"]["parameters"])


def test_usage_above_the_request_of_a_burstable_share_is_overcommitted(tmp_path: Path) -> None:
    """The usage stage measures a share against its request, not its limit: a burstable share
    using spare memory is reported (the controller's ShareOvercommitted Event and metric)."""
    _, claims, _, state = setup(tmp_path)
    c = share_claim("c", [MEMORY_ALLOWED, burst("MPS", {"memory": "20Gi"})])
    claims.add(c)
    assert prepare(state, c) == ""
    [share] = prepared_shares(SimpleNamespace(state=state))()  # type: ignore[arg-type]
    assert (share.cores, share.memory, share.mps) == (30, 10 * GI, True)
    assert overcommitted(share, 12 * GI, None, compute_margin=5) == ("memory",)
    assert overcommitted(share, 10 * GI, None, compute_margin=5) == ()
