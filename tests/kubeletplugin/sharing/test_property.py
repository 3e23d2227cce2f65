"""Property: for random sequences of share prepares and unprepares, the enforcer accepts exactly
what fits (capacity and compatible strategies), the per-GPU sum never exceeds the GPU, a GPU's
MPS daemon and compute mode follow its MPS shares, and everything is restored at the end."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from api import names
from api.gpuconfig import DriverConfigs, decode_driver_configs
from kubeletplugin.devicerecord import DeviceRecord
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.model import GpuInfo
from kubeletplugin.sharing.enforcement import ShareError
from kubeletplugin.sharing.enforcer import takes_whole_gpu
from kubeletplugin.sharing.strategies.mps import MpsNode
from tests.kubeletplugin.sharing.helpers import GI, LIBRARY, Tools, decided, record

GPUS: list[GpuInfo] = MockBackend("prop-node", 2).discover()
COMPATIBLE = {
    "MPS": {"MPS"},
    "TimeSlicing": {"TimeSlicing", "Limits"},
    "Limits": {"TimeSlicing", "Limits"},
    "Exclusive": set(),
}


@dataclass(frozen=True)
class Prepare:
    claim: int
    gpu: int
    cores: int
    memory_gi: int
    strategy: str | None  # None: the default (MPS for a share, Exclusive for a whole GPU)
    interval: str


@dataclass(frozen=True)
class Unprepare:
    claim: int


@dataclass(frozen=True)
class Restart:
    """The plugin restarts: a new enforcer restores from the exported state and records."""


prepares = st.builds(
    Prepare,
    claim=st.integers(0, 7),
    gpu=st.integers(0, len(GPUS) - 1),
    cores=st.integers(1, 100),
    memory_gi=st.integers(1, 80),
    strategy=st.sampled_from([None, None, "MPS", "TimeSlicing", "Limits", "Exclusive"]),
    interval=st.sampled_from(["Default", "Long"]),
)
operations = st.lists(
    st.one_of(
        prepares, prepares, st.builds(Unprepare, claim=st.integers(0, 7)), st.builds(Restart)
    ),
    min_size=5,
    max_size=40,
)


def share_of(op: Prepare, whole: bool) -> DeviceRecord:
    """A consumable share, or (``whole``) a whole-GPU allocation."""
    gpu = GPUS[op.gpu]
    memory = min(op.memory_gi * GI, gpu.memory_usable)
    if whole:
        return record(gpu, names.device_name(gpu.index), ("gpu",), 100, gpu.memory_usable)
    return record(
        gpu,
        names.device_name(gpu.index),
        ("gpu",),
        op.cores,
        memory,
        share_id=f"00000000-0000-0000-0000-{op.claim:012d}",
    )


def configs_of(op: Prepare) -> DriverConfigs:
    if op.strategy is None:
        return DriverConfigs()
    sharing: dict[str, object] = {"strategy": op.strategy}
    if op.strategy == "TimeSlicing":
        sharing["timeSlicing"] = {"interval": op.interval}
    params = {"apiVersion": names.GROUP_VERSION, "kind": "GpuConfig", "sharing": sharing}
    entry = {
        "source": "FromClaim",
        "opaque": {"driver": names.DEFAULT_DRIVER_NAME, "parameters": params},
    }
    return decode_driver_configs([entry], names.DEFAULT_DRIVER_NAME)


@dataclass(frozen=True)
class Held:
    gpu: str
    strategy: str
    interval: str | None
    cores: int
    memory: int


def fits(model: dict[int, Held], claim: int, new: Held, usable: int) -> bool:
    others = [h for c, h in model.items() if c != claim and h.gpu == new.gpu]
    for other in others:
        if other.strategy not in COMPATIBLE[new.strategy]:
            return False
        if new.strategy == other.strategy == "TimeSlicing" and new.interval != other.interval:
            return False
    cores = sum(h.cores for h in others) + new.cores
    memory = sum(h.memory for h in others) + new.memory
    return cores <= 100 and memory <= usable


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    ops=operations,
    whole=st.lists(st.sampled_from([False, False, False, True]), min_size=8, max_size=8),
)
# A share as large as the GPU is enforced as the whole GPU (Exclusive, no MPS daemon).
@example(
    ops=[Prepare(claim=0, gpu=0, cores=100, memory_gi=79, strategy=None, interval="Default")],
    whole=[False] * 8,
)
def test_random_prepares_and_unprepares_keep_every_invariant(
    ops: list[Prepare | Unprepare | Restart], whole: list[bool]
) -> None:
    tools = Tools.new()
    with tempfile.TemporaryDirectory() as tmp:
        enforcer = tools.enforcer(Path(tmp), limits_library=LIBRARY)
        model: dict[int, Held] = {}
        prepared: dict[str, list[DeviceRecord]] = {}
        for op in ops:
            if isinstance(op, Restart):
                state = enforcer.export_state()
                enforcer = tools.enforcer(Path(tmp), limits_library=LIBRARY)
                enforcer.restore(state, prepared, node_gpus=[g.uuid for g in GPUS])
            elif isinstance(op, Unprepare):
                uid = f"claim-{op.claim}"
                enforcer.release(uid)
                model.pop(op.claim, None)
                prepared.pop(uid, None)
            else:
                uid = f"claim-{op.claim}"
                share = share_of(op, whole[op.claim])
                shared = share.is_share and not takes_whole_gpu(share)
                strategy = op.strategy or ("MPS" if shared else "Exclusive")
                new = Held(
                    share.gpu.uuid,
                    strategy,
                    op.interval if strategy == "TimeSlicing" else None,
                    share.cores,
                    share.memory,
                )
                # A repeated prepare of a held claim replaces it (the enforcer releases first).
                model.pop(op.claim, None)
                prepared.pop(uid, None)
                expected = fits(model, op.claim, new, share.gpu.memory_usable)
                try:
                    done = enforcer.apply(uid, [share], configs_of(op))
                    prepared[uid] = decided([share], done)
                    accepted = True
                except ShareError:
                    accepted = False
                assert accepted == expected, (op, model)
                event(f"{strategy} {'accepted' if accepted else 'refused'}")
                if accepted:
                    model[op.claim] = new
            check_invariants(enforcer, tools, model)
        for claim in range(8):
            enforcer.release(f"claim-{claim}")
        assert tools.sim.daemons == {}
        assert all(tools.sim.mode(g.uuid) == "DEFAULT" for g in GPUS)
        assert all(v == 0 for v in tools.sim.timeslices.values())
        assert enforcer.export_state() == {"version": 2, "mps": {}, "timeSlicing": {}}


def check_invariants(enforcer: object, tools: Tools, model: dict[int, Held]) -> None:
    from kubeletplugin.sharing.enforcer import SharingEnforcer

    assert isinstance(enforcer, SharingEnforcer)
    usage = enforcer.usage()
    for gpu in GPUS:
        cores, memory = usage.get(gpu.uuid, (0, 0))
        assert cores <= 100 and memory <= gpu.memory_usable
        mps_held = sum(h.gpu == gpu.uuid and h.strategy == "MPS" for h in model.values())
        # One daemon per claim holding an MPS share of the GPU; the mode is never changed.
        assert list(tools.sim.daemons.values()).count(gpu.uuid) == mps_held
        assert tools.sim.mode(gpu.uuid) == "DEFAULT"
        intervals = {h.interval for h in model.values() if h.gpu == gpu.uuid and h.interval}
        expected_slice = {"Default": 0, "Long": 3}[intervals.pop()] if intervals else 0
        assert tools.sim.timeslices.get(gpu.uuid, 0) == expected_slice
    assert sum(c for c, _ in usage.values()) == sum(h.cores for h in model.values())


def test_concurrent_prepares_start_one_daemon_per_claim_and_never_overbook() -> None:
    import threading

    tools = Tools.new()
    with tempfile.TemporaryDirectory() as tmp:
        enforcer = tools.enforcer(Path(tmp))
        accepted: list[str] = []
        lock = threading.Lock()
        barrier = threading.Barrier(32)

        def worker(i: int) -> None:
            gpu = GPUS[i % len(GPUS)]
            share = record(
                gpu,
                names.device_name(gpu.index),
                ("gpu",),
                7,
                GI,
                share_id=f"00000000-0000-0000-0000-{i:012d}",
            )
            barrier.wait(timeout=30)
            try:
                enforcer.apply(f"claim-{i}", [share], DriverConfigs())
            except ShareError:
                return
            with lock:
                accepted.append(f"claim-{i}")

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        # 16 claims of 7 cores per GPU: 14 fit (98 cores), 2 are refused on each GPU.
        assert len(accepted) == 28
        assert tools.sim.daemons_started == len(accepted) == len(tools.sim.daemons)
        assert all(cores == 98 for cores, _ in enforcer.usage().values())
        for uid in accepted:
            enforcer.release(uid)
        assert tools.sim.daemons == {}


def test_a_release_never_stops_the_daemon_of_a_claim_whose_apply_is_in_flight() -> None:
    """Claim B's apply has started its daemon on GPU 0 and is starting the one on GPU 1 (its
    devices are not recorded yet) when claim A is released: A's release sees B's first daemon as
    no prepared claim's, but must leave it running once B's apply is done."""
    import threading

    from kubeletplugin.sharing.daemons import DaemonSpec

    tools = Tools.new()
    gpu0, gpu1 = GPUS
    with tempfile.TemporaryDirectory() as tmp:
        enforcer = tools.enforcer(Path(tmp))
        a = record(gpu0, "gpu-0", ("gpu",), 10, GI, share_id="a")
        enforcer.apply("claim-a", [a], DriverConfigs())
        launching, proceed, snapshot = threading.Event(), threading.Event(), threading.Event()
        launch = tools.pods.launch

        def slow_launch(spec: DaemonSpec) -> None:
            if spec.uuid == gpu1.uuid:
                launching.set()
                assert proceed.wait(timeout=30)
            launch(spec)

        running = enforcer.node_of(MpsNode).manager.running

        def observed_running() -> Any:
            found = running()
            if threading.current_thread().name == "release-a":
                snapshot.set()
            return found

        tools.pods.launch = slow_launch  # type: ignore[method-assign]
        enforcer.node_of(MpsNode).manager.running = observed_running  # type: ignore[method-assign]
        b = [
            record(gpu0, "gpu-0", ("first",), 10, GI, share_id="b0"),
            record(gpu1, "gpu-1", ("second",), 10, GI, share_id="b1"),
        ]
        applying = threading.Thread(target=enforcer.apply, args=("claim-b", b, DriverConfigs()))
        applying.start()
        assert launching.wait(timeout=30)
        releasing = threading.Thread(target=enforcer.release, args=("claim-a",), name="release-a")
        releasing.start()
        assert snapshot.wait(timeout=30)
        proceed.set()
        applying.join(timeout=60)
        releasing.join(timeout=60)
        assert sorted(tools.sim.daemons.values()) == sorted([gpu0.uuid, gpu1.uuid])
        assert set(enforcer.held()) == {"claim-b"}
