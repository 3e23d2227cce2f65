"""DRAPlugin v1 and v1beta1 round trips through the real sockets with a fake preparer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from kubeletplugin.kubelet.draservice import (
    INVALID_REFERENCE_ERROR,
    MISSING_OUTCOME_ERROR,
)
from kubeletplugin.kubelet.preparer import (
    ClaimRef,
    PrepareOutcome,
    UnprepareOutcome,
    claim_ref_problem,
)
from kubeletplugin.model import base_request_names
from sharegpuctl.local.kubelet import KubeletSim, RegisteredPlugin, SimDevice
from tests.kubeletplugin.kubelet.helpers import (
    DRIVER,
    Dirs,
    FakePreparer,
    PlainPreparedDevice,
    one_device,
    running_server,
)

V1 = "v1.DRAPlugin"
V1BETA1 = "v1beta1.DRAPlugin"
VERSIONS = [V1, V1BETA1]
SHARE = "7f2c9e4a-1b3d-4c5e-8f6a-0b1c2d3e4f50"


def _claims(n: int) -> list[ClaimRef]:
    return [ClaimRef("team-a", f"uid-{i}", f"claim-{i}") for i in range(n)]


def _sharing(claims: Sequence[ClaimRef]) -> Mapping[str, PrepareOutcome]:
    return {
        c.uid: PrepareOutcome(
            devices=(
                PlainPreparedDevice(
                    request_names=("gpu/h100", "gpu/a100", "other"),
                    pool_name="node-1",
                    device_name="gpu-3",
                    cdi_device_ids=(
                        f"k8s.gpu.sharegpu.dev/claim={c.uid}-gpu-3-{SHARE[:8]}",
                        "nvidia.com/gpu=GPU-1234",
                    ),
                    share_id=SHARE,
                ),
                PlainPreparedDevice(
                    request_names=(),
                    pool_name="node-1",
                    device_name="gpu-4",
                    cdi_device_ids=(f"k8s.gpu.sharegpu.dev/claim={c.uid}-gpu-4",),
                ),
            )
        )
        for c in claims
    }


def _plugin(dirs: Dirs, kubelet: KubeletSim) -> RegisteredPlugin:
    return kubelet.register(DRIVER)


@pytest.mark.parametrize("version", VERSIONS)
def test_prepare_round_trip(dirs: Dirs, version: str) -> None:
    preparer = FakePreparer(prepare_fn=_sharing)
    with running_server(dirs, preparer), KubeletSim(dirs.registry) as kubelet:
        results = _plugin(dirs, kubelet).prepare(_claims(2), version=version)
    assert preparer.prepare_calls == [_claims(2)]
    expected_share = SHARE if version == V1 else None
    for claim in _claims(2):
        assert results[claim.uid].error == ""
        assert results[claim.uid].devices == (
            SimDevice(
                request_names=("gpu", "other"),
                pool_name="node-1",
                device_name="gpu-3",
                cdi_device_ids=(
                    f"k8s.gpu.sharegpu.dev/claim={claim.uid}-gpu-3-{SHARE[:8]}",
                    "nvidia.com/gpu=GPU-1234",
                ),
                share_id=expected_share,
            ),
            SimDevice(
                request_names=(),
                pool_name="node-1",
                device_name="gpu-4",
                cdi_device_ids=(f"k8s.gpu.sharegpu.dev/claim={claim.uid}-gpu-4",),
                share_id=None,
            ),
        )


@pytest.mark.parametrize("version", VERSIONS)
def test_unprepare_round_trip(dirs: Dirs, version: str) -> None:
    preparer = FakePreparer(
        unprepare_fn=lambda claims: {
            c.uid: UnprepareOutcome(error="busy" if c.uid == "uid-1" else "") for c in claims
        }
    )
    with running_server(dirs, preparer), KubeletSim(dirs.registry) as kubelet:
        errors = _plugin(dirs, kubelet).unprepare(_claims(3), version=version)
    assert errors == {"uid-0": "", "uid-1": "busy", "uid-2": ""}
    assert preparer.unprepare_calls == [_claims(3)]


@pytest.mark.parametrize("version", VERSIONS)
def test_per_claim_error_drops_devices(dirs: Dirs, version: str) -> None:
    def fn(claims: Sequence[ClaimRef]) -> Mapping[str, PrepareOutcome]:
        return {
            c.uid: PrepareOutcome(devices=one_device(c).devices, error="claim was replaced")
            if c.uid == "uid-1"
            else one_device(c)
            for c in claims
        }

    with running_server(dirs, FakePreparer(prepare_fn=fn)), KubeletSim(dirs.registry) as kubelet:
        results = _plugin(dirs, kubelet).prepare(_claims(3), version=version)
    assert results["uid-1"].error == "claim was replaced"
    assert results["uid-1"].devices == ()
    assert [len(results[u].devices) for u in ("uid-0", "uid-2")] == [1, 1]


@pytest.mark.parametrize("version", VERSIONS)
def test_preparer_exception_becomes_error_for_every_claim(dirs: Dirs, version: str) -> None:
    def boom(claims: Sequence[ClaimRef]) -> Mapping[str, PrepareOutcome]:
        raise OSError("checkpoint disk is full")

    def boom_unprepare(claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareOutcome]:
        raise ValueError("bad state")

    preparer = FakePreparer(prepare_fn=boom, unprepare_fn=boom_unprepare)
    with running_server(dirs, preparer), KubeletSim(dirs.registry) as kubelet:
        plugin = _plugin(dirs, kubelet)
        results = plugin.prepare(_claims(3), version=version)
        errors = plugin.unprepare(_claims(3), version=version)
    assert {uid: r.error for uid, r in results.items()} == {
        f"uid-{i}": "prepare failed: OSError: checkpoint disk is full" for i in range(3)
    }
    assert all(r.devices == () for r in results.values())
    assert errors == {f"uid-{i}": "unprepare failed: ValueError: bad state" for i in range(3)}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_claim_answered_even_when_preparer_forgets_some(dirs: Dirs, version: str) -> None:
    def forgetful(claims: Sequence[ClaimRef]) -> Mapping[str, PrepareOutcome]:
        out = {c.uid: one_device(c) for c in claims if c.uid != "uid-2"}
        out["uid-unasked"] = one_device(ClaimRef("x", "uid-unasked", "x"))
        return out

    preparer = FakePreparer(prepare_fn=forgetful, unprepare_fn=lambda claims: {})
    with running_server(dirs, preparer), KubeletSim(dirs.registry) as kubelet:
        plugin = _plugin(dirs, kubelet)
        results = plugin.prepare(_claims(4), version=version)
        errors = plugin.unprepare(_claims(2), version=version)
    assert set(results) == {"uid-0", "uid-1", "uid-2", "uid-3"}
    assert results["uid-2"].error == MISSING_OUTCOME_ERROR
    assert results["uid-3"].error == ""
    assert errors == {"uid-0": MISSING_OUTCOME_ERROR, "uid-1": MISSING_OUTCOME_ERROR}


@pytest.mark.parametrize("version", VERSIONS)
def test_empty_claim_list_does_not_reach_the_preparer(dirs: Dirs, version: str) -> None:
    preparer = FakePreparer()
    with running_server(dirs, preparer), KubeletSim(dirs.registry) as kubelet:
        plugin = _plugin(dirs, kubelet)
        assert plugin.prepare([], version=version) == {}
        assert plugin.unprepare([], version=version) == {}
    assert preparer.prepare_calls == [] and preparer.unprepare_calls == []


def test_duplicate_and_uidless_claims(dirs: Dirs) -> None:
    preparer = FakePreparer()
    claims = [ClaimRef("ns", "uid-0", "a"), ClaimRef("ns", "uid-0", "a"), ClaimRef("ns", "", "b")]
    with running_server(dirs, preparer), KubeletSim(dirs.registry) as kubelet:
        results = _plugin(dirs, kubelet).prepare(claims)
    assert preparer.prepare_calls == [[ClaimRef("ns", "uid-0", "a")]]
    assert results["uid-0"].error == ""
    assert results[""].error == "kubelet sent a claim without a UID"


def test_huge_batch(dirs: Dirs) -> None:
    claims = _claims(2000)
    preparer = FakePreparer(prepare_fn=_sharing)
    with running_server(dirs, preparer), KubeletSim(dirs.registry) as kubelet:
        plugin = _plugin(dirs, kubelet)
        results = plugin.prepare(claims)
        errors = plugin.unprepare(claims)
    assert set(results) == {c.uid for c in claims}
    assert all(r.error == "" and len(r.devices) == 2 for r in results.values())
    assert results["uid-1999"].devices[0].share_id == SHARE
    assert set(errors) == {c.uid for c in claims} and not any(errors.values())


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ([], ()),
        (["gpu"], ("gpu",)),
        (["gpu/h100"], ("gpu",)),
        (["gpu/h100", "gpu/a100", "nic", "gpu"], ("gpu", "nic")),
        (["b/x", "a"], ("b", "a")),
    ],
)
def test_base_request_names(names: list[str], expected: tuple[str, ...]) -> None:
    assert base_request_names(names) == expected


HOSTILE_REFS = [
    (ClaimRef("team-a", "x/../../victim", "claim"), "uid 'x/../../victim' is not a UID"),
    (ClaimRef("team-a", "..", "claim"), "uid '..' is not a UID"),
    (ClaimRef("team-a", "a.b", "claim"), "uid 'a.b' is not a UID"),
    (ClaimRef("team-a", "uid\x00", "claim"), "is not a UID"),
    (ClaimRef("team-a", "u" * 129, "claim"), "is not a UID"),
    (ClaimRef("Team_A", "uid-9", "claim"), "namespace 'Team_A' is not a DNS label"),
    (ClaimRef("team-a", "uid-9", "../claim"), "name '../claim' is not a DNS subdomain"),
]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("hostile", "problem"), HOSTILE_REFS)
def test_invalid_claim_references_never_reach_the_preparer(
    dirs: Dirs, version: str, hostile: ClaimRef, problem: str
) -> None:
    preparer = FakePreparer()
    good = _claims(1)
    with running_server(dirs, preparer), KubeletSim(dirs.registry) as kubelet:
        plugin = _plugin(dirs, kubelet)
        prepared = plugin.prepare([hostile, *good], version=version)
        unprepared = plugin.unprepare([hostile, *good], version=version)
    for error in (prepared[hostile.uid].error, unprepared[hostile.uid]):
        assert error.startswith(f"{INVALID_REFERENCE_ERROR}: ") and problem in error
    assert prepared[hostile.uid].devices == ()
    assert prepared["uid-0"].error == "" and unprepared["uid-0"] == ""
    assert preparer.prepare_calls == [good] and preparer.unprepare_calls == [good]


def test_claim_reference_rules() -> None:
    uuid = "6f1c1b0e-7f0a-4b51-9a51-0f8c2f1b9e4d"
    assert claim_ref_problem(ClaimRef("default", uuid, "c")) is None
    long_name = ".".join(["a" * 63] * 3 + ["a" * 61])  # 253 characters, the limit
    assert claim_ref_problem(ClaimRef("default", "uid-1", long_name)) is None
    assert claim_ref_problem(ClaimRef("default", "uid-1", long_name + "a")) is not None
    shown = claim_ref_problem(ClaimRef("default", "/" * 500, "c"))
    assert shown is not None and len(shown) < 150
