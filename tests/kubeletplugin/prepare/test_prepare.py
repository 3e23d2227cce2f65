"""DeviceState prepare/unprepare with a fake ClaimGetter and the mock backend."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from api import names
from api.gpuconfig import DriverConfigs
from kubeletplugin.devicerecord import DeviceRecord, Enforcement
from kubeletplugin.devices.table import node_devices
from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.prepare.cdi import NvidiaCdiDetector
from kubeletplugin.prepare.checkpoint import CHECKPOINT_FILE
from kubeletplugin.prepare.state import KeyedLocks
from kubeletplugin.sharing.enforcement import Applied
from tests.kubeletplugin.prepare.helpers import (
    DRIVER,
    GI,
    NODE,
    FakeClaims,
    Node,
    RecordingEnforcer,
    assert_valid_cdi,
    claim,
    gpus,
    ref,
    result,
    spec_env,
)

KIND = names.cdi_kind(DRIVER)


def gpu_config(strategy: str) -> dict[str, Any]:
    """GpuConfig parameters naming ``strategy``."""
    return {
        "apiVersion": names.GROUP_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": strategy},
    }


def test_exclusive_whole_gpu(node: Node) -> None:
    claims = FakeClaims()
    c = claim("whole", [result("gpu", "gpu-3")])
    claims.add(c)
    state = node.state(claims)
    out = state.prepare([ref(c)])[c["metadata"]["uid"]]
    assert out.error == ""
    uid = c["metadata"]["uid"]
    (dev,) = out.devices
    assert dev.request_names == ("gpu",)
    assert (dev.pool_name, dev.device_name, dev.share_id) == (NODE, "gpu-3", None)
    assert dev.cdi_device_ids == (f"{KIND}={uid}-gpu-3",)
    (path,) = node.spec_files()
    assert path.name == f"k8s.{DRIVER}-claim_{uid}.json"
    doc = assert_valid_cdi(path)
    assert doc["kind"] == KIND
    assert doc["devices"][0]["name"] == f"{uid}-gpu-3"
    gpu = gpus()[3]
    env = spec_env(doc)
    assert env["NVIDIA_VISIBLE_DEVICES"] == gpu.uuid
    assert env["SHAREGPU_CLAIM"] == "default/whole"
    assert env["SHAREGPU_CLAIM_UID"] == uid
    assert env["SHAREGPU_DEVICE"] == "gpu-3"
    assert env["SHAREGPU_GPU_UUID"] == gpu.uuid
    assert env["SHAREGPU_CORES"] == "100"
    assert env["SHAREGPU_MEMORY"] == str(gpu.memory_usable)
    assert "SHAREGPU_SHARE_ID" not in env
    # Mock backend: no device nodes; cdiVersion is the lowest the content needs.
    assert "deviceNodes" not in doc["devices"][0]["containerEdits"]
    assert doc["cdiVersion"] == ("0.5.0" if uid[0].isdigit() else "0.3.0")
    assert node.checkpoint()["claims"][uid]["state"] == "PrepareCompleted"


def test_consumable_shares_as_the_scheduler_writes_them(node: Node) -> None:
    claims = FakeClaims()
    a = claim("a", [result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})])
    b = claim("b", [result("gpu", "gpu-0", share={"cores": 50, "memory": 20 * GI})])
    claims.add(a, b)
    state = node.state(claims)
    outs = state.prepare([ref(a), ref(b)])
    for obj, cores, mem in ((a, 30, 10 * GI), (b, 50, 20 * GI)):
        uid = obj["metadata"]["uid"]
        share_id = obj["status"]["allocation"]["devices"]["results"][0]["shareID"]
        (dev,) = outs[uid].devices
        assert outs[uid].error == ""
        assert dev.share_id == share_id
        assert dev.cdi_device_ids == (f"{KIND}={uid}-gpu-0-{share_id}",)
        doc = assert_valid_cdi(node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json")
        env = spec_env(doc)
        assert env["SHAREGPU_SHARE_ID"] == share_id
        assert env["SHAREGPU_CORES"] == str(cores)
        assert env["SHAREGPU_MEMORY"] == str(mem)
        assert doc["cdiVersion"] == ("0.5.0" if uid[0].isdigit() else "0.3.0")


def test_two_requests_in_one_claim_and_subrequest_names(node: Node) -> None:
    claims = FakeClaims()
    c = claim(
        "two",
        [
            result("train", "gpu-1"),
            result("infer/small", "gpu-2", share={"cores": 10, "memory": 4 * GI}),
        ],
    )
    claims.add(c)
    out = node.state(claims).prepare([ref(c)])[c["metadata"]["uid"]]
    assert out.error == ""
    # The answer carries the names as allocated; the gRPC layer reduces them to base names
    # ("infer") for kubelet, and the record computed those once for the CDI variables.
    assert [(d.request_names, d.device_name) for d in out.devices] == [
        (("train",), "gpu-1"),
        (("infer/small",), "gpu-2"),
    ]
    assert [d.base_requests for d in out.devices] == [("train",), ("infer",)]
    doc = assert_valid_cdi(node.spec_files()[0])
    assert len(doc["devices"]) == 2
    assert spec_env(doc, 1)["SHAREGPU_REQUEST"] == "infer"


def test_other_drivers_results_and_configs_are_ignored(node: Node) -> None:
    claims = FakeClaims()
    c = claim(
        "mixed",
        [result("nic", "eth0", driver="net.example.com"), result("gpu", "gpu-0")],
        configs=[
            {
                "source": "FromClaim",
                "requests": [],
                "opaque": {"driver": DRIVER, "parameters": gpu_config("TimeSlicing")},
            },
            {"source": "FromClass", "opaque": {"driver": "net.example.com", "parameters": {}}},
            {
                "source": "FromClass",
                "requests": ["gpu"],
                "opaque": {"driver": DRIVER, "parameters": gpu_config("Exclusive")},
            },
        ],
    )
    claims.add(c)
    seen: list[DriverConfigs] = []

    class Recorder(RecordingEnforcer):
        def apply(
            self, claim_uid: str, devices: Sequence[DeviceRecord], configs: DriverConfigs
        ) -> Applied:
            seen.append(configs)
            return super().apply(claim_uid, devices, configs)

    out = node.state(claims, enforcer=Recorder()).prepare([ref(c)])[c["metadata"]["uid"]]
    assert out.error == ""
    assert [d.device_name for d in out.devices] == ["gpu-0"]
    (configs,) = seen
    # Decoded once, this driver's only, DeviceClass entries first; positions are the claim's.
    assert configs.problems == ()
    assert [(e.position, e.source, e.requests, e.config.strategy) for e in configs.entries] == [
        (2, "FromClass", ("gpu",), "Exclusive"),
        (0, "FromClaim", (), "TimeSlicing"),
    ]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: claim("un", None), "is not allocated"),
        (
            lambda: claim("other", [result("nic", "eth0", driver="net.example.com")]),
            f"has no allocation result for driver {DRIVER} in pool {NODE}",
        ),
        (
            lambda: claim("elsewhere", [result("gpu", "gpu-0", pool="node-b")]),
            f"has no allocation result for driver {DRIVER} in pool {NODE}",
        ),
        (lambda: claim("ghost", [result("gpu", "gpu-99")]), "'gpu-99', which node node-a does not"),
    ],
)
def test_per_claim_errors(node: Node, make: Any, message: str) -> None:
    claims = FakeClaims()
    c = make()
    claims.add(c)
    state = node.state(claims)
    out = state.prepare([ref(c)])[c["metadata"]["uid"]]
    assert message in out.error
    assert out.devices == ()
    assert node.spec_files() == []
    assert state.prepared_claims() == {}


def test_uid_mismatch_and_missing_claim(node: Node) -> None:
    claims = FakeClaims()
    c = claim("replaced", [result("gpu", "gpu-0")], uid="11111111-1111-1111-1111-111111111111")
    claims.add(c)
    state = node.state(claims)
    old = ClaimRef(namespace="default", name="replaced", uid="22222222-2222-2222-2222-222222222222")
    missing = ClaimRef(namespace="default", name="nope", uid="33333333-3333-3333-3333-333333333333")
    outs = state.prepare([old, missing])
    assert "was replaced" in outs[old.uid].error
    assert "11111111-1111-1111-1111-111111111111" in outs[old.uid].error
    assert outs[missing.uid].error == "ResourceClaim default/nope not found"
    assert node.spec_files() == []


def test_repeated_prepare_is_idempotent_without_side_effects(node: Node) -> None:
    claims = FakeClaims()
    c = claim("again", [result("gpu", "gpu-0", share={"cores": 20, "memory": 8 * GI})])
    claims.add(c)
    state = node.state(claims)
    first = state.prepare([ref(c)])
    (path,) = node.spec_files()
    mtime = path.stat().st_mtime_ns
    ckpt = (node.data_dir / CHECKPOINT_FILE).stat().st_mtime_ns
    gets = claims.gets
    for _ in range(3):
        assert state.prepare([ref(c)]) == first
    assert claims.gets == gets
    assert path.stat().st_mtime_ns == mtime
    assert (node.data_dir / CHECKPOINT_FILE).stat().st_mtime_ns == ckpt
    # A restarted plugin answers the same from its checkpoint.
    assert node.state(claims).prepare([ref(c)]) == first


def test_unprepare_removes_spec_and_state_and_unknown_succeeds(node: Node) -> None:
    claims = FakeClaims()
    c = claim("bye", [result("gpu", "gpu-0")])
    claims.add(c)
    state = node.state(claims)
    state.prepare([ref(c)])
    assert len(node.spec_files()) == 1
    unknown = ClaimRef(namespace="x", name="y", uid="44444444-4444-4444-4444-444444444444")
    outs = state.unprepare([ref(c), unknown])
    assert outs[c["metadata"]["uid"]].error == ""
    assert outs[unknown.uid].error == ""
    assert node.spec_files() == []
    assert node.checkpoint()["claims"] == {}
    # Repeated unprepare, and unprepare after the claim object is gone.
    claims.claims.clear()
    assert state.unprepare([ref(c)])[c["metadata"]["uid"]].error == ""


def test_exclusivity_is_the_last_line_of_defence(node: Node) -> None:
    claims = FakeClaims()
    whole = claim("whole", [result("gpu", "gpu-0")])
    share = claim("share", [result("gpu", "gpu-0", share={"cores": 10, "memory": GI})])
    whole2 = claim("whole2", [result("gpu", "gpu-0")])
    admin = claim("admin", [result("gpu", "gpu-0", admin=True)])
    other = claim("other", [result("gpu", "gpu-1")])
    claims.add(whole, share, whole2, admin, other)
    state = node.state(claims)
    assert state.prepare([ref(whole)])[whole["metadata"]["uid"]].error == ""
    out = state.prepare([ref(share)])[share["metadata"]["uid"]]
    assert "already prepared exclusively for ResourceClaim default/whole" in out.error
    out = state.prepare([ref(whole2)])[whole2["metadata"]["uid"]]
    assert "refusing to hand it out twice" in out.error
    assert state.prepare([ref(admin)])[admin["metadata"]["uid"]].error == ""
    assert state.prepare([ref(other)])[other["metadata"]["uid"]].error == ""
    # The share can go once the exclusive claim is unprepared; then a whole GPU cannot.
    state.unprepare([ref(whole)])
    assert state.prepare([ref(share)])[share["metadata"]["uid"]].error == ""
    out = state.prepare([ref(whole2)])[whole2["metadata"]["uid"]]
    assert "already prepared as a share for ResourceClaim default/share" in out.error
    assert len(node.spec_files()) == 3


def test_shares_and_partitions_coexist_but_not_the_same_partition(node: Node) -> None:
    claims = FakeClaims()
    h0 = claim("h0", [result("gpu", "gpu-0-half-0")])
    h1 = claim("h1", [result("gpu", "gpu-0-half-1")])
    h0b = claim("h0b", [result("gpu", "gpu-0-half-0")])
    whole = claim("w", [result("gpu", "gpu-0")])
    claims.add(h0, h1, h0b, whole)
    state = node.state(claims, sharing_mode=names.SHARING_MODE_PARTITIONS)
    outs = state.prepare([ref(h0), ref(h1), ref(h0b), ref(whole)])
    assert outs[h0["metadata"]["uid"]].error == ""
    assert outs[h1["metadata"]["uid"]].error == ""
    assert "as gpu-0-half-0" in outs[h0b["metadata"]["uid"]].error
    assert "refusing" in outs[whole["metadata"]["uid"]].error
    env = spec_env(
        assert_valid_cdi(node.cdi_dir / f"k8s.{DRIVER}-claim_{h1['metadata']['uid']}.json")
    )
    gpu = gpus()[0]
    assert env["SHAREGPU_CORES"] == "50"
    assert env["SHAREGPU_PARTITION"] == "half"
    assert env["SHAREGPU_MEMORY"] == str(gpu.memory_usable // 2)


def test_share_outside_the_gpu_is_refused(node: Node) -> None:
    claims = FakeClaims()
    c = claim("huge", [result("gpu", "gpu-0", share={"cores": 30, "memory": 200 * GI})])
    claims.add(c)
    out = node.state(claims).prepare([ref(c)])[c["metadata"]["uid"]]
    assert "consumed memory" in out.error and "usable memory" in out.error


def test_enforcer_edits_reach_the_spec_and_failures_roll_back(node: Node) -> None:
    claims = FakeClaims()
    good = claim("good", [result("gpu", "gpu-0", share={"cores": 40, "memory": 4 * GI})])
    bad = claim("bad", [result("gpu", "gpu-0", share={"cores": 10, "memory": GI})])
    claims.add(good, bad)
    enforcer = RecordingEnforcer(fail_for=bad["metadata"]["uid"])
    state = node.state(claims, enforcer=enforcer)
    outs = state.prepare([ref(good), ref(bad)])
    assert outs[good["metadata"]["uid"]].error == ""
    assert "MPS and TimeSlicing cannot share GPU x" in outs[bad["metadata"]["uid"]].error
    assert ("release", bad["metadata"]["uid"]) in enforcer.calls
    (path,) = node.spec_files()
    doc = assert_valid_cdi(path)
    assert spec_env(doc)["SHARE_LIMIT"] == "40"
    # A typed mount needs 0.4.0; a device name starting with a digit 0.5.0.
    assert doc["cdiVersion"] == ("0.5.0" if doc["devices"][0]["name"][0].isdigit() else "0.4.0")
    ckpt = node.checkpoint()
    assert ckpt["sharing"] == {"active": [good["metadata"]["uid"]]}
    # What the enforcer decided is in the device's record.
    (device,) = ckpt["claims"][good["metadata"]["uid"]]["devices"]
    assert device["enforcement"] == {"strategy": "Limits", "limitCores": 20, "limitMemory": 4 * GI}
    assert ckpt["claims"][good["metadata"]["uid"]]["sharing"]["grants"][0]["strategy"] == "Limits"
    # A restart hands the state and the recorded devices back to the enforcer.
    enforcer2 = RecordingEnforcer()
    state2 = node.state(claims, enforcer=enforcer2)
    assert enforcer2.restored is not None
    st, prepared = enforcer2.restored
    assert st == {"active": [good["metadata"]["uid"]]}
    (restored,) = prepared[good["metadata"]["uid"]]
    assert (restored.device, restored.cores, restored.memory) == ("gpu-0", 40, 4 * GI)
    assert restored.enforcement == Enforcement("Limits", 20, 4 * GI)
    assert restored.gpu.uuid == restored.gpu_uuid
    (kept,) = state2.prepared_claims()[good["metadata"]["uid"]].devices
    assert kept.enforcement == Enforcement("Limits", 20, 4 * GI)


def test_device_nodes_with_a_dev_root(node: Node, tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia2", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    claims = FakeClaims()
    c = claim("dn", [result("gpu", "gpu-2")], uid="abcdef00-0000-4000-8000-000000000000")
    claims.add(c)
    node.state(claims, dev_root=dev).prepare([ref(c)])
    doc = assert_valid_cdi(node.spec_files()[0])
    nodes = doc["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes == [
        {"path": "/dev/nvidia2", "hostPath": str(dev / "nvidia2")},
        {"path": "/dev/nvidiactl", "hostPath": str(dev / "nvidiactl")},
        {"path": "/dev/nvidia-uvm", "hostPath": str(dev / "nvidia-uvm")},
    ]
    # hostPath needs 0.5.0 even though the device name starts with a letter.
    assert doc["cdiVersion"] == "0.5.0"


def test_absent_uvm_nodes_go_in_by_their_numbers(node: Node, tmp_path: Path) -> None:
    """The host lacks /dev/nvidia-uvm*, but the module is loaded: the container gets them."""
    dev, proc = tmp_path / "dev", tmp_path / "proc"
    dev.mkdir()
    proc.mkdir()
    for name in ("nvidia2", "nvidiactl"):
        (dev / name).touch()
    (proc / "devices").write_text("Character devices:\n195 nvidia\n238 nvidia-uvm\n")
    claims = FakeClaims()
    c = claim("uvm", [result("gpu", "gpu-2")])
    claims.add(c)
    assert (
        node.state(claims, dev_root=dev, proc_root=proc)
        .prepare([ref(c)])[c["metadata"]["uid"]]
        .error
        == ""
    )
    doc = assert_valid_cdi(node.spec_files()[0])
    nodes = doc["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes[2:] == [
        {
            "path": "/dev/nvidia-uvm",
            "type": "c",
            "major": 238,
            "minor": 0,
            "fileMode": 0o666,
            "permissions": "rw",
        },
        {
            "path": "/dev/nvidia-uvm-tools",
            "type": "c",
            "major": 238,
            "minor": 1,
            "fileMode": 0o666,
            "permissions": "rw",
        },
    ]


def test_nvidia_toolkit_spec_adds_its_device_id(node: Node, tmp_path: Path) -> None:
    etc = tmp_path / "etc-cdi"
    etc.mkdir()
    gpu = gpus()[1]
    (etc / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        f"- name: {gpu.uuid}\n  containerEdits:\n    env: [X=1]\n"
        "- name: all\n  containerEdits:\n    env: [X=1]\n"
    )
    claims = FakeClaims()
    c = claim("tk", [result("gpu", "gpu-1")])
    claims.add(c)
    detector = NvidiaCdiDetector(names.NVIDIA_CTK_CDI_KIND, [etc, tmp_path / "absent"])
    out = node.state(claims, nvidia=detector).prepare([ref(c)])[c["metadata"]["uid"]]
    uid = c["metadata"]["uid"]
    assert out.devices[0].cdi_device_ids == (f"nvidia.com/gpu={gpu.uuid}", f"{KIND}={uid}-gpu-1")


def test_nvidia_toolkit_spec_with_index_names_and_without_the_gpu(tmp_path: Path) -> None:
    run = tmp_path / "run-cdi"
    run.mkdir()
    (run / "nvidia.json").write_text(
        '{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": ['
        '{"name": "0", "containerEdits": {"env": ["X=1"]}},'
        '{"name": "1", "containerEdits": {"env": ["X=1"]}}]}'
    )
    (run / "other.json").write_text(
        '{"cdiVersion": "0.5.0", "kind": "vendor.com/x", "devices": []}'
    )
    detector = NvidiaCdiDetector(names.NVIDIA_CTK_CDI_KIND, [tmp_path / "absent", run])
    assert detector.device_ids("GPU-aaaa", 1) == ("nvidia.com/gpu=1",)
    assert detector.device_ids("GPU-bbbb", 5) == ()
    # No toolkit spec at all: only our ID.
    assert (
        NvidiaCdiDetector(names.NVIDIA_CTK_CDI_KIND, [tmp_path / "absent"]).device_ids(
            "GPU-aaaa", 0
        )
        == ()
    )


def test_nvidia_detector_forgets_spec_files_that_are_gone(tmp_path: Path) -> None:
    # The detector scans /var/run/cdi, where every prepared claim's transient spec comes and
    # goes: what it remembers about files must not grow with the claims the node ever had.
    run = tmp_path / "run-cdi"
    run.mkdir()
    (run / "nvidia.json").write_text(
        '{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": ['
        '{"name": "GPU-aaaa", "containerEdits": {"env": ["X=1"]}}]}'
    )
    detector = NvidiaCdiDetector(names.NVIDIA_CTK_CDI_KIND, [run])
    for round_ in range(3):
        transient = [run / f"k8s.gpu.sharegpu.dev-claim_{round_}-{i}.json" for i in range(20)]
        for path in transient:
            path.write_text('{"cdiVersion": "0.5.0", "kind": "k8s.gpu.sharegpu.dev/claim"}')
        assert detector.device_ids("GPU-aaaa", 0) == ("nvidia.com/gpu=GPU-aaaa",)
        for path in transient:
            path.unlink()
    assert detector.device_ids("GPU-aaaa", 0) == ("nvidia.com/gpu=GPU-aaaa",)
    assert set(detector._cache) == {run / "nvidia.json"}


def test_nvidia_detector_never_reads_this_drivers_claim_specs(tmp_path: Path) -> None:
    # Prepares look the toolkit's spec up in /var/run/cdi, beside every claim spec of this
    # driver: those are skipped by name, never stat'ed or read on the prepare path.
    run = tmp_path / "run-cdi"
    run.mkdir()
    (run / "nvidia.json").write_text(
        '{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": ['
        '{"name": "GPU-aaaa", "containerEdits": {"env": ["X=1"]}}]}'
    )
    prefix = f"k8s.{DRIVER}-claim_"
    for i in range(5):
        (run / f"{prefix}{i}.json").write_text("{}")
    detector = NvidiaCdiDetector(names.NVIDIA_CTK_CDI_KIND, [run], skip_prefixes=(prefix,))
    assert detector.device_ids("GPU-aaaa", 0) == ("nvidia.com/gpu=GPU-aaaa",)
    assert set(detector._cache) == {run / "nvidia.json"}


def test_32_concurrent_prepares(node: Node) -> None:
    n = 32
    barrier = threading.Barrier(n)
    claims = FakeClaims(barrier=barrier)
    objs = [
        claim(f"c{i}", [result("gpu", f"gpu-{i % 8}", share={"cores": 3, "memory": GI})])
        for i in range(n)
    ]
    claims.add(*objs)
    state = node.state(claims)
    outs: dict[str, Any] = {}
    errors: list[BaseException] = []

    def run(obj: dict[str, Any]) -> None:
        try:
            outs.update(state.prepare([ref(obj)]))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(o,)) for o in objs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert all(outs[o["metadata"]["uid"]].error == "" for o in objs)
    assert len(node.spec_files()) == n
    for path in node.spec_files():
        assert_valid_cdi(path)
    ckpt = node.checkpoint()
    assert {u for u, c in ckpt["claims"].items() if c["state"] == "PrepareCompleted"} == {
        o["metadata"]["uid"] for o in objs
    }
    share_ids = {d.share_id for o in outs.values() for d in o.devices}
    assert len(share_ids) == n


def test_concurrent_prepares_of_one_exclusive_gpu_hand_it_out_once(node: Node) -> None:
    n = 16
    barrier = threading.Barrier(n)
    claims = FakeClaims(barrier=barrier)
    objs = [claim(f"x{i}", [result("gpu", "gpu-5")]) for i in range(n)]
    claims.add(*objs)
    state = node.state(claims)
    outs: dict[str, Any] = {}
    threads = [
        threading.Thread(target=lambda o=o: outs.update(state.prepare([ref(o)]))) for o in objs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    ok = [u for u, o in outs.items() if o.error == ""]
    assert len(outs) == n
    assert len(ok) == 1
    assert len(node.spec_files()) == 1


def test_a_vanished_spec_file_is_prepared_again(node: Node) -> None:
    claims = FakeClaims()
    c = claim("vanish", [result("gpu", "gpu-4")])
    claims.add(c)
    state = node.state(claims)
    uid = c["metadata"]["uid"]
    first = state.prepare([ref(c)])[uid]
    (path,) = node.spec_files()
    path.unlink()
    gets = claims.gets
    again = state.prepare([ref(c)])[uid]
    assert again == first
    assert claims.gets == gets + 1  # fetched again: the recorded answer was not trusted
    assert path.exists()
    assert_valid_cdi(path)


def test_keyed_locks_exclude_per_key_and_are_dropped_after_use() -> None:
    locks = KeyedLocks()
    inside: dict[str, int] = {"a": 0, "b": 0}
    most: dict[str, int] = {"a": 0, "b": 0}
    guard = threading.Lock()
    barrier = threading.Barrier(8)

    def work(key: str) -> None:
        barrier.wait(timeout=60)
        for _ in range(200):
            with locks.hold(key):
                with guard:
                    inside[key] += 1
                    most[key] = max(most[key], inside[key])
                with guard:
                    inside[key] -= 1

    threads = [threading.Thread(target=work, args=("ab"[i % 2],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert most == {"a": 1, "b": 1}
    assert locks._locks == {}


def test_the_daemon_skips_its_own_claim_specs_when_looking_for_the_toolkit(
    tmp_path: Path,
) -> None:
    from kubernetes import client

    from kubeletplugin.claimservice import ClaimService
    from kubeletplugin.config import parse_config
    from kubeletplugin.main import make_host
    from kubeletplugin.sharing.enforcement import NoEnforcement

    config = parse_config(
        [
            "--device-backend=mock",
            "--node-name=n1",
            f"--cdi-dir={tmp_path / 'cdi'}",
            f"--plugin-data-dir={tmp_path / 'data'}",
            f"--plugin-registry-dir={tmp_path / 'reg'}",
        ],
        {},
    )
    with client.ApiClient() as api:
        host = make_host(config)
        service = ClaimService(
            config, host, node_devices(gpus(), "consumable"), api, NoEnforcement()
        )
    detector = service.state._cdi.nvidia
    assert detector is not None
    assert detector.skip_prefixes == (f"k8s.{config.driver_name}-claim_",)


def test_a_full_disk_fails_the_claim_with_one_log_line_and_no_traceback(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    # The checkpoint cannot be written (ENOSPC): the prepare fails per claim, and the rollback,
    # which cannot write the checkpoint either, is logged without a traceback (an expected
    # condition on a node whose disk is full).
    import errno

    claims = FakeClaims()
    c = claim("full", [result("gpu", "gpu-0")])
    claims.add(c)
    state = node.state(claims)

    def no_space(*_: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    state._checkpoint.write = no_space  # type: ignore[method-assign]
    with caplog.at_level("WARNING"):
        out = state.prepare([ref(c)])[c["metadata"]["uid"]]
    assert "No space left on device" in out.error
    assert c["metadata"]["uid"] not in state.prepared_claims()
    assert node.spec_files() == []
    assert [r.exc_info for r in caplog.records if r.exc_info] == []
    assert any("rolling back" in r.getMessage() for r in caplog.records)
