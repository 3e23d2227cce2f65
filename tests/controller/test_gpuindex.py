"""The tracker's incremental index: after any sequence of events it gives what the pure
reconcile gives over the final inputs, and an event marks dirty only the GPUs it touches."""

from __future__ import annotations

import random
from typing import Any

from controller.gpuindex import GpuIndex
from controller.reconcile import gpu_object, reconcile
from controller.records import claim_record, pod_record, slice_record, taint_rule_record
from sharegpu.kube.informer import object_key
from tests.controller import helpers as h

Obj = dict[str, Any]


class Fed:
    """An index fed the way the tracker's informers feed it, and the inputs it has seen."""

    def __init__(self) -> None:
        self.index = GpuIndex(h.DRIVER)
        self.rules: dict[str, Obj] = {}
        self.slices: dict[str, Obj] = {}
        self.claims: dict[str, Obj] = {}
        self.pods: dict[str, Obj] = {}

    def slice(self, obj: Obj | None, name: str = "") -> None:
        key = object_key(obj) if obj is not None else f"/{name}"
        old = self.slices.pop(key, None)
        if obj is not None:
            self.slices[key] = obj
        self.index.set_slice(
            None if old is None else slice_record(old, h.DRIVER),
            None if obj is None else slice_record(obj, h.DRIVER),
        )

    def rule(self, obj: Obj, deleted: bool = False) -> None:
        key = object_key(obj)
        if deleted:
            self.rules.pop(key, None)
        else:
            self.rules[key] = obj
        self.index.set_rule(key, None if deleted else taint_rule_record(obj))

    def claim(self, obj: Obj, deleted: bool = False) -> None:
        key = object_key(obj)
        if deleted:
            self.claims.pop(key, None)
        else:
            self.claims[key] = obj
        self.index.set_claim(key, None if deleted else claim_record(obj, h.DRIVER))

    def pod(self, obj: Obj, deleted: bool = False) -> None:
        key = object_key(obj)
        if deleted:
            self.pods.pop(key, None)
        else:
            self.pods[key] = obj
        self.index.set_pod(key, None if deleted else pod_record(obj))

    def objects(self) -> dict[str, Obj]:
        out = {}
        for name in self.index.names():
            hw = self.index.hardware(name)
            assert hw is not None
            out[name] = gpu_object(hw, self.index.allocations(name)).manifest()
        return out

    def expected(self) -> dict[str, Obj]:
        objs = reconcile(
            self.slices.values(),
            self.claims.values(),
            self.pods.values(),
            h.DRIVER,
            self.rules.values(),
        )
        return {name: g.manifest() for name, g in objs.items()}


def _random_claim(rng: random.Random, i: int) -> Obj:
    node, dev = f"n{rng.randrange(4)}", f"gpu-{rng.randrange(3)}"
    kind = rng.randrange(4)
    if kind == 0:
        results = [h.result(node, dev)]  # whole device
    elif kind == 1:
        results = []  # pending
    else:
        results = [h.result(node, dev, cores=rng.randint(1, 9), memory=f"{rng.randint(1, 4)}Gi")]
    return h.claim(f"c{i}", results, namespace=f"ns{i % 2}", pods=[(f"p{i}", f"uid-p{i}")])


def _random_rule(rng: random.Random, node: str) -> Obj:
    selector = rng.choice(
        [
            {},
            {"pool": node},
            {"pool": node, "device": f"gpu-{rng.randrange(3)}"},
            {"device": f"gpu-{rng.randrange(3)}"},
            {"driver": "other.example.com"},
            {"driver": h.DRIVER, "pool": node},
        ]
    )
    effect = rng.choice(["NoSchedule", "NoExecute", "None"])
    return h.taint_rule(f"r{rng.randrange(4)}", selector, effect=effect)


def test_any_event_sequence_ends_where_the_pure_reconcile_is() -> None:
    rng = random.Random(11)
    fed = Fed()
    rule_tainted = False
    for step in range(400):
        choice = rng.randrange(12)
        i = rng.randrange(25)
        node = f"n{rng.randrange(4)}"
        if choice == 0:
            unhealthy = "Xid79" if rng.random() < 0.3 else None
            devices = [
                h.whole_device(node, g, unhealthy=unhealthy if g == 1 else None)
                for g in range(rng.randint(1, 3))
            ]
            generation = rng.randint(1, 3)
            fed.slice(h.node_slice(node, generation=generation, devices=devices))
        elif choice == 1:
            fed.slice(None, name=h.node_slice(node)["metadata"]["name"])
        elif choice <= 5:
            fed.claim(_random_claim(rng, i))
        elif choice == 6:
            fed.claim(h.claim(f"c{i}", namespace=f"ns{i % 2}"), deleted=True)
        elif choice <= 8:
            containers: dict[str, str | None] = {"main": None}
            if rng.random() < 0.5:
                containers["aux"] = "gpu"
            pod = h.pod(f"p{i}", f"c{i}", containers, namespace=f"ns{i % 2}", uid=f"uid-p{i}")
            fed.pod(pod)
        elif choice == 9:
            fed.pod(h.pod(f"p{i}", f"c{i}", {}, namespace=f"ns{i % 2}"), deleted=True)
        elif choice == 10:
            fed.rule(_random_rule(rng, node))
        else:
            fed.rule(h.taint_rule(f"r{rng.randrange(4)}", {}), deleted=True)
        if step % 40 == 39:
            assert fed.objects() == fed.expected(), f"after step {step}"
            rule_tainted = rule_tainted or any(
                "deviceTaintRule" in t
                for g in fed.objects().values()
                for t in g["status"].get("taints", [])
            )
    assert fed.objects() == fed.expected()
    assert any(g["status"]["allocations"] for g in fed.objects().values())
    assert rule_tainted, "no checkpoint saw a GPU tainted by a rule"


def _ready() -> Fed:
    fed = Fed()
    for node in ("n1", "n2"):
        fed.slice(h.node_slice(node, 4))
    fed.claim(h.claim("a", [h.result("n1", "gpu-0", cores=10, memory="1Gi")], pods=[("p", "u")]))
    fed.claim(h.claim("b", [h.result("n2", "gpu-3", cores=10, memory="1Gi")]))
    fed.pod(h.pod("p", "a", {"main": None}, uid="u"))
    fed.index.take_dirty()
    return fed


def test_a_claim_event_marks_only_the_gpus_it_leaves_and_enters() -> None:
    fed = _ready()
    fed.claim(h.claim("a", [h.result("n2", "gpu-1", cores=5, memory="1Gi")], pods=[("p", "u")]))
    assert fed.index.take_dirty() == {"n1-gpu-0", "n2-gpu-1"}
    fed.claim(h.claim("a"), deleted=True)
    assert fed.index.take_dirty() == {"n2-gpu-1"}
    assert fed.index.counts()["claims"] == 1


def test_a_pod_event_marks_only_the_gpus_of_its_claims() -> None:
    fed = _ready()
    fed.pod(h.pod("p", "a", {"main": None, "logger": None}, uid="u"))
    assert fed.index.take_dirty() == {"n1-gpu-0"}
    hw = fed.index.hardware("n1-gpu-0")
    assert hw is not None
    (alloc,) = fed.index.allocations("n1-gpu-0")
    assert alloc.pods == (("p", "u", ("logger", "main")),)
    fed.pod(h.pod("unrelated", "nothing", {"main": None}))
    assert fed.index.take_dirty() == set()


def test_a_slice_event_marks_only_its_pools_gpus() -> None:
    fed = _ready()
    devices = [h.whole_device("n1", i, unhealthy="Xid48" if i == 2 else None) for i in range(4)]
    fed.slice(h.node_slice("n1", generation=2, devices=devices))
    assert fed.index.take_dirty() == {f"n1-gpu-{i}" for i in range(4)}
    hw = fed.index.hardware("n1-gpu-2")
    assert hw is not None and hw.unhealthy_reason == "Xid48"
    fed.slice(None, name=h.node_slice("n2")["metadata"]["name"])
    assert fed.index.take_dirty() == {f"n2-gpu-{i}" for i in range(4)}
    assert sorted(fed.index.names()) == [f"n1-gpu-{i}" for i in range(4)]
    assert fed.index.allocations("n2-gpu-3") == []
    # the claim on the vanished GPU comes back with its pool
    fed.slice(h.node_slice("n2", 4))
    assert [a.claim_name for a in fed.index.allocations("n2-gpu-3")] == ["b"]


def test_names_of_one_node() -> None:
    fed = _ready()
    assert sorted(fed.index.names("n2")) == [f"n2-gpu-{i}" for i in range(4)]
    assert list(fed.index.names("n9")) == []


def test_a_rule_event_marks_only_the_gpus_whose_taints_it_changes() -> None:
    fed = _ready()
    rule = h.taint_rule("drain", {"pool": "n1", "device": "gpu-2"}, value="swap")
    fed.rule(rule)
    assert fed.index.take_dirty() == {"n1-gpu-2"}
    hw = fed.index.hardware("n1-gpu-2")
    assert hw is not None
    assert hw.taints == (("gpu-2", "example.com/maintenance", "swap", "NoSchedule", "drain"),)
    fed.rule(rule)  # the same rule again changes nothing
    assert fed.index.take_dirty() == set()
    fed.rule(h.taint_rule("everywhere", {"driver": h.DRIVER}))
    assert fed.index.take_dirty() == {f"{n}-gpu-{i}" for n in ("n1", "n2") for i in range(4)}
    fed.rule(h.taint_rule("other-driver", {"driver": "other.example.com"}))
    assert fed.index.take_dirty() == set()
    # A slice rebuilt keeps the rules' taints.
    fed.slice(h.node_slice("n1", 4, generation=2))
    hw = fed.index.hardware("n1-gpu-2")
    assert hw is not None and [t[4] for t in hw.taints] == ["drain", "everywhere"]
    fed.index.take_dirty()
    fed.rule(rule, deleted=True)
    assert fed.index.take_dirty() == {"n1-gpu-2"}
    assert fed.objects() == fed.expected()
