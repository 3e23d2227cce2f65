"""Hypothesis strategies for allocation cases, shaped like what a DRA driver meets on a node.

A case is one node, the ResourceSlices of a few pools (devices with attributes and capacities,
shareable devices with request policies including fractional steps, partitions consuming
shared counters, taints; slices on the node, on every node, chosen by a node selector or on
another node; an older generation next to the current one; now and then an incomplete pool),
device classes with selectors and configs, claims already allocated there (whole devices and
shares), and the claims of one pod: ``exactly`` or ``firstAvailable`` requests, counts or
``All``, capacity requests, tolerations, ``matchAttribute``/``distinctAttribute`` constraints
and configs. Objects come as the API server stores them (defaults filled in).
"""

from __future__ import annotations

from typing import Any, Final

from hypothesis import strategies as st

from .celgen import DRIVER, K8S, bool_term, device_attributes, selectors

NODE: Final = "node-1"
NIC_DRIVER: Final = "nic.example.com"
TAINT_KEY: Final = "example.com/unhealthy"
COUNTER_SET: Final = "gpu-0-counters"

#: (capacity value, request policy or None) of a device's memory.
MEMORY: Final = (
    ("80Gi", None),
    ("80Gi", {"default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}),
    ("40Gi", {"default": "8Gi", "validRange": {"min": "4Gi", "max": "40Gi", "step": "4Gi"}}),
    ("80Gi", {"default": "10Gi", "validValues": ["10Gi", "20Gi", "40Gi", "80Gi"]}),
    ("16Gi", {"default": "1Gi", "validRange": {"min": "1Gi"}}),
)
#: The same for compute ("cores"), with fractional steps.
CORES: Final = (
    ("1", {"default": "1", "validRange": {"min": "100m", "step": "100m"}}),
    ("2", {"default": "500m", "validRange": {"min": "250m", "max": "1", "step": "250m"}}),
    ("100", {"default": "100", "validRange": {"min": "1", "step": "1"}}),
    # A GPU bounded to 20 shares: requests below 5 cores are charged 5.
    ("100", {"default": "100", "validRange": {"min": "5", "max": "100", "step": "1"}}),
    ("1500m", {"default": "500m", "validRange": {"min": "500m", "step": "500m"}}),
    ("4", None),
)
MEMORY_REQUESTS: Final = ("1Gi", "3Gi", "10Gi", "15Gi", "40Gi", "100Gi", "500Mi")
CORES_REQUESTS: Final = ("150m", "1", "250m", "3", "100m", "50")

Obj = dict[str, Any]


def _capacity(value: str, policy: Obj | None) -> Obj:
    return {"value": value} if policy is None else {"value": value, "requestPolicy": policy}


@st.composite
def _device(draw: st.DrawFn, index: int, driver: str, counters: bool) -> Obj:
    attrs = draw(device_attributes(absent_one_in=40))
    attrs["index"] = {"int": index}
    device: Obj = {"name": f"dev-{index}", "attributes": attrs}
    shared = draw(st.integers(0, 2)) == 0
    memory, memory_policy = draw(st.sampled_from(MEMORY))
    cores, cores_policy = draw(st.sampled_from(CORES))
    device["capacity"] = {
        "memory": _capacity(memory, memory_policy if shared else None),
        **(
            {"cores": _capacity(cores, cores_policy if shared else None)}
            if draw(st.booleans())
            else {}
        ),
    }
    if driver == NIC_DRIVER:
        device["attributes"] = {"index": {"int": index}}
        device["capacity"] = {}
    if shared:
        device["allowMultipleAllocations"] = True
    if counters and draw(st.integers(0, 2)) > 0:
        device["consumesCounters"] = [
            {
                "counterSet": COUNTER_SET,
                "counters": {
                    "memory": {"value": draw(st.sampled_from(("10Gi", "20Gi", "40Gi")))},
                    "slots": {"value": draw(st.sampled_from(("1", "2", "4")))},
                },
            }
        ]
    if draw(st.integers(0, 9)) == 0:
        device["taints"] = [
            {
                "key": TAINT_KEY,
                "value": "true",
                "effect": draw(st.sampled_from(("NoSchedule", "NoExecute"))),
            }
        ]
    return device


def _slice(name: str, driver: str, pool: str, generation: int, count: int, where: Obj) -> Obj:
    spec: Obj = {
        "driver": driver,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
        **where,
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": spec,
    }


@st.composite
def _pool(draw: st.DrawFn, index: int) -> tuple[str, list[Obj], list[Obj]]:
    """The driver of one pool, its slices and its devices (of the current generation)."""
    driver = NIC_DRIVER if index > 0 and draw(st.integers(0, 4)) == 0 else DRIVER
    name = f"pool-{index}"
    where = draw(
        st.sampled_from(
            (
                {"nodeName": NODE},
                {"nodeName": NODE},
                {"nodeName": NODE},
                {"allNodes": True},
                {
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            }
                        ]
                    }
                },
                {"nodeName": "node-2"},
            )
        )
    )
    counters = driver == DRIVER and draw(st.integers(0, 3)) == 0
    generation = draw(st.integers(1, 3))
    n_devices = draw(st.integers(1, 4))
    devices = [draw(_device(i, driver, counters)) for i in range(n_devices)]
    split = n_devices > 1 and draw(st.integers(0, 3)) == 0
    parts = [devices[:1], devices[1:]] if split else [devices]
    slices = []
    count = len(parts) + (1 if counters else 0)
    for k, part in enumerate(parts):
        slices.append(
            _slice(f"{name}-{k}", driver, name, generation, count, {**where, "devices": part})
        )
    if counters:
        shared = {
            "sharedCounters": [
                {
                    "name": COUNTER_SET,
                    "counters": {"memory": {"value": "40Gi"}, "slots": {"value": "4"}},
                }
            ]
        }
        slices.append(
            _slice(f"{name}-counters", driver, name, generation, count, {**where, **shared})
        )
    if draw(st.integers(0, 9)) == 0:
        slices.pop(draw(st.integers(0, len(slices) - 1)))  # an incomplete pool
    if generation > 1 and draw(st.integers(0, 4)) == 0:
        old = [draw(_device(i + 10, driver, False)) for i in range(draw(st.integers(1, 2)))]
        slices.append(
            _slice(f"{name}-old", driver, name, generation - 1, 1, {**where, "devices": old})
        )
    order = draw(st.permutations(range(len(slices))))
    return driver, [slices[i] for i in order], devices


def _selector_list(draw: st.DrawFn) -> list[Obj]:
    out = []
    for _ in range(1 if draw(st.integers(0, 2)) == 0 else 0):
        if draw(st.integers(0, 15)) == 0:
            expression = draw(selectors(depth=1))
        else:
            expression = draw(bool_term(1))
        out.append({"cel": {"expression": expression}})
    return out


def _opaque(requests: list[str] | None, setting: str) -> Obj:
    config: Obj = {"opaque": {"driver": DRIVER, "parameters": {"sharing": setting}}}
    if requests:
        config["requests"] = requests
    return config


@st.composite
def _classes(draw: st.DrawFn) -> list[Obj]:
    gpu_selectors = [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}, *_selector_list(draw)]
    gpu: Obj = {"selectors": gpu_selectors}
    if draw(st.booleans()):
        gpu["config"] = [_opaque(None, "class")]
    shared: Obj = {"selectors": [{"cel": {"expression": "device.allowMultipleAllocations"}}]}
    nic: Obj = {"selectors": [{"cel": {"expression": f"device.driver == '{NIC_DRIVER}'"}}]}
    specs = {"gpu": gpu, "gpu-shared": shared, "nic": nic, "any": {}}
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": n},
            "spec": s,
        }
        for n, s in specs.items()
    ]


@st.composite
def _exact(draw: st.DrawFn) -> Obj:
    request: Obj = {
        "deviceClassName": draw(
            st.sampled_from((*["gpu"] * 16, *["gpu-shared"] * 4, "nic", "any", "missing"))
        )
    }
    if draw(st.integers(0, 7)) == 0:
        request["allocationMode"] = "All"
    else:
        request["allocationMode"] = "ExactCount"
        request["count"] = draw(st.sampled_from((1, 1, 1, 2, 3)))
    chosen = _selector_list(draw)
    if chosen:
        request["selectors"] = chosen
    if draw(st.integers(0, 2)) == 0:
        wanted: Obj = {}
        if draw(st.booleans()):
            wanted["memory"] = draw(st.sampled_from(MEMORY_REQUESTS))
        if draw(st.booleans()):
            wanted["cores"] = draw(st.sampled_from(CORES_REQUESTS))
        if wanted:
            request["capacity"] = {"requests": wanted}
    if draw(st.integers(0, 5)) == 0:
        request["tolerations"] = [
            {
                "key": TAINT_KEY,
                "operator": "Exists",
                **(
                    {"effect": draw(st.sampled_from(("NoSchedule", "NoExecute")))}
                    if draw(st.booleans())
                    else {}
                ),
            }
        ]
    if draw(st.integers(0, 19)) == 0:
        request["adminAccess"] = True
    return request


@st.composite
def _claim(draw: st.DrawFn, index: int) -> Obj:
    names = [f"req-{k}" for k in range(draw(st.integers(1, 3)))]
    requests = []
    for name in names:
        if draw(st.integers(0, 3)) == 0:
            subs = [{"name": f"sub-{j}", **draw(_exact())} for j in range(draw(st.integers(1, 3)))]
            for sub in subs:
                sub.pop("adminAccess", None)
            requests.append({"name": name, "firstAvailable": subs})
        else:
            requests.append({"name": name, "exactly": draw(_exact())})
    devices: Obj = {"requests": requests}
    if draw(st.integers(0, 2)) == 0:
        attribute = draw(
            st.sampled_from(
                (
                    ("matchAttribute", f"{DRIVER}/model"),
                    ("matchAttribute", f"{K8S}/pcieRoot"),
                    ("distinctAttribute", f"{DRIVER}/index"),
                    ("distinctAttribute", f"{DRIVER}/uuid"),
                    ("matchAttribute", f"{DRIVER}/driverVersion"),
                )
            )
        )
        constraint: Obj = {attribute[0]: attribute[1]}
        if len(names) > 1 and draw(st.booleans()):
            constraint["requests"] = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
        devices["constraints"] = [constraint]
    if draw(st.integers(0, 3)) == 0:
        subset = draw(st.lists(st.sampled_from(names), max_size=len(names), unique=True))
        devices["config"] = [_opaque(subset or None, "claim")]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"claim-{index}", "namespace": "default", "uid": f"uid-claim-{index}"},
        "spec": {"devices": devices},
    }


def _held(pool: str, device: Obj, shared: bool, n: int) -> Obj:
    result: Obj = {"request": "held", "driver": DRIVER, "pool": pool, "device": device["name"]}
    if shared and device.get("allowMultipleAllocations"):
        result["shareID"] = f"00000000-0000-4000-8000-{n:012d}"
        consumed = {}
        for name, cap in (device.get("capacity") or {}).items():
            policy = cap.get("requestPolicy")
            consumed[name] = policy["default"] if policy else cap["value"]
        result["consumedCapacity"] = consumed
    return result


@st.composite
def allocation_cases(draw: st.DrawFn) -> Obj:
    """One allocation case for the oracle (without its id)."""
    slices: list[Obj] = []
    pool_devices: list[tuple[str, str, list[Obj]]] = []
    for index in range(draw(st.integers(1, 3))):
        driver, pool_slices, devices = draw(_pool(index))
        slices.extend(pool_slices)
        pool_devices.append((f"pool-{index}", driver, devices))
    allocated = []
    n = 0
    for a in range(draw(st.integers(0, 2))):
        pool, driver, devices = draw(st.sampled_from(pool_devices))
        if driver != DRIVER:
            continue
        held = []
        for device in draw(
            st.lists(
                st.sampled_from(devices), min_size=1, max_size=2, unique_by=lambda d: d["name"]
            )
        ):
            n += 1
            held.append(_held(pool, device, draw(st.integers(0, 3)) > 0, n))
        allocated.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"held-{a}", "namespace": "default", "uid": f"uid-held-{a}"},
                "spec": {"devices": {"requests": []}},
                "status": {"allocation": {"devices": {"results": held}}},
            }
        )
    labels = {"zone": draw(st.sampled_from(("a", "b")))}
    return {
        "kind": "allocate",
        "node": {"metadata": {"name": NODE, "labels": labels}},
        "slices": slices,
        "classes": draw(_classes()),
        "allocatedClaims": allocated,
        "claims": [draw(_claim(i)) for i in range(draw(st.sampled_from((1, 1, 1, 2))))],
    }
