"""The device record in the checkpoint: what enforcement decided travels in each device's entry
(format 2), read back with every field checked; documents of format 1, which kept the
decisions as the claim's ``sharing.grants``, restore the same claims after an upgrade."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.devicerecord import DeviceRecord, Enforcement
from kubeletplugin.prepare.checkpoint import (
    CHECKPOINT_VERSION,
    CheckpointError,
    ClaimRecord,
    device_from_json,
    device_to_json,
    format1_sharing,
)
from tests.kubeletplugin.prepare import helpers as h
from tests.kubeletplugin.prepare.checkpoint_files import as_format1
from tests.kubeletplugin.sharing.helpers import GI, LIBRARY, Tools, gpu_config

#: A checkpoint document as the plugin of format 1 wrote it for the claims of :func:`claims`
#: (its checksum dropped, its boot ID a placeholder).
FORMAT1 = Path(__file__).parent / "data" / "checkpoint-format1.json"


def _share(request: str, device: str, share_id: str, cores: int, memory: int) -> dict[str, Any]:
    result = h.result(request, device, share={"cores": cores, "memory": memory})
    result["shareID"] = share_id
    return result


def claims() -> list[dict[str, Any]]:
    """The claims :data:`FORMAT1` records: TimeSlicing Long, MPS below its share, Limits, and a
    claim with a whole GPU, a default MPS share and an adminAccess device."""
    return [
        h.claim(
            "slices",
            [_share("gpu", "gpu-0", "00000000-0000-4000-8000-00000000000a", 30, 10 * GI)],
            uid="0a0a0a0a-0000-4000-8000-000000000001",
            configs=[gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})],
        ),
        h.claim(
            "mps-low",
            [_share("gpu", "gpu-1", "00000000-0000-4000-8000-00000000000b", 40, 8 * GI)],
            uid="0b0b0b0b-0000-4000-8000-000000000002",
            configs=[
                gpu_config(
                    {
                        "strategy": "MPS",
                        "mps": {"activeThreadPercentage": 20, "pinnedMemoryLimit": "4Gi"},
                    }
                )
            ],
        ),
        h.claim(
            "limits",
            [_share("gpu", "gpu-2", "00000000-0000-4000-8000-00000000000c", 20, 2 * GI)],
            uid="0c0c0c0c-0000-4000-8000-000000000003",
            configs=[gpu_config({"strategy": "Limits", "limits": {"smLimit": 10}})],
        ),
        h.claim(
            "mixed",
            [
                h.result("whole", "gpu-3"),
                _share("mps", "gpu-1", "00000000-0000-4000-8000-00000000000d", 10, GI),
                h.result("admin", "gpu-0", admin=True),
            ],
            uid="0d0d0d0d-0000-4000-8000-000000000004",
        ),
    ]


def test_a_format1_checkpoint_restores_every_claim_as_this_plugin_records_it(
    node: h.Node,
) -> None:
    tools = Tools.new()
    objs = claims()
    fake = h.FakeClaims()
    fake.add(*objs)
    outs = node.state(fake, enforcer=tools.enforcer(node.data_dir, LIBRARY)).prepare(
        [h.ref(o) for o in objs]
    )
    assert all(o.error == "" for o in outs.values()), outs
    native = node.checkpoint()
    limits = dict(tools.sim.default_limits)
    started = tools.sim.daemons_started
    # The plugin is upgraded over the format-1 document (written for the same claims, spec
    # files and daemons).
    old = json.loads(FORMAT1.read_text())
    assert old["version"] == 1
    old["bootID"] = node.boot_id_file.read_text().strip()
    node.write_checkpoint(old)
    tools.fake.clear()
    enforcer = tools.enforcer(node.data_dir, LIBRARY)
    state = node.state(fake, enforcer=enforcer)
    assert set(state.prepared_claims()) == {o["metadata"]["uid"] for o in objs}
    upgraded = node.checkpoint()
    assert upgraded["version"] == CHECKPOINT_VERSION == 2
    # What the upgrade wrote is what this plugin writes for the same claims.
    assert upgraded["claims"] == native["claims"]
    # Its grants are still written, as format 1 wrote them (for a downgrade).
    assert {u: c["sharing"] for u, c in upgraded["claims"].items()} == {
        u: c["sharing"] for u, c in old["claims"].items()
    }
    strategies = {
        uid: [d.enforced.strategy for d in devices] for uid, devices in enforcer.held().items()
    }
    assert strategies == {
        "0a0a0a0a-0000-4000-8000-000000000001": ["TimeSlicing"],
        "0b0b0b0b-0000-4000-8000-000000000002": ["MPS"],
        "0c0c0c0c-0000-4000-8000-000000000003": ["Limits"],
        "0d0d0d0d-0000-4000-8000-000000000004": ["Exclusive", "MPS"],
    }
    mps_low = state.prepared_claims()["0b0b0b0b-0000-4000-8000-000000000002"].devices[0]
    assert mps_low.enforcement == Enforcement("MPS", 20, 4 * GI)
    # The daemons were adopted with their limits, the interval kept: nothing was restarted.
    assert tools.sim.daemons_started == started
    assert tools.sim.default_limits == limits
    assert tools.sim.timeslices[h.gpus()[0].uuid] == 3


def test_a_format1_claim_without_grants_gets_the_default_strategies(node: h.Node) -> None:
    """Format 1 recorded no grants for a claim rebuilt from its CDI spec: at the upgrade its
    devices are undecided, and restore decides the defaults (then recorded)."""
    tools = Tools.new()
    objs = claims()[3:]
    fake = h.FakeClaims()
    fake.add(*objs)
    node.state(fake, enforcer=tools.enforcer(node.data_dir)).prepare([h.ref(objs[0])])
    doc = node.checkpoint()
    as_format1(doc)
    (claim,) = doc["claims"].values()
    claim["sharing"] = {}
    node.write_checkpoint(doc)
    state = node.state(fake, enforcer=tools.enforcer(node.data_dir))
    (rec,) = state.prepared_claims().values()
    assert [d.enforcement.strategy if d.enforcement else None for d in rec.devices] == [
        "Exclusive",
        "MPS",
        None,
    ]
    (claim,) = node.checkpoint()["claims"].values()
    assert [d.get("enforcement", {}).get("strategy") for d in claim["devices"]] == [
        "Exclusive",
        "MPS",
        None,
    ]


def test_a_format2_checkpoint_read_as_format1_resumes_the_same_decisions(node: h.Node) -> None:
    """What a plugin downgraded to format 1 reads of a format-2 document: the devices without
    ``enforcement`` (it does not know the field) and the claim's ``sharing.grants``, which
    format 2 still writes; the decisions it resumes are the ones recorded."""
    tools = Tools.new()
    objs = claims()
    fake = h.FakeClaims()
    fake.add(*objs)
    node.state(fake, enforcer=tools.enforcer(node.data_dir, LIBRARY)).prepare(
        [h.ref(o) for o in objs]
    )
    doc = node.checkpoint()
    for uid, raw in doc["claims"].items():
        native = ClaimRecord.from_json(uid, raw)
        for d in raw["devices"]:
            d.pop("enforcement", None)
        as_read_by_format1 = ClaimRecord.from_json(uid, raw)
        assert [d.enforcement for d in as_read_by_format1.devices] == [
            d.enforcement for d in native.devices
        ], uid


def test_grants_are_written_only_when_every_enforced_device_is_decided() -> None:
    decided = _record(enforcement=Enforcement("MPS", 20, 4 * GI))
    undecided = _record(device="gpu-1")
    admin = _record(device="gpu-2", share_id=None, admin_access=True)
    assert format1_sharing((decided, admin))["grants"][0]["limit_cores"] == 20
    assert len(format1_sharing((decided, admin))["grants"]) == 1
    assert format1_sharing((decided, undecided)) == {}
    assert format1_sharing((admin,)) == {}


# --- the record's round trip ---------------------------------------------------------------------


def _record(**fields: Any) -> DeviceRecord:
    base: dict[str, Any] = {
        "requests": ("gpu", "other/alt"),
        "pool": h.NODE,
        "device": "gpu-0",
        "gpu_uuid": h.gpus()[0].uuid,
        "cores": 30,
        "memory": 10 * GI,
        "cdi_name": "c-gpu-0-s",
        "cdi_device_ids": ("k8s.x/claim=c-gpu-0-s",),
        "share_id": "s",
    }
    return DeviceRecord(**{**base, **fields})


@pytest.mark.parametrize(
    "enforcement",
    [
        None,
        Enforcement("MPS", 20, 4 * GI),
        Enforcement("TimeSlicing", 30, 10 * GI, "Long"),
        Enforcement("Limits", 0, 10 * GI),
        Enforcement("Exclusive", 30, 10 * GI),
    ],
)
def test_a_device_record_round_trips_through_the_checkpoint(
    enforcement: Enforcement | None,
) -> None:
    rec = _record(enforcement=enforcement, extra={"newerField": [1]}, gpu_info=h.gpus()[0])
    raw = device_to_json(rec)
    assert json.loads(json.dumps(raw)) == raw
    assert ("enforcement" in raw) == (enforcement is not None)
    if enforcement is not None:
        assert ("interval" in raw["enforcement"]) == (enforcement.strategy == "TimeSlicing")
    back = device_from_json(raw, "d")
    assert back == rec
    assert back.extra == {"newerField": [1]}
    # The attached GPU is never stored: a record read back has none until the state attaches it.
    assert back.gpu_info is None and rec.gpu.uuid == rec.gpu_uuid
    with pytest.raises(ValueError, match="no GPU attached"):
        back.gpu  # noqa: B018
    assert back.base_requests == ("gpu", "other")


@pytest.mark.parametrize(
    ("enforcement", "fields", "message"),
    [
        ("MPS", {}, "d.enforcement is not an object"),
        ({"strategy": "mps"}, {}, "d.enforcement.strategy is 'mps'; known: Exclusive, "),
        ({"strategy": "MPS", "limitCores": 101, "limitMemory": 0}, {}, "limitCores 101 is outside"),
        ({"strategy": "MPS", "limitCores": 1, "limitMemory": 1.5}, {}, "must be an integer"),
        ({"strategy": "MPS", "limitCores": True, "limitMemory": 0}, {}, "must be an integer"),
        (
            {"strategy": "TimeSlicing", "limitCores": 1, "limitMemory": 1},
            {},
            "d.enforcement.interval is None; known: Default, Short, Medium, Long",
        ),
        (
            {"strategy": "Limits", "limitCores": 1, "limitMemory": 1, "interval": "Long"},
            {},
            "d.enforcement.interval is set for strategy Limits",
        ),
        (
            {"strategy": "Exclusive", "limitCores": 1, "limitMemory": 1},
            {"adminAccess": True},
            "d.enforcement: an adminAccess device is never enforced",
        ),
    ],
)
def test_a_bad_enforcement_names_its_field(
    enforcement: Any, fields: dict[str, Any], message: str
) -> None:
    raw = {**device_to_json(_record()), **fields, "enforcement": enforcement}
    with pytest.raises(CheckpointError, match=message.replace(".", r"\.")):
        device_from_json(raw, "d")


def _claim_json(**fields: Any) -> dict[str, Any]:
    return {
        "state": "PrepareCompleted",
        "namespace": "default",
        "name": "c",
        "devices": [device_to_json(_record())],
        **fields,
    }


def _grant(**fields: Any) -> dict[str, Any]:
    rec = _record()
    return {
        "gpu_uuid": rec.gpu_uuid,
        "device": rec.device,
        "requests": list(rec.requests),
        "strategy": "MPS",
        "cores": rec.cores,
        "memory": rec.memory,
        "limit_cores": 10,
        "limit_memory": GI,
        "interval": None,
        **fields,
    }


def test_format1_grants_pair_with_the_devices_without_admin_access() -> None:
    admin = device_to_json(_record(device="gpu-1", share_id=None, admin_access=True))
    raw = _claim_json(devices=[admin, device_to_json(_record())], sharing={"grants": [_grant()]})
    rec = ClaimRecord.from_json("c-1", raw)
    assert [d.enforcement for d in rec.devices] == [None, Enforcement("MPS", 10, GI)]
    # Written back as read: the grants a downgraded plugin would read are the same.
    assert rec.to_json()["sharing"] == {"grants": [_grant()]}


@pytest.mark.parametrize(
    ("grants", "message"),
    [
        ("all", r"claims\[c-1\]\.sharing\.grants is not a list"),
        ([], r"has 0 entries for 1 devices without adminAccess"),
        ([_grant(), _grant()], r"has 2 entries for 1 devices"),
        (["x"], r"grants\[0\] is not an object"),
        ([_grant(requests=["other"])], r"grants\[0\]\.requests is \['other'\], not devices\[0\]"),
        ([_grant(cores=31)], r"grants\[0\]\.cores is 31"),
        ([_grant(gpu_uuid="GPU-x")], r"grants\[0\]\.gpu_uuid 'GPU-x' is not devices\[0\]'s GPU"),
        ([_grant(limit_memory=2**63)], r"grants\[0\]\.limit_memory \d+ is outside"),
        ([_grant(strategy="Root")], r"grants\[0\]\.strategy is 'Root'"),
    ],
)
def test_format1_grants_that_do_not_pair_name_the_problem(grants: Any, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        ClaimRecord.from_json("c-1", _claim_json(sharing={"grants": grants}))


def test_devices_that_carry_their_enforcement_ignore_format1_grants() -> None:
    """A downgrade followed by an upgrade: the earlier plugin kept the devices' enforcement as
    fields it did not know; the grants it left beside them are not read."""
    raw = _claim_json(
        devices=[device_to_json(_record(enforcement=Enforcement("MPS", 30, 10 * GI)))],
        sharing={"grants": [_grant(strategy="Root")]},
    )
    (device,) = ClaimRecord.from_json("c-1", raw).devices
    assert device.enforcement == Enforcement("MPS", 30, 10 * GI)


def test_the_decision_is_part_of_the_record_equality() -> None:
    rec = _record()
    assert replace(rec, enforcement=Enforcement("MPS", 1, 1)) != rec
    assert replace(rec, gpu_info=h.gpus()[1]) == rec
