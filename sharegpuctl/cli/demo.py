"""``sharegpu demo``: the whole driver on this machine, with no cluster and no GPU.

1. An in-process Kubernetes API server (:mod:`sharegpuctl.local.apiserver`) and a Node.
2. The real kubelet plugin daemon (:func:`kubeletplugin.main.build_plugin`, started as its
   ``run`` would): mock backend with 8 H100-like GPUs, consumable mode, slice publisher, health
   monitor, and its kubelet service (gRPC sockets, checkpoint, CDI specs), all files in one
   temporary directory. Share enforcement is the plugin's own; with the mock backend it drives
   simulated NVIDIA tools, so no real ``nvidia-smi`` or MPS command runs.
3. The published ResourceSlices, the driver's DeviceClass and the claims of the examples that
   fit consumable mode (templates become claims named like them), each row naming its example
   directory; or, with ``-f``, the user's claims, templates and DeviceClasses, the pods and
   workloads of the files naming who uses each claim (:mod:`sharegpuctl.cli.demo_inputs`).
4. Each claim allocated in turn with :mod:`sharegpu.allocator` as kube-scheduler would (the
   claims one pod uses together, in one search), its ``status.allocation`` written to the API
   server.
5. Each claim prepared through the plugin's real DRA socket by a kubelet-side client
   (:mod:`sharegpuctl.local.kubelet`, registration handshake first); the enforced limits are read
   back from the CDI spec the plugin wrote.
6. Per-GPU usage from the controller's pure reconcile (:func:`controller.reconcile.reconcile`).
7. With ``--keep-running``: the GPU objects written as the controller writes them, the kubeconfig
   printed, and everything kept running for ``kubectl`` until SIGINT or SIGTERM.
8. Everything unprepared, the plugin and the API server stopped, the temporary directory removed.
9. What a claim's GpuConfig changed, the example directories not run and why, and the next
   steps (``sharegpu validate``, ``sharegpu explain``, installing the chart).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final

from api import names
from api.jsontypes import Obj
from api.quantity import format_bytes_human, format_quantity, quantity_int
from controller.reconcile import reconcile
from kubeletplugin.config import ConfigError, parse_config
from kubeletplugin.devices.backend import DiscoveryError
from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.kubelet.registration import registration_socket_path
from kubeletplugin.main import Plugin, build_plugin
from kubeletplugin.prepare.cdi import spec_file_name
from sharegpu.allocator import Allocator, seeded_share_ids
from sharegpu.kube.rest import KubeApiError, KubeConfigError, KubeRest
from sharegpuctl.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    CliError,
    add_output_flag,
    compact_names,
    default_device_class,
    slice_summary,
)
from sharegpuctl.cli.demo_inputs import (
    NAMESPACE,
    NEXT_STEPS,
    ClaimInput,
    Inputs,
    demo_claims,
    override_notes,
    skipped_examples,
    user_claims,
)
from sharegpuctl.cli.explain import allocation_rows, consumed_text, describe, pod_groups
from sharegpuctl.cli.output import Table, emit, resolve_format
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.kubelet import KubeletSim, RegisteredPlugin

HELP = "run the whole driver locally: mock GPUs, the real plugin, allocation, prepare"
NODE_NAME: Final = "demo-node"
MOCK_GPUS: Final = 8
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
        "as kubelet would (or the claims of -f instead); prints slices, allocations, CDI IDs, "
        "enforced limits, GpuConfig overrides and GPU usage, cleans everything up, and names the "
        "examples it did not run and the next steps.",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "-f",
        "--filename",
        action="append",
        metavar="FILE",
        help="run on these ResourceClaims, ResourceClaimTemplates, DeviceClasses and pods "
        "instead of the examples (file or directory, recursive; repeatable; '-' reads standard "
        "input)",
    )
    source.add_argument(
        "--examples",
        metavar="DIR",
        help="examples directory (default: $SHAREGPU_EXAMPLES, else examples/ of the source tree, "
        "else /usr/share/sharegpu/examples in the container image)",
    )
    p.add_argument(
        "--keep-running",
        action="store_true",
        help="after allocating and preparing, keep the API server, the plugin and the claims "
        "running for kubectl (prints the kubeconfig) until Ctrl-C or SIGTERM, then clean up "
        "and print the report",
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


# --- the running node -----------------------------------------------------------------------


@dataclass
class Node:
    """The running pieces: API access, the plugin, and the kubelet side."""

    root: Path
    kubeconfig: Path
    url: str
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
            *("--device-backend", names.MOCK_BACKEND, "--mock-gpus", str(MOCK_GPUS)),
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
        yield Node(root, Path(kubeconfig), server.url, KubeRest(api), plugin, cdi, kubelet)


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
    node: Node, claims: Sequence[ClaimInput], slices: Sequence[Obj], driver: str
) -> list[Obj]:
    """Create, allocate (status.allocation written) and prepare the claims: the claims one pod
    uses are allocated together, as kube-scheduler allocates a pod's claims; report in input
    order."""
    classes = node.rest.request("GET", f"{RESOURCE_API}/deviceclasses").get("items") or []
    allocator = Allocator(slices, classes, (), NODE_NAME, share_ids=seeded_share_ids(SHARE_ID_SEED))
    path = f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims"
    report: list[Obj] = [
        {
            "claim": f"{NAMESPACE}/{item.claim['metadata']['name']}",
            "source": item.source,
            "example": item.example,
            "usedBy": list(item.users),
            "allocated": False,
        }
        for item in claims
    ]
    for group in pod_groups([item.users for item in claims]):
        created: list[tuple[Obj, Obj]] = []  # (report entry, claim as created)
        for i in group:
            try:
                obj = node.rest.request("POST", path, body=claims[i].claim)
            except KubeApiError as exc:
                report[i]["reason"] = f"the API server refused the claim: {exc}"
                continue
            report[i]["uid"] = obj["metadata"]["uid"]
            created.append((report[i], obj))
        outcomes = allocator.allocate_pod([obj for _, obj in created])
        for (entry, obj), outcome in zip(created, outcomes, strict=True):
            if outcome.allocation is None:
                reasons = [describe(r, slices) for rep in outcome.reports for r in rep.rejections]
                entry["reason"] = outcome.error or "; ".join(
                    [rep.summary for rep in outcome.reports] + reasons[:1]
                )
                continue
            allocator.commit(obj, outcome.allocation)
            obj["status"] = {"allocation": outcome.allocation}
            node.rest.request("PUT", f"{path}/{obj['metadata']['name']}/status", body=obj)
            _prepare(node, entry, obj, outcome.allocation, driver)
    return report


def _prepare(node: Node, entry: Obj, claim: Obj, allocation: Obj, driver: str) -> None:
    """Prepare one allocated claim through the plugin; record devices and limits in ``entry``."""
    md = claim["metadata"]
    entry["allocated"] = True
    entry["results"] = allocation_rows(allocation)
    entry["overrides"] = override_notes(allocation, entry["results"], driver)
    ref = ClaimRef(namespace=md["namespace"], uid=md["uid"], name=md["name"])
    prepared = node.kubelet.prepare([ref])[md["uid"]]
    entry["prepared"] = not prepared.error
    if prepared.error:
        entry["prepareError"] = prepared.error
        return
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
    alloc = Table(
        ["CLAIM", "FROM", "REQUEST", "DEVICE", "CONSUMED", "SHARE ID"],
        title=f"Allocations ({data['input']})",
    )
    limits = Table(["CLAIM", "CDI DEVICE ID", "ENFORCED LIMITS"], title="Prepared claims")
    overrides = Table(
        ["CLAIM", "REQUEST", "WHAT THE GPUCONFIG CHANGED"],
        title="GpuConfig overrides (a DeviceClass's or the claim's config, not the share, sets "
        "these limits)",
    )
    for c in data["claims"]:
        origin = c.get("example") or c["source"]
        if not c["allocated"]:
            alloc.add(c["claim"], origin, "-", "-", f"not allocated: {c.get('reason', '')}", "-")
            continue
        for r in c["results"]:
            consumed = consumed_text(r["consumedCapacity"])
            alloc.add(c["claim"], origin, r["request"], r["device"], consumed, r["shareID"] or "-")
        for o in c.get("overrides", []):
            overrides.add(c["claim"], o["request"], o["override"])
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
    tables = [slices, alloc, limits]
    if overrides.rows:
        tables.append(overrides)
    tables += [usage, done]
    if data.get("skippedExamples"):
        skipped = Table(["EXAMPLE", "WHY THE DEMO DOES NOT RUN IT"], title="Examples not run")
        for e in data["skippedExamples"]:
            skipped.add(e["example"], e["reason"])
        tables.append(skipped)
    steps = Table(["COMMAND", "WHAT FOR"], title="Next steps")
    for step in data["nextSteps"]:
        steps.add(step["command"], step["what"])
    tables.append(steps)
    return tables


def publish_gpus(rest: KubeRest, slices: Sequence[Obj], driver: str) -> int:
    """Write the GPU objects the controller would write (spec, then status); returns how many."""
    claims = rest.request("GET", f"{RESOURCE_API}/resourceclaims").get("items") or []
    path = f"/apis/{names.GROUP_VERSION}/{names.GPU_PLURAL}"
    gpus = reconcile(slices, claims, [], driver)
    for gpu in gpus.values():
        manifest = gpu.manifest()
        spec_only = {k: v for k, v in manifest.items() if k != "status"}
        created = rest.request("POST", path, body=spec_only)
        created["status"] = manifest["status"]
        rest.request("PUT", f"{path}/{gpu.name}/status", body=created)
    return len(gpus)


#: What ``--keep-running`` does while the demo cluster runs: given the running node and the
#: report so far, return when the cluster should stop.
Hold = Callable[[Node, Obj], None]


def run_demo(examples: Path, files: Sequence[str] = (), hold: Hold | None = None) -> Obj:
    """Run every step on the claims of ``files`` (``-f``), else on those of the examples;
    returns the report (see :func:`tables_of` for its parts). ``hold`` (``--keep-running``)
    is called with everything allocated, prepared and the GPU objects written, before the
    clean-up."""
    started = time.monotonic()
    if files:
        inputs = user_claims(files)
        described = f"claims of {', '.join(files)}"
        skipped: list[Obj] = []
    else:
        inputs = Inputs(demo_claims(examples))
        described = f"claims of the examples in {examples}"
        skipped = skipped_examples(examples)
    driver = names.DEFAULT_DRIVER_NAME
    root = Path(tempfile.mkdtemp(prefix="sharegpu-demo-", dir="/tmp"))
    data: Obj = {"node": NODE_NAME, "tempDir": str(root), "input": described}
    try:
        with running_node(root) as node:
            slices = wait_for_slices(node.rest, MOCK_GPUS)
            summary = slice_summary(slices)
            data["plugin"] = {
                "driver": driver,
                "backend": node.plugin.backend.name,
                "sharingMode": node.plugin.config.sharing_mode,
                "gpus": len(node.plugin.gpus),
                "registeredVersion": node.kubelet.version,
            }
            data["slices"] = {
                "count": len(summary),
                "devices": sum(s["devices"] for s in summary),
                "items": summary,
            }
            create_classes(node.rest, inputs.classes, driver)
            report = allocate_and_prepare(node, inputs.claims, slices, driver)
            data["claims"] = report + inputs.unusable
            data["usage"] = usage_of(node.rest, slices, driver)
            if hold is not None:
                publish_gpus(node.rest, slices, driver)
                hold(node, data)
            unprepared = unprepare_all(node, report)
            left = sorted(p.name for p in node.cdi_dir.glob("*.json"))
            data["cleanup"] = {"unprepared": unprepared, "cdiSpecsLeft": len(left)}
    except KubeApiError as exc:
        raise CliError(f"API request failed: {exc}") from None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    data["cleanup"]["tempDirRemoved"] = not root.exists()
    data["elapsedSeconds"] = round(time.monotonic() - started, 3)
    data["skippedExamples"] = skipped
    data["nextSteps"] = [{"command": c, "what": w} for c, w in NEXT_STEPS]
    return data


def create_classes(rest: KubeRest, classes: Sequence[Obj], driver: str) -> None:
    """The DeviceClasses of ``-f``, then the chart's default class unless one of them took its
    name; a class the API server refuses ends the demo with its message."""
    path = f"{RESOURCE_API}/deviceclasses"
    taken = set()
    for cls in classes:
        name = cls["metadata"]["name"]
        try:
            rest.request("POST", path, body=cls)
        except KubeApiError as exc:
            raise CliError(f"DeviceClass {name}: the API server refused it: {exc}") from None
        taken.add(name)
    default = default_device_class(driver)
    if default["metadata"]["name"] not in taken:
        rest.request("POST", path, body=default)


def hold_until_signalled(node: Node, data: Obj) -> None:
    """Print how to reach the running demo cluster with kubectl (on standard error, so that
    ``-o json`` stays one document) and wait for SIGINT or SIGTERM."""
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in previous:
        signal.signal(sig, handle)
    try:
        prepared = sum(1 for c in data["claims"] if c.get("prepared"))
        lines = [
            f"The demo cluster is running: API server {node.url}, node {NODE_NAME}, "
            f"{prepared} claim(s) allocated and prepared.",
            f"  export KUBECONFIG={node.kubeconfig}",
            "  kubectl get resourceslices -o wide",
            f"  kubectl get resourceclaims -n {NAMESPACE}",
            "  kubectl get gpus",
            "  kubectl explain gpus.spec",
            "Press Ctrl-C (or send SIGTERM) to stop: the claims are unprepared, everything is "
            "removed and the report is printed.",
        ]
        print("\n".join(lines), file=sys.stderr, flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(args: argparse.Namespace) -> int:
    examples = Path(args.examples) if args.examples else default_examples_dir()
    files = args.filename or []
    root_logger = logging.getLogger()
    previous_level = root_logger.level
    root_logger.setLevel(logging.WARNING)  # the plugin's info logs would drown the report
    try:
        data = run_demo(examples, files, hold_until_signalled if args.keep_running else None)
    finally:
        root_logger.setLevel(previous_level)
    emit(data, tables_of(data), resolve_format(args.output))
    ok = all(c["allocated"] and c.get("prepared") for c in data["claims"])
    return EXIT_OK if ok and data["cleanup"]["cdiSpecsLeft"] == 0 else EXIT_FINDINGS
