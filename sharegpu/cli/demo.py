"""``sharegpu demo``: the whole driver on this machine, with no cluster and no GPU.

1. An in-process Kubernetes API server (:mod:`sharegpu.local.apiserver`) and a Node.
2. The real kubelet plugin daemon (:func:`kubeletplugin.main.build_plugin`, started as its
   ``run`` would): mock backend with 8 H100-like GPUs, consumable mode, slice publisher, health
   monitor, and its kubelet service (gRPC sockets, checkpoint, CDI specs), all files in one
   temporary directory. Share enforcement is the plugin's own; with the mock backend it drives
   simulated NVIDIA tools, so no real ``nvidia-smi`` or MPS command runs.
3. The published ResourceSlices, the driver's DeviceClass and the claims of the examples that
   fit consumable mode (templates become claims named like them).
4. Each claim allocated in turn with :mod:`sharegpu.allocator` as kube-scheduler would, its
   ``status.allocation`` written to the API server.
5. Each claim prepared through the plugin's real DRA socket by a kubelet-side client
   (:mod:`sharegpu.local.kubelet`, registration handshake first); the enforced limits are read
   back from the CDI spec the plugin wrote.
6. Per-GPU usage from the controller's pure reconcile (:func:`controller.reconcile.reconcile`).
7. Everything unprepared, the plugin and the API server stopped, the temporary directory removed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from api import names
from api.quantity import format_bytes_human, format_quantity, quantity_int
from controller.reconcile import reconcile
from kubeletplugin.config import ConfigError, parse_config
from kubeletplugin.devices.backend import DiscoveryError
from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.kubelet.registration import registration_socket_path
from kubeletplugin.main import Plugin, build_plugin
from kubeletplugin.prepare.cdi import spec_file_name
from sharegpu.allocator import Allocator, seeded_share_ids
from sharegpu.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    CliError,
    Obj,
    add_output_flag,
    compact_names,
    default_device_class,
    slice_summary,
)
from sharegpu.cli.explain import allocation_rows, claim_from_template, consumed_text, describe
from sharegpu.cli.loading import Manifest, load_manifests
from sharegpu.cli.output import Table, emit, resolve_format
from sharegpu.kube.rest import KubeApiError, KubeConfigError, KubeRest
from sharegpu.local.apiserver import KubeAPIServer
from sharegpu.local.kubelet import KubeletSim, RegisteredPlugin

HELP = "run the whole driver locally: mock GPUs, the real plugin, allocation, prepare"
NODE_NAME: Final = "demo-node"
NAMESPACE: Final = "default"
MOCK_GPUS: Final = 8
#: Example directories whose claims fit consumable mode, in the order they are allocated.
DEMO_EXAMPLES: Final = (
    "whole-gpu",
    "two-pods-fractional-share",
    "mps-with-overrides",
    "select-by-model-and-memory",
    "multi-gpu-same-pcie-root",
    "first-available",
)
#: Environment variables of a CDI device that state its enforced share.
LIMIT_PREFIXES: Final = ("CUDA_MPS_", "SHAREGPU_", "NVIDIA_VISIBLE_DEVICES")
#: The limits the human-readable report shows (JSON has every share variable).
SHOWN_LIMITS: Final = (
    "SHAREGPU_CORES",
    "SHAREGPU_MEMORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
)
SLICE_WAIT_S: Final = 10.0
SHARE_ID_SEED: Final = 2026
RESOURCE_API: Final = f"/apis/{names.RESOURCE_GROUP_VERSION}"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help=HELP,
        description="Run the whole driver on this machine without a cluster: an in-process API "
        "server, the real kubelet plugin on 8 mock H100 GPUs (consumable mode), the examples' "
        "claims allocated as kube-scheduler would and prepared through the plugin's gRPC socket "
        "as kubelet would; prints slices, allocations, CDI IDs, enforced limits and GPU usage, "
        "then cleans everything up.",
    )
    p.add_argument(
        "--examples",
        metavar="DIR",
        help="examples directory (default: $SHAREGPU_EXAMPLES, else examples/ of the source tree, "
        "else /usr/share/sharegpu/examples in the container image)",
    )
    add_output_flag(p)
    p.set_defaults(run=run)


#: Where the container image installs the examples.
IMAGE_EXAMPLES_DIR = Path("/usr/share/sharegpu/examples")
#: Environment variable naming the examples directory; it wins over the defaults.
EXAMPLES_ENV = "SHAREGPU_EXAMPLES"


def default_examples_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The examples directory: ``$SHAREGPU_EXAMPLES`` if set, else ``examples/`` of the source
    tree when the package runs from one, else the copy installed in the container image."""
    env = os.environ if environ is None else environ
    if env.get(EXAMPLES_ENV):
        return Path(env[EXAMPLES_ENV])
    source_tree = Path(__file__).resolve().parents[2] / "examples"
    return source_tree if source_tree.is_dir() else IMAGE_EXAMPLES_DIR


def demo_claims(examples: Path) -> list[tuple[str, Obj]]:
    """``(source file, claim)`` for every ResourceClaim(Template) of :data:`DEMO_EXAMPLES`."""
    if not examples.is_dir():
        raise CliError(f"examples directory {examples} not found (use --examples DIR)")
    out: list[tuple[str, Obj]] = []
    for name in DEMO_EXAMPLES:
        directory = examples / name
        if not directory.is_dir():
            raise CliError(f"example {directory} not found")
        for m in load_manifests([str(directory)]):
            claim = _as_claim(m)
            if claim is not None:
                out.append((m.file, claim))
    return out


def _as_claim(m: Manifest) -> Obj | None:
    if m.kind == "ResourceClaimTemplate":
        claim = claim_from_template(m.obj)
    elif m.kind == "ResourceClaim":
        claim = {k: v for k, v in m.obj.items() if k != "status"}
    else:
        return None
    claim["metadata"] = {"name": claim["metadata"]["name"], "namespace": NAMESPACE}
    return claim


# --- the running node -----------------------------------------------------------------------


@dataclass
class Node:
    """The running pieces: API access, the plugin, and the kubelet side."""

    root: Path
    rest: KubeRest
    plugin: Plugin
    cdi_dir: Path
    kubelet: RegisteredPlugin


@contextmanager
def running_node(root: Path) -> Iterator[Node]:
    """API server, Node, plugin and registered kubelet client, all stopped on exit."""
    registry, data, cdi = root / "registry", root / "plugin", root / "cdi"
    with ExitStack() as stack:
        server = stack.enter_context(KubeAPIServer())
        kubeconfig = server.write_kubeconfig(root / "kubeconfig")
        server.store.create(
            "nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE_NAME}}
        )
        flags = [
            *("--node-name", NODE_NAME, "--kubeconfig", kubeconfig),
            *("--device-backend", "mock", "--mock-gpus", str(MOCK_GPUS)),
            *("--sharing-mode", names.SHARING_MODE_CONSUMABLE),
            *("--plugin-registry-dir", str(registry), "--plugin-data-dir", str(data)),
            *("--cdi-dir", str(cdi), "--nvidia-cdi-dirs", str(cdi)),
        ]
        # The mock health checker makes SIGUSR1 re-read its file; give the handler back after.
        previous_usr1 = signal.getsignal(signal.SIGUSR1)
        stack.callback(signal.signal, signal.SIGUSR1, previous_usr1)
        try:
            config = parse_config(flags, environ={})
            plugin = build_plugin(config)
        except (ConfigError, DiscoveryError, KubeConfigError) as exc:
            raise CliError(f"cannot start the kubelet plugin: {exc}") from None
        stack.callback(plugin.stop)
        plugin.start()
        if not registration_socket_path(registry, config.driver_name).exists():
            raise CliError("the kubelet plugin started but serves no registration socket")
        kubelet_sim = stack.enter_context(KubeletSim(registry))
        kubelet = kubelet_sim.register(config.driver_name)
        api = server.client()
        stack.callback(api.close)
        yield Node(root, KubeRest(api), plugin, cdi, kubelet)


def wait_for_slices(rest: KubeRest, devices: int, timeout_s: float = SLICE_WAIT_S) -> list[Obj]:
    """The node's complete pool once it has ``devices`` devices."""
    deadline = time.monotonic() + timeout_s
    while True:
        slices = rest.request("GET", f"{RESOURCE_API}/resourceslices").get("items") or []
        mine = [s for s in slices if s["spec"].get("nodeName") == NODE_NAME]
        complete = mine and all(s["spec"]["pool"]["resourceSliceCount"] == len(mine) for s in mine)
        if complete and sum(len(s["spec"].get("devices") or []) for s in mine) == devices:
            return sorted(mine, key=lambda s: s["metadata"]["name"])
        if time.monotonic() > deadline:
            raise CliError(f"the plugin published no complete pool within {timeout_s:.0f} s")
        time.sleep(0.05)


# --- allocate, prepare, read back -------------------------------------------------------------


def cdi_limits(cdi_dir: Path, driver: str, uid: str) -> dict[str, dict[str, str]]:
    """CDI device ID -> the share variables of that device, from the claim's spec file."""
    path = cdi_dir / spec_file_name(driver, uid)
    spec = json.loads(path.read_text(encoding="utf-8"))
    kind = spec.get("kind", "")
    out: dict[str, dict[str, str]] = {}
    for device in spec.get("devices") or []:
        env = (device.get("containerEdits") or {}).get("env") or []
        pairs = (str(e).partition("=") for e in env)
        out[f"{kind}={device['name']}"] = {
            k: v for k, _, v in pairs if k.startswith(LIMIT_PREFIXES)
        }
    return out


def allocate_and_prepare(
    node: Node, claims: Sequence[tuple[str, Obj]], slices: Sequence[Obj], driver: str
) -> list[Obj]:
    """Create, allocate (status.allocation written) and prepare each claim in turn."""
    classes = node.rest.request("GET", f"{RESOURCE_API}/deviceclasses").get("items") or []
    allocator = Allocator(slices, classes, (), NODE_NAME, share_ids=seeded_share_ids(SHARE_ID_SEED))
    report = []
    for source, claim in claims:
        path = f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims"
        created = node.rest.request("POST", path, body=claim)
        md = created["metadata"]
        entry: Obj = {
            "claim": f"{md['namespace']}/{md['name']}",
            "source": source,
            "uid": md["uid"],
            "allocated": False,
        }
        report.append(entry)
        outcome = allocator.allocate(created)
        if outcome.allocation is None:
            reasons = [describe(r, slices) for rep in outcome.reports for r in rep.rejections]
            entry["reason"] = outcome.error or "; ".join(
                [rep.summary for rep in outcome.reports] + reasons[:1]
            )
            continue
        allocator.commit(created, outcome.allocation)
        created["status"] = {"allocation": outcome.allocation}
        node.rest.request("PUT", f"{path}/{md['name']}/status", body=created)
        entry["allocated"] = True
        entry["results"] = allocation_rows(outcome.allocation)
        ref = ClaimRef(namespace=md["namespace"], uid=md["uid"], name=md["name"])
        prepared = node.kubelet.prepare([ref])[md["uid"]]
        entry["prepared"] = not prepared.error
        if prepared.error:
            entry["prepareError"] = prepared.error
            continue
        limits = cdi_limits(node.cdi_dir, driver, md["uid"])
        entry["devices"] = [
            {
                "requests": list(d.request_names),
                "device": d.device_name,
                "shareID": d.share_id,
                "cdiDeviceIDs": list(d.cdi_device_ids),
                "limits": next((limits[i] for i in d.cdi_device_ids if i in limits), {}),
            }
            for d in prepared.devices
        ]
    return report


def usage_of(rest: KubeRest, slices: Sequence[Obj], driver: str) -> list[Obj]:
    """Per GPU: capacity, allocated and free cores and memory, and the claims (from the
    controller's reconcile of the slices and the claims on the API server)."""
    claims = rest.request("GET", f"{RESOURCE_API}/resourceclaims").get("items") or []
    out = []
    for name, gpu in reconcile(slices, claims, [], driver).items():
        s = gpu.status
        out.append(
            {
                "gpu": name,
                "index": gpu.spec.index,
                "model": gpu.spec.model,
                "cores": {
                    "capacity": s.capacity.cores,
                    "allocated": s.allocated.cores,
                    "free": s.allocatable.cores,
                },
                "memory": {
                    "capacity": s.capacity.memory,
                    "allocated": s.allocated.memory,
                    "free": s.allocatable.memory,
                },
                "claims": sorted({f"{a.claim_namespace}/{a.claim_name}" for a in s.allocations}),
            }
        )
    return sorted(out, key=lambda g: int(g["index"]))


def unprepare_all(node: Node, report: Sequence[Obj]) -> int:
    """Unprepare every prepared claim; returns how many succeeded."""
    refs = [
        ClaimRef(namespace=NAMESPACE, uid=e["uid"], name=e["claim"].partition("/")[2])
        for e in report
        if e.get("prepared")
    ]
    if not refs:
        return 0
    errors = node.kubelet.unprepare(refs)
    failed = {uid: err for uid, err in errors.items() if err}
    if failed:
        raise CliError(f"unprepare failed: {failed}")
    return len(refs)


# --- output -----------------------------------------------------------------------------------


def limits_text(limits: Mapping[str, str]) -> str:
    """The limits a reader compares with the request (:data:`SHOWN_LIMITS`), memory readable."""
    shown = []
    for key in SHOWN_LIMITS:
        if key in limits:
            value = limits[key]
            if key == "SHAREGPU_MEMORY" and value.isdigit():
                value = format_quantity(int(value))
            shown.append(f"{key}={value}")
    return " ".join(shown) or "-"


def _mem(value: str) -> str:
    return format_bytes_human(quantity_int(value))


def tables_of(data: Mapping[str, Any]) -> list[Table]:
    """Tables for humans: slices, allocations, CDI IDs and limits, usage, clean-up."""
    s = data["slices"]
    slices = Table(
        ["SLICE", "DEVICES", "NAMES"],
        title=f"Published ResourceSlices (node {data['node']}, {data['plugin']['sharingMode']} "
        f"mode, kubelet registered with {data['plugin']['registeredVersion']}): "
        f"{s['count']} slice(s), {s['devices']} device(s)",
    )
    for item in s["items"]:
        slices.add(item["name"], item["devices"], compact_names(item["deviceNames"]))
    alloc = Table(["CLAIM", "REQUEST", "DEVICE", "CONSUMED", "SHARE ID"], title="Allocations")
    limits = Table(["CLAIM", "CDI DEVICE ID", "ENFORCED LIMITS"], title="Prepared claims")
    for c in data["claims"]:
        if not c["allocated"]:
            alloc.add(c["claim"], "-", "-", f"not allocated: {c.get('reason', '')}", "-")
            continue
        for r in c["results"]:
            consumed = consumed_text(r["consumedCapacity"])
            alloc.add(c["claim"], r["request"], r["device"], consumed, r["shareID"] or "-")
        if not c.get("prepared"):
            limits.add(c["claim"], "-", f"prepare failed: {c.get('prepareError', '')}")
        for d in c.get("devices", []):
            text = limits_text(d["limits"])
            for i, cdi_id in enumerate(d["cdiDeviceIDs"]):
                limits.add(c["claim"] if i == 0 else "", cdi_id, text if i == 0 else "")
    usage = Table(
        ["GPU", "CORES USED", "CORES FREE", "MEMORY USED", "MEMORY FREE", "CLAIMS"],
        title="GPU usage (from the controller's reconcile)",
    )
    for g in data["usage"]:
        usage.add(
            g["index"],
            f"{g['cores']['allocated']}/{g['cores']['capacity']}",
            g["cores"]["free"],
            f"{_mem(g['memory']['allocated'])}/{_mem(g['memory']['capacity'])}",
            _mem(g["memory"]["free"]),
            ", ".join(g["claims"]) or "-",
        )
    done = Table(["STEP", "RESULT"], title=f"Clean-up (whole demo: {data['elapsedSeconds']:.1f} s)")
    done.add("unprepared claims", data["cleanup"]["unprepared"])
    done.add("CDI specs left after unprepare", data["cleanup"]["cdiSpecsLeft"])
    done.add("temporary directory removed", data["cleanup"]["tempDirRemoved"])
    return [slices, alloc, limits, usage, done]


def run_demo(examples: Path) -> Obj:
    """Run every step; returns the report (see :func:`tables_of` for its parts)."""
    started = time.monotonic()
    claims = demo_claims(examples)
    driver = names.DEFAULT_DRIVER_NAME
    root = Path(tempfile.mkdtemp(prefix="sharegpu-demo-", dir="/tmp"))
    data: Obj = {"node": NODE_NAME, "tempDir": str(root)}
    try:
        with running_node(root) as node:
            slices = wait_for_slices(node.rest, MOCK_GPUS)
            summary = slice_summary(slices)
            data["plugin"] = {
                "driver": driver,
                "backend": node.plugin.config.device_backend,
                "sharingMode": node.plugin.config.sharing_mode,
                "gpus": len(node.plugin.gpus),
                "registeredVersion": node.kubelet.version,
            }
            data["slices"] = {
                "count": len(summary),
                "devices": sum(s["devices"] for s in summary),
                "items": summary,
            }
            node.rest.request(
                "POST", f"{RESOURCE_API}/deviceclasses", body=default_device_class(driver)
            )
            report = allocate_and_prepare(node, claims, slices, driver)
            data["claims"] = report
            data["usage"] = usage_of(node.rest, slices, driver)
            unprepared = unprepare_all(node, report)
            left = sorted(p.name for p in node.cdi_dir.glob("*.json"))
            data["cleanup"] = {"unprepared": unprepared, "cdiSpecsLeft": len(left)}
    except KubeApiError as exc:
        raise CliError(f"API request failed: {exc}") from None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    data["cleanup"]["tempDirRemoved"] = not root.exists()
    data["elapsedSeconds"] = round(time.monotonic() - started, 3)
    return data


def run(args: argparse.Namespace) -> int:
    examples = Path(args.examples) if args.examples else default_examples_dir()
    root_logger = logging.getLogger()
    previous_level = root_logger.level
    root_logger.setLevel(logging.WARNING)  # the plugin's info logs would drown the report
    try:
        data = run_demo(examples)
    finally:
        root_logger.setLevel(previous_level)
    emit(data, tables_of(data), resolve_format(args.output))
    ok = all(c["allocated"] and c.get("prepared") for c in data["claims"])
    return EXIT_OK if ok and data["cleanup"]["cdiSpecsLeft"] == 0 else EXIT_FINDINGS
