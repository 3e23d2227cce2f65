"""Hypothesis strategies for allocation cases of shapes ``allocgen`` rarely or never draws.

Pools of up to 64 devices over several slices, with an older generation beside the current
one; one to three counter sets, each in a slice of its own, consumed by partitions; slices with
``perDeviceNodeSelection`` whose devices name their node (``nodeName``, ``allNodes`` or a
node selector); node selectors with every operator (``In``, ``NotIn``, ``Exists``,
``DoesNotExist``, ``Gt``, ``Lt``) on labels and on ``metadata.name``; capacity request policies
of every form (no default, only valid values, a range with or without maximum and step);
binding conditions; and pods of up to 16 requests over their claims, now and then allocated
one claim after another (``sequence``: each sees the results of the ones before). The node and
the held claims are drawn as in ``allocgen``. Cases are compared on every result field (see
``compare``).
"""

from __future__ import annotations

from typing import Any, Final

from hypothesis import strategies as st

from .allocgen import DRIVER, NODE, _classes, _exact

Obj = dict[str, Any]

MAX_DEVICES: Final = 64
MAX_REQUESTS: Final = 16
COUNTER_SETS: Final = ("set-a", "set-b", "set-c")
LABEL_KEYS: Final = ("zone", "rack", "gpu")

#: Request policies of every form, each with its capacity value.
POLICIES: Final = (
    ("80Gi", None),
    ("80Gi", {"validRange": {"min": "1Gi"}}),
    ("80Gi", {"validRange": {"min": "1Gi", "max": "40Gi"}}),
    ("80Gi", {"validRange": {"min": "2Gi", "step": "2Gi"}}),
    ("80Gi", {"default": "10Gi", "validRange": {"min": "4Gi", "max": "80Gi", "step": "4Gi"}}),
    ("80Gi", {"validValues": ["10Gi", "20Gi", "80Gi"]}),
    ("80Gi", {"default": "20Gi", "validValues": ["20Gi", "40Gi"]}),
    ("40Gi", {"default": "1Gi"}),
)


@st.composite
def _requirement(draw: st.DrawFn, field: bool = False) -> Obj:
    if field:
        op = draw(st.sampled_from(("In", "NotIn")))
        return {"key": "metadata.name", "operator": op, "values": [NODE]}
    key = draw(st.sampled_from(LABEL_KEYS))
    op = draw(st.sampled_from(("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")))
    req: Obj = {"key": key, "operator": op}
    if op in ("In", "NotIn"):
        req["values"] = draw(
            st.lists(st.sampled_from(("a", "b", "1", "4")), min_size=1, max_size=2)
        )
    elif op in ("Gt", "Lt"):
        req["values"] = [draw(st.sampled_from(("0", "2", "5")))]
    return req


@st.composite
def node_selectors(draw: st.DrawFn) -> Obj:
    """A node selector of one term (the API server refuses a ResourceSlice's selector of
    more) with label and field requirements."""
    terms = []
    for _ in range(1):
        term: Obj = {}
        exprs = draw(st.lists(_requirement(), max_size=2))
        if exprs:
            term["matchExpressions"] = exprs
        if draw(st.integers(0, 3)) == 0:
            term["matchFields"] = [draw(_requirement(field=True))]
        if not term:
            term["matchExpressions"] = [draw(_requirement())]
        terms.append(term)
    return {"nodeSelectorTerms": terms}


@st.composite
def _where(draw: st.DrawFn) -> Obj:
    kind = draw(st.integers(0, 5))
    if kind <= 2:
        return {"nodeName": NODE}
    if kind == 3:
        return {"allNodes": True}
    if kind == 4:
        return {"nodeSelector": draw(node_selectors())}
    return {"nodeName": "node-2"}


@st.composite
def _device(draw: st.DrawFn, index: int, per_device: bool, sets: list[str]) -> Obj:
    value, policy = draw(st.sampled_from(POLICIES))
    device: Obj = {
        "name": f"dev-{index}",
        "attributes": {
            "index": {"int": index},
            "model": {"string": draw(st.sampled_from(("A100", "H100")))},
        },
        "capacity": {"memory": {"value": value, **({"requestPolicy": policy} if policy else {})}},
    }
    if draw(st.integers(0, 2)) == 0:
        device["allowMultipleAllocations"] = True
    if sets and draw(st.integers(0, 2)) > 0:
        used = draw(st.lists(st.sampled_from(sets), min_size=1, max_size=len(sets), unique=True))
        device["consumesCounters"] = [
            {
                "counterSet": s,
                "counters": {"slots": {"value": draw(st.sampled_from(("1", "2", "3")))}},
            }
            for s in used
        ]
    if per_device:
        device.update(draw(_where()))
    if draw(st.integers(0, 7)) == 0:
        device["bindingConditions"] = ["example.com/ready"]
        device["bindingFailureConditions"] = ["example.com/failed"]
        if draw(st.booleans()):
            device["bindsToNode"] = True
    if draw(st.integers(0, 9)) == 0:
        effect = draw(st.sampled_from(("NoSchedule", "NoExecute")))
        device["taints"] = [{"key": "example.com/unhealthy", "value": "true", "effect": effect}]
    return device


def _held(pool: str, device: Obj, shared: bool, n: int) -> Obj:
    """A held result on ``device``: a share consuming the policy's default (else the whole
    capacity) when ``shared`` and the device allows it, else the whole device."""
    result: Obj = {"request": "held", "driver": DRIVER, "pool": pool, "device": device["name"]}
    if shared and device.get("allowMultipleAllocations"):
        result["shareID"] = f"00000000-0000-4000-8000-{n:012d}"
        result["consumedCapacity"] = {
            name: (cap.get("requestPolicy") or {}).get("default", cap["value"])
            for name, cap in (device.get("capacity") or {}).items()
        }
    return result


def _slice(name: str, pool: str, generation: int, count: int, spec: Obj) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            **spec,
        },
    }


@st.composite
def _pool(draw: st.DrawFn, index: int) -> tuple[list[Obj], list[Obj]]:
    """The slices of one pool and its current devices."""
    name = f"pool-{index}"
    per_device = draw(st.integers(0, 3)) == 0
    where = {"perDeviceNodeSelection": True} if per_device else draw(_where())
    sets = list(COUNTER_SETS[: draw(st.integers(0, 3))])
    n = (
        draw(st.integers(1, MAX_DEVICES))
        if draw(st.integers(0, 4)) == 0
        else draw(st.integers(1, 8))
    )
    devices = [draw(_device(i, per_device, sets)) for i in range(n)]
    parts = draw(st.integers(1, min(4, n)))
    size = -(-n // parts)
    chunks = [devices[k : k + size] for k in range(0, n, size)]
    generation = draw(st.integers(1, 3))
    count = len(chunks) + len(sets)
    slices = [
        _slice(f"{name}-{k}", name, generation, count, {**where, "devices": chunk})
        for k, chunk in enumerate(chunks)
    ]
    for s in sets:
        counters = {"slots": {"value": draw(st.sampled_from(("2", "4", "8")))}}
        shared = {"sharedCounters": [{"name": s, "counters": counters}]}
        spec = {**(where if not per_device else {"nodeName": NODE}), **shared}
        slices.append(_slice(f"{name}-{s}", name, generation, count, spec))
    if generation > 1 and draw(st.integers(0, 3)) == 0:
        old = [draw(_device(i + 100, per_device, [])) for i in range(draw(st.integers(1, 3)))]
        slices.append(_slice(f"{name}-old", name, generation - 1, 1, {**where, "devices": old}))
    order = draw(st.permutations(range(len(slices))))
    return [slices[i] for i in order], devices


@st.composite
def _claims(draw: st.DrawFn) -> list[Obj]:
    total = (
        draw(st.integers(1, MAX_REQUESTS))
        if draw(st.integers(0, 3)) == 0
        else draw(st.integers(1, 3))
    )
    n_claims = draw(st.integers(1, min(3, total)))
    claims = []
    for c in range(n_claims):
        count = total // n_claims + (1 if c < total % n_claims else 0)
        requests = []
        for r in range(max(count, 1)):
            exact = draw(_exact())
            if draw(st.integers(0, 2)) == 0:
                exact["capacity"] = {
                    "requests": {"memory": draw(st.sampled_from(("1Gi", "3Gi", "10Gi", "30Gi")))}
                }
            requests.append({"name": f"req-{r}", "exactly": exact})
        claims.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"claim-{c}", "namespace": "default", "uid": f"uid-{c}"},
                "spec": {"devices": {"requests": requests}},
            }
        )
    return claims


@st.composite
def wide_allocation_cases(draw: st.DrawFn) -> Obj:
    """One wide allocation case for the oracle (without its id)."""
    slices: list[Obj] = []
    pools: list[tuple[str, list[Obj]]] = []
    for index in range(draw(st.integers(1, 2))):
        pool_slices, devices = draw(_pool(index))
        slices.extend(pool_slices)
        pools.append((f"pool-{index}", devices))
    allocated = []
    for a in range(draw(st.integers(0, 2))):
        pool, devices = draw(st.sampled_from(pools))
        chosen = draw(
            st.lists(
                st.sampled_from(devices), min_size=1, max_size=3, unique_by=lambda d: d["name"]
            )
        )
        held = [_held(pool, d, draw(st.booleans()), 10 * a + i) for i, d in enumerate(chosen)]
        allocated.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"held-{a}", "namespace": "default", "uid": f"uid-held-{a}"},
                "spec": {"devices": {"requests": []}},
                "status": {"allocation": {"devices": {"results": held}}},
            }
        )
    labels = {
        k: draw(st.sampled_from(("a", "b", "1", "4")))
        for k in LABEL_KEYS
        if draw(st.integers(0, 2)) > 0
    }
    claims = draw(_claims())
    return {
        "kind": "allocate",
        "node": {"metadata": {"name": NODE, "labels": labels}},
        "slices": slices,
        "classes": draw(_classes()),
        "allocatedClaims": allocated,
        "claims": claims,
        # now and then the claims one after another (each its own pod), not jointly
        "sequence": len(claims) > 1 and draw(st.integers(0, 2)) == 0,
    }
