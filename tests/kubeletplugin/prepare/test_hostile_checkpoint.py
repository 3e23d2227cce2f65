"""A checkpoint written by someone else: every field is checked against the node's device table
and fixed vocabularies at start, derived fields are derived again, and nothing outside the
plugin's directories is touched. Each case here was a finding of an adversarial review."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeletplugin.devices.table import node_devices
from tests.jsondata import json_paths
from tests.kubeletplugin.prepare import helpers as h
from tests.kubeletplugin.prepare.checkpoint_files import as_format1
from tests.kubeletplugin.sharing.helpers import GI, Tools, gpu_config

MPS = gpu_config({"strategy": "MPS"})


def _prepare(node: h.Node, n: int, **kw: Any) -> tuple[h.FakeClaims, list[dict[str, Any]]]:
    claims = h.FakeClaims()
    objs = [
        h.claim(
            f"c{i}",
            [h.result("gpu", "gpu-0", share={"cores": 10, "memory": GI})],
            configs=kw.pop("configs", ()) if i == 0 else (),
        )
        for i in range(n)
    ]
    claims.add(*objs)
    outs = node.state(claims, **kw).prepare([h.ref(o) for o in objs])
    assert all(o.error == "" for o in outs.values()), outs
    return claims, objs


def _tamper(node: h.Node, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite the checkpoint with ``change`` applied and a matching checksum."""
    doc = node.checkpoint()
    change(doc)
    node.write_checkpoint(doc)


def _victim(root: Path) -> Path:
    """A directory outside the plugin's dirs with a file and a ``pipe`` subdirectory."""
    victim = root / "victim"
    (victim / "pipe").mkdir(parents=True)
    (victim / "pipe" / "keep").write_text("keep me")
    (victim / "keep").write_text("keep me")
    return victim


def _intact(victim: Path) -> bool:
    return (victim / "keep").read_text() == "keep me" and (
        victim / "pipe" / "keep"
    ).read_text() == "keep me"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpuUUID", "VICTIM"),
        ("gpuUUID", "../../victim"),
        ("gpuUUID", h.gpus()[1].uuid),  # a real GPU, but not the device's
        ("device", "../victim"),
        ("device", "gpu-99"),
        ("pool", "another-node"),
        ("partition", "half-0"),
        ("cores", 1000),
        ("cores", -1),
        ("memory", 10**30),
        ("shareID", "../../x"),
    ],
)
def test_a_device_record_that_does_not_fit_the_node_rolls_its_claim_back(
    node: h.Node, field: str, value: Any
) -> None:
    claims, objs = _prepare(node, 2)
    victim = _victim(node.root)
    uid, other = (o["metadata"]["uid"] for o in objs)
    value = str(victim) if value == "VICTIM" else value

    def change(doc: dict[str, Any]) -> None:
        doc["claims"][uid]["devices"][0][field] = value

    _tamper(node, change)
    state = node.state(claims)
    assert uid not in state.prepared_claims()
    assert other in state.prepared_claims()
    assert _intact(victim)
    # The rolled-back claim's spec is gone; kubelet's retry prepares it again.
    assert [p for p in node.spec_files() if uid in p.name] == []
    assert state.prepare([h.ref(objs[0])])[uid].error == ""


def test_recorded_cdi_ids_are_derived_again_never_replayed(node: h.Node) -> None:
    claims, objs = _prepare(node, 1)
    uid = objs[0]["metadata"]["uid"]
    honest = node.checkpoint()["claims"][uid]["devices"][0]

    def change(doc: dict[str, Any]) -> None:
        doc["claims"][uid]["devices"][0]["cdiDeviceIds"] = ["nvidia.com/gpu=all"]
        doc["claims"][uid]["devices"][0]["cdiName"] = "all"

    _tamper(node, change)
    state = node.state(claims)
    (device,) = state.prepare([h.ref(objs[0])])[uid].devices
    assert tuple(device.cdi_device_ids) == tuple(honest["cdiDeviceIds"])
    assert node.checkpoint()["claims"][uid]["devices"][0]["cdiDeviceIds"] == honest["cdiDeviceIds"]


@pytest.mark.parametrize(("namespace", "name"), [("../x", "c0"), ("default", "a/b"), ("", "c0")])
def test_a_recorded_claim_reference_that_is_no_kubernetes_name_is_rolled_back(
    node: h.Node, namespace: str, name: str
) -> None:
    claims, objs = _prepare(node, 1)
    uid = objs[0]["metadata"]["uid"]

    def change(doc: dict[str, Any]) -> None:
        doc["claims"][uid].update(namespace=namespace, name=name)

    _tamper(node, change)
    assert uid not in node.state(claims).prepared_claims()


def test_deeply_nested_checkpoint_is_corrupt_not_a_crash(node: h.Node) -> None:
    claims, objs = _prepare(node, 1)
    path = node.data_dir / "checkpoint.json"
    path.write_bytes(b'{"sharing":' + b'{"a":' * 5000 + b"1" + b"}" * 5001)
    state = node.state(claims)  # no RecursionError
    assert len(list(node.data_dir.glob("checkpoint.json.corrupt-*"))) == 1
    # Rebuilt from the spec files, as for any corrupt checkpoint.
    assert objs[0]["metadata"]["uid"] in state.prepared_claims()


def test_recorded_mps_state_for_a_path_instead_of_a_gpu_touches_nothing(node: h.Node) -> None:
    tools = Tools.new()
    claims, _ = _prepare(node, 1, enforcer=tools.enforcer(node.data_dir), configs=[MPS])
    victim = _victim(node.root)
    tools.fake.clear()

    def change(doc: dict[str, Any]) -> None:
        doc["sharing"]["mps"][str(victim)] = {"previousComputeMode": "DEFAULT"}
        doc["sharing"]["mps"]["../../victim"] = {"previousComputeMode": "DEFAULT"}
        doc["sharing"]["timeSlicing"][str(victim)] = {"interval": "Long"}

    _tamper(node, change)
    node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert _intact(victim)
    assert not any(str(victim) in arg or "victim" in arg for a in tools.fake.argvs() for arg in a)


def test_a_recorded_compute_mode_never_switches_a_gpu_no_claim_uses(node: h.Node) -> None:
    tools = Tools.new()
    claims, _ = _prepare(node, 1, enforcer=tools.enforcer(node.data_dir), configs=[MPS])
    idle = h.gpus()[3].uuid
    tools.fake.clear()

    def change(doc: dict[str, Any]) -> None:
        doc["sharing"]["mps"][idle] = {"previousComputeMode": "PROHIBITED"}

    _tamper(node, change)
    node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert ("nvidia-smi", "-i", idle, "-c", "PROHIBITED") not in tools.fake.argvs()
    assert tools.sim.mode(idle) == "DEFAULT"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("strategy", "Root", "enforcement.strategy is 'Root'; known: Exclusive"),
        ("strategy", None, "enforcement.strategy is None"),
        ("interval", "Long", "enforcement.interval is set for strategy MPS"),
        ("limitCores", 1000, "enforcement.limitCores 1000 is outside 0..100 (the GPU's cores)"),
        ("limitCores", -1, "enforcement.limitCores -1 is outside 0..100 (the GPU's cores)"),
        ("limitCores", "10", "enforcement.limitCores must be an integer"),
        ("limitMemory", 10**30, f"enforcement.limitMemory {10**30} is outside 0..{2**63 - 1}"),
        ("limitMemory", 10**15, f"enforcement.limitMemory {10**15} is above the GPU's "),
        ("limitMemory", None, "enforcement.limitMemory must be an integer"),
    ],
)
def test_an_enforcement_that_does_not_fit_its_device_rolls_the_claim_back(
    node: h.Node, field: str, value: Any, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    tools = Tools.new()
    claims, objs = _prepare(node, 1, enforcer=tools.enforcer(node.data_dir), configs=[MPS])
    uid = objs[0]["metadata"]["uid"]
    assert node.checkpoint()["claims"][uid]["devices"][0]["enforcement"]["strategy"] == "MPS"

    def change(doc: dict[str, Any]) -> None:
        doc["claims"][uid]["devices"][0]["enforcement"][field] = value

    _tamper(node, change)
    tools.fake.clear()
    with caplog.at_level(logging.WARNING):
        state = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert f"claims[{uid}].devices[0].{message}" in caplog.text
    assert uid not in state.prepared_claims()
    assert uid not in node.checkpoint()["claims"]
    # Rolled back: the claim's daemon is stopped, and nothing else ran.
    assert tools.sim.daemons == {}
    assert node.spec_files() == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpu_uuid", "VICTIM"),
        ("gpu_uuid", h.gpus()[2].uuid),
        ("device", "gpu-2"),
        ("strategy", "Root"),
        ("interval", "Forever"),
        ("limit_cores", 1000),
        ("memory", 10**30),
    ],
)
def test_a_format1_grant_that_does_not_fit_its_device_rolls_the_claim_back(
    node: h.Node, field: str, value: Any
) -> None:
    tools = Tools.new()
    claims, objs = _prepare(node, 1, enforcer=tools.enforcer(node.data_dir), configs=[MPS])
    victim = _victim(node.root)
    uid = objs[0]["metadata"]["uid"]
    value = str(victim) if value == "VICTIM" else value

    def change(doc: dict[str, Any]) -> None:
        as_format1(doc)
        doc["claims"][uid]["sharing"]["grants"][0][field] = value

    _tamper(node, change)
    tools.fake.clear()
    state = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert uid not in state.prepared_claims()
    assert _intact(victim)
    assert not any("victim" in arg for a in tools.fake.argvs() for arg in a)
    assert tools.sim.daemons == {}


def test_an_untampered_format1_grant_is_read_back(node: h.Node) -> None:
    """The control of the test above: the same rewrite without a change keeps the claim."""
    tools = Tools.new()
    claims, objs = _prepare(node, 1, enforcer=tools.enforcer(node.data_dir), configs=[MPS])
    uid = objs[0]["metadata"]["uid"]
    _tamper(node, as_format1)
    enforcer = tools.enforcer(node.data_dir)
    state = node.state(claims, enforcer=enforcer)
    (device,) = state.prepared_claims()[uid].devices
    assert device.enforcement is not None and device.enforcement.strategy == "MPS"
    assert [d.enforced.strategy for d in enforcer.held()[uid]] == ["MPS"]


JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False),
        st.text(max_size=20),
        st.sampled_from(["../../victim", "/", "VICTIM", "nvidia.com/gpu=all", "PROHIBITED"]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_field_of_a_checkpoint_replaced_by_any_json_never_breaks_a_start(
    data: st.DataObject,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        node = h.Node(root)
        tools = Tools.new()
        claims, _ = _prepare(node, 2, enforcer=tools.enforcer(node.data_dir), configs=[MPS])
        victim = _victim(root)
        doc = node.checkpoint()
        path = data.draw(st.sampled_from([p for p in json_paths(doc) if p and p[0] != "checksum"]))
        value = data.draw(
            st.one_of(
                JSON,
                st.sampled_from(
                    ["VICTIM", "../../victim", h.gpus()[5].uuid, "gpu-99", "gpu-1", 10**30, -1]
                ),
            )
        )
        value = str(victim) if value == "VICTIM" else value

        def change(d: dict[str, Any]) -> None:
            target: Any = d
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value

        _tamper(node, change)
        state = node.state(claims, enforcer=tools.enforcer(node.data_dir))  # never raises
        assert _intact(victim)
        for file in root.rglob("*"):
            if not file.is_dir():
                assert any(
                    file.is_relative_to(d)
                    for d in (victim, node.cdi_dir, node.data_dir, node.boot_id_file)
                ), file
        table = node_devices(h.gpus(), "consumable")
        for rec in state.prepared_claims().values():
            for d in rec.devices:
                assert d.device in table and table[d.device].gpu.uuid == d.gpu_uuid
                assert 0 <= d.cores <= 100 and 0 <= d.memory <= table[d.device].gpu.memory_total


def test_a_recorded_share_larger_than_its_allocation_restarts_at_the_allocation(
    node: h.Node, caplog: pytest.LogCaptureFixture
) -> None:
    """A record of 60 cores for a claim allocated 10: after the restart the daemon runs at the
    allocation's 10 %, the record is corrected, and the mismatch is logged as an error."""
    tools = Tools.new()
    claims, objs = _prepare(node, 1, enforcer=tools.enforcer(node.data_dir), configs=[MPS])
    uid = objs[0]["metadata"]["uid"]

    def change(doc: dict[str, Any]) -> None:
        device = doc["claims"][uid]["devices"][0]
        device["cores"] = 60
        device["memory"] = 4 * GI
        device["enforcement"].update(limitCores=60, limitMemory=4 * GI)

    _tamper(node, change)
    tools.sim.kill_daemons()  # the node restarted: the daemon starts from the record
    with caplog.at_level(logging.ERROR):
        state = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert "records 60 cores" in caplog.text and "grants 10 cores" in caplog.text
    (device,) = state.prepared_claims()[uid].devices
    assert (device.cores, device.memory) == (10, GI)
    assert device.enforcement is not None and device.enforcement.limit_cores == 10
    (limits,) = tools.sim.default_limits.values()
    assert limits["active_thread_percentage"] == "10"
    assert node.checkpoint()["claims"][uid]["devices"][0]["cores"] == 10


def test_a_recorded_device_the_allocation_lacks_rolls_the_claim_back(node: h.Node) -> None:
    claims, objs = _prepare(node, 1)
    uid = objs[0]["metadata"]["uid"]

    def change(doc: dict[str, Any]) -> None:
        doc["claims"][uid]["devices"][0]["device"] = "gpu-3"
        doc["claims"][uid]["devices"][0]["gpuUUID"] = h.gpus()[3].uuid

    _tamper(node, change)
    assert uid not in node.state(claims).prepared_claims()


def test_without_an_answer_from_the_api_server_the_record_is_kept(node: h.Node) -> None:
    claims, objs = _prepare(node, 2)
    uid = objs[0]["metadata"]["uid"]

    def change(doc: dict[str, Any]) -> None:
        doc["claims"][uid]["devices"][0]["cores"] = 60

    _tamper(node, change)
    claims.claims.clear()  # every claim gone: nothing to compare with
    (device,) = node.state(claims).prepared_claims()[uid].devices
    assert device.cores == 60
