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
6. Per-GPU usage from the controller's pure reconcile (:func:`controller.reconcile.reconcile`),
   with the limit sums and overcommit ratio of the GPUs that hold a burstable share (the
   burstable example runs with its own DeviceClass), and the burstable shares' request and
   limit.
7. Measured usage and idle shares (:mod:`sharegpuctl.cli.demo_idle`): the mock GPUs report a
   busy and an idle process, the plugin's sampler writes them into the claims, and the
   controller's tracker judges them on a clock moved one idle period ahead.
8. With ``--keep-running``: the tables printed, then the controller (GPU objects, GpuQuota
   statuses), the webhook's checks and quota charging as the API server's admission
   (:mod:`sharegpuctl.cli.demo_admission`) and the claim, scheduler and kubelet steps
   (:mod:`sharegpuctl.cli.demo_cluster`) keep reacting to ``kubectl`` until SIGINT or SIGTERM.
   The API server listens on loopback only and requires the bearer token of the kubeconfig it
   writes (mode 0600); workload kinds it does not run are refused naming ``make local-cluster``.
9. Everything unprepared, the plugin and the API server stopped, the temporary directory removed.
10. What a claim's GpuConfig changed, the example directories not run and why, and the next
   steps (``sharegpu validate``, ``sharegpu explain``, installing the chart).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import textwrap
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
from controller.config import parse_config as parse_controller_config
from controller.main import Controller
from controller.quotaadmit import QuotaAdmitter
from controller.reconcile import reconcile
from controller.webhook import AdmissionHandler
from kubeletplugin.config import ConfigError, parse_config
from kubeletplugin.main import Plugin, build_plugin
from kubeletplugin.prepare.cdi import spec_file_name
from kubeletplugin.preview import DiscoveryError
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
from sharegpuctl.cli.demo_admission import webhook_admission
from sharegpuctl.cli.demo_cluster import DemoCluster, PreparedClaim, cdi_env
from sharegpuctl.cli.demo_idle import (
    USAGE_FILE,
    idle_table,
    judge_idle,
    simulated_shares,
    usage_file_text,
)
from sharegpuctl.cli.demo_inputs import (
    NAMESPACE,
    NEXT_STEPS,
    ClaimInput,
    demo_claims,
    override_notes,
    skipped_examples,
    user_claims,
)
from sharegpuctl.cli.explain import allocation_rows, consumed_text, describe, pod_groups
from sharegpuctl.cli.output import Table, emit, fit_width, resolve_format
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.apiserver.resources import default_resources, refused_kinds
from sharegpuctl.local.kubelet import ClaimRef, KubeletSim, RegisteredPlugin

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
        "enforced limits, GpuConfig overrides, GPU usage with limit sums and overcommit, the "
        "burstable shares, and an idle share next to a busy one (simulated usage, judged by the "
        "controller's tracker on a clock moved one idle period ahead), cleans everything up, and "
        "names the examples it did not run and the next steps.",
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
        help="after allocating and preparing, print the tables and keep a demo cluster running "
        "for kubectl (HTTPS on loopback, token in the printed kubeconfig): pods from kubectl "
        "apply get claims from their templates, are admitted, allocated, prepared and run; "
        "until Ctrl-C or SIGTERM, then clean up and print the report",
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
    server: KubeAPIServer
    rest: KubeRest
    plugin: Plugin
    cdi_dir: Path
    kubelet: RegisteredPlugin


@contextmanager
def running_node(root: Path) -> Iterator[Node]:
    """API server, Node, plugin and registered kubelet client, all stopped on exit."""
    registry, data, cdi = root / "registry", root / "plugin", root / "cdi"
    with ExitStack() as stack:
        server = stack.enter_context(
            KubeAPIServer(
                token=secrets.token_urlsafe(32),
                tls=True,
                resources=[*default_resources(), *refused_kinds(not_run_here)],
            )
        )
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
            # What the mock GPUs report (:mod:`.demo_idle`); a claim's usage is written at
            # most once a second.
            *("--mock-usage-file", str(root / USAGE_FILE), "--usage-write-interval", "1"),
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
        kubelet_sim = stack.enter_context(KubeletSim(registry))
        if not kubelet_sim.registration_socket(config.driver_name).exists():
            raise CliError("the kubelet plugin started but serves no registration socket")
        kubelet = kubelet_sim.register(config.driver_name)
        api = server.client()
        stack.callback(api.close)
        yield Node(root, Path(kubeconfig), server.url, server, KubeRest(api), plugin, cdi, kubelet)


def not_run_here(kind: str) -> str:
    """Why the demo cluster refuses a workload ``kind``."""
    return (
        f"the sharegpu demo cluster does not run {kind}s, so nothing of this {kind} was "
        "stored: it runs Pods, ResourceClaims, ResourceClaimTemplates, DeviceClasses and "
        f"GpuQuotas. For {kind}s, run `make local-cluster` (a real cluster with the driver "
        "installed)"
    )


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
            "fromTemplate": item.from_template,
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
                "devices": list(gpu.spec.devices),
                "limitsSummary": s.limits_summary,
                "overcommit": s.overcommit,
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
    """The limits a reader compares with the request (:data:`SHOWN_LIMITS`), memory readable,
    the GPU UUID of a pinned memory limit left out (``-o json`` has it)."""
    shown = []
    for key in SHOWN_LIMITS:
        if key in limits:
            value = limits[key]
            if key == "SHAREGPU_MEMORY" and value.isdigit():
                value = format_quantity(int(value))
            if key == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":
                value = value.rpartition("=")[2]
            shown.append(f"{key}={value}")
    return " ".join(shown) or "-"


#: Columns the human-readable report fits in.
WIDTH: Final = 120
#: Characters of a share ID the tables show (the JSON report has them whole).
SHORT_ID: Final = 8


def short_id(share_id: str | None) -> str:
    """The first :data:`SHORT_ID` characters of a share ID, ``-`` for none."""
    return share_id[:SHORT_ID] if share_id else "-"


def _mem(value: str) -> str:
    return format_bytes_human(quantity_int(value))


def tables_of(data: Mapping[str, Any], running: bool = False) -> list[Table]:
    """Tables for humans: slices, allocations, CDI IDs and limits, usage, the pods' shares,
    clean-up (``running``: only what is known while the demo cluster runs)."""
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
    limits = Table(
        ["CLAIM", "DEVICE", "SHARE", "ENFORCED LIMITS"],
        title="Prepared claims (the limits the plugin wrote into each CDI device; -o json has "
        "the CDI device IDs)",
    )
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
            alloc.add(
                c["claim"], origin, r["request"], r["device"], consumed, short_id(r["shareID"])
            )
        for o in c.get("overrides", []):
            overrides.add(c["claim"], o["request"], o["override"])
        if not c.get("prepared"):
            limits.add(c["claim"], "-", "-", f"prepare failed: {c.get('prepareError', '')}")
        for d in c.get("devices", []):
            limits.add(c["claim"], d["device"], short_id(d["shareID"]), limits_text(d["limits"]))
    usage = Table(
        ["GPU", "CORES", "MEMORY", "LIMITS", "OVERCOMMIT", "CLAIMS"],
        title="GPU usage (from the controller's reconcile, as `kubectl get gpus` shows it; LIMITS: "
        "where a share is burstable)",
    )
    for g in data["usage"]:
        usage.add(
            g["index"],
            f"{g['cores']['allocated']}/{g['cores']['capacity']}",
            f"{_mem(g['memory']['allocated'])}/{_mem(g['memory']['capacity'])}",
            g.get("limitsSummary") or "-",
            g.get("overcommit") or "-",
            ", ".join(g["claims"]) or "-",
        )
    tables = [slices, alloc, limits]
    if overrides.rows:
        tables.append(overrides)
    tables.append(usage)
    if data.get("burstable"):
        tables.append(burstable_table(data["burstable"]))
    if data.get("idle") and data["idle"]["shares"]:
        tables.append(idle_table(data["idle"]))
    if running:
        return [fit_width(t, WIDTH) for t in tables]
    if data.get("pods"):
        pods = Table(
            ["POD", "CLAIM", "DEVICE", "SHARE ID"], title="Pods that ran, and the share each got"
        )
        for p in data["pods"]:
            pods.add(p["pod"], p["claim"], p["device"], short_id(p["shareID"]))
        tables.append(pods)
    done = Table(["STEP", "RESULT"], title=f"Clean-up (whole demo: {data['elapsedSeconds']:.1f} s)")
    done.add("unprepared claims", data["cleanup"]["unprepared"])
    done.add("CDI specs left after unprepare", data["cleanup"]["cdiSpecsLeft"])
    done.add("temporary directory removed", data["cleanup"]["tempDirRemoved"])
    tables.append(done)
    if data.get("skippedExamples"):
        skipped = Table(["EXAMPLE", "WHY THE DEMO DOES NOT RUN IT"], title="Examples not run")
        for e in data["skippedExamples"]:
            skipped.add(e["example"], e["reason"])
        tables.append(skipped)
    steps = Table(["COMMAND", "WHAT FOR"], title="Next steps")
    for step in data["nextSteps"]:
        steps.add(step["command"], step["what"])
    tables.append(steps)
    return [fit_width(t, WIDTH) for t in tables]


def burstable_table(rows: Sequence[Obj]) -> Table:
    """The burstable shares (:func:`burstable_rows`)."""
    table = Table(
        ["CLAIM", "DEVICE", "RESERVED (REQUEST)", "ENFORCED (LIMIT)", "GPU LIMITS", "OVERCOMMIT"],
        title="Burstable shares (kube-scheduler and GpuQuota count the request, the plugin "
        "enforces the limit)",
    )
    for r in rows:
        table.add(
            r["claim"],
            r["device"],
            consumed_text(r["reserved"]),
            consumed_text(r["limit"])
            + (f" (refused: {'; '.join(r['problems'])})" if r["problems"] else ""),
            r["gpuLimits"] or "-",
            r["overcommit"] or "-",
        )
    return table


#: What ``--keep-running`` does while the demo cluster runs: given the running node and the
#: report so far, return when the cluster should stop, every claim unprepared; returns how many
#: claims it unprepared.
Hold = Callable[[Node, Obj], int]


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
        inputs = demo_claims(examples)
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
            data["burstable"] = burstable_rows(report, data["usage"])
            data["idle"] = measure_idle(node, report, driver)
            if hold is not None:
                unprepared = hold(node, data)
                data["usage"] = usage_of(node.rest, slices, driver)
            else:
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


def measure_idle(node: Node, report: Sequence[Obj], driver: str) -> Obj | None:
    """The busy and the idle share of :mod:`.demo_idle`, measured by the plugin and judged by
    the controller's tracker; None when the plugin samples no usage."""
    sampler = node.plugin.usage
    if sampler is None:
        return None
    shares = simulated_shares(report)
    (node.root / USAGE_FILE).write_text(usage_file_text(shares), encoding="utf-8")
    api = node.server.client()
    try:
        return judge_idle(KubeRest(api), driver, sampler.sample_once, shares)
    finally:
        api.close()


def burstable_rows(report: Sequence[Obj], usage: Sequence[Obj]) -> list[Obj]:
    """Each allocated burstable share: what it reserves, the limit the plugin enforces, and its
    GPU's limit sums and overcommit ratio (from :func:`usage_of`)."""
    gpus = {device: g for g in usage for device in g["devices"]}
    out = []
    for c in report:
        for r in c.get("results", []) if c.get("allocated") else []:
            burst = r.get("burst")
            if not burst:
                continue
            gpu = gpus.get(str(r["device"]), {})
            out.append(
                {
                    "claim": c["claim"],
                    "request": r["request"],
                    "device": r["device"],
                    "reserved": r["consumedCapacity"],
                    "limit": burst["limit"],
                    "problems": burst["problems"],
                    "gpuLimits": gpu.get("limitsSummary"),
                    "overcommit": gpu.get("overcommit"),
                }
            )
    return out


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


def start_controller(node: Node, driver: str) -> tuple[Controller, AdmissionHandler]:
    """The controller's tracker and quota controller against the demo's API server, and its
    webhook's checks with quota charging (served in-process: see :mod:`.demo_admission`)."""
    config = parse_controller_config(
        [
            *("--kubeconfig", str(node.kubeconfig), "--driver-name", driver),
            *("--metrics-address", "", "--api-address", "", "--disable-webhook"),
        ]
    )
    controller = Controller(config)
    try:
        controller.start()
    except (KubeConfigError, KubeApiError, OSError, ValueError) as exc:
        controller.stop()
        raise CliError(f"cannot start the controller: {exc}") from None
    quotas = controller.quotas
    admitter = (
        QuotaAdmitter(
            node.rest,
            driver,
            (),
            controller.quota_basis,
            has_quotas=quotas.namespace_has_quotas,
            known_classes=quotas.driver_classes,
        )
        if quotas is not None
        else None
    )
    return controller, AdmissionHandler(driver, None, (), admitter)


def prepared_at_start(node: Node, data: Obj, driver: str) -> list[PreparedClaim]:
    """The claims the startup step prepared, with their devices and CDI environment, as the
    demo cluster tracks them."""
    out = []
    for c in data["claims"]:
        if c.get("prepared"):
            namespace, _, name = c["claim"].partition("/")
            ref = ClaimRef(namespace=namespace, uid=c["uid"], name=name)
            env = cdi_env(node.cdi_dir, driver, c["uid"])
            devices = [
                (
                    tuple(d["requests"]),
                    d["device"],
                    d["shareID"],
                    tuple(d["cdiDeviceIDs"]),
                    [e for i in d["cdiDeviceIDs"] for e in env.get(i, [])],
                )
                for d in c.get("devices", [])
            ]
            out.append(PreparedClaim(ref, devices))
    return out


def remove_template_claims(node: Node, data: Obj) -> list[str]:
    """Delete the claims the startup step made from templates (in a cluster, a template's
    claim exists only for a pod: the demo cluster makes one per pod that names the template);
    the demo cluster unprepares them. Returns the names of the prepared claims that stay."""
    kept = []
    for c in data["claims"]:
        if not c.get("uid"):
            continue
        namespace, _, name = c["claim"].partition("/")
        if c.get("fromTemplate"):
            path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}"
            node.rest.request("DELETE", path)
        elif c.get("prepared"):
            kept.append(name)
    return kept


#: What reacts while the demo cluster runs (the banner says it).
REACTS: Final = (
    "What reacts to kubectl: claims are made from ResourceClaimTemplates and checked by the "
    "webhook's rules and GpuQuotas; pods' claims are allocated by the scheduler's allocator "
    "(Scheduled or FailedScheduling events) and prepared by the plugin; pods run (no process: "
    "`kubectl logs POD` prints the devices and CDI environment they got); the controller keeps "
    "GPU objects and GpuQuota status; deleting a pod or claim unprepares and deallocates. "
    "Deployments, Jobs, Services and other workloads are refused: use `make local-cluster`."
)


@contextmanager
def live_cluster(node: Node, data: Obj) -> Iterator[DemoCluster]:
    """The controller, the webhook as the API server's admission and the demo cluster's loop,
    running on ``node`` until the block ends (the claims stay prepared: see
    :meth:`DemoCluster.unprepare_all`)."""
    driver = data["plugin"]["driver"]
    controller, webhook = start_controller(node, driver)
    cluster = DemoCluster(
        node.server,
        node.rest,
        node.kubelet,
        node.cdi_dir,
        NODE_NAME,
        driver,
        seeded_share_ids(SHARE_ID_SEED + 1),
        prepared_at_start(node, data, driver),
    )
    try:
        node.server.admission = webhook_admission(webhook, driver)
        cluster.start()
        tracker = controller.tracker
        if tracker is not None:
            node.server.wait_for(tracker.synced, timeout_s=SLICE_WAIT_S)
        yield cluster
    finally:
        node.server.admission = None
        cluster.stop()
        controller.stop()


def banner(node: Node, kept: Sequence[str]) -> str:
    """How to reach the running demo cluster and what reacts, within :data:`WIDTH` columns."""
    lines = [
        f"The demo cluster is running: API server {node.url} (loopback, token in the "
        f"kubeconfig), node {NODE_NAME}; of the claims above, {', '.join(kept) or 'none'} "
        "stay allocated and prepared (those of templates were removed: a pod gets its own).",
        REACTS,
        f"  export KUBECONFIG={node.kubeconfig}",
        "  kubectl apply -f examples/two-pods-fractional-share/",
        "  kubectl get pods,resourceclaims -o wide; kubectl logs small-share",
        "  kubectl get gpus; kubectl get events",
        "Press Ctrl-C (or send SIGTERM) to stop: the claims are unprepared, everything is "
        "removed and the report is printed.",
    ]
    return "\n".join(
        w
        for line in lines
        for w in textwrap.wrap(
            line, WIDTH, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
        )
    )


def hold_until_signalled(node: Node, data: Obj, fmt: str = "table") -> int:
    """Start what reacts to kubectl (:func:`live_cluster`), print the tables so far (text
    output only: ``-o json`` stays one document) and how to reach it (on standard error), and
    wait for SIGINT or SIGTERM; then stop it and unprepare every claim. Returns how many claims
    were unprepared."""
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in previous:
        signal.signal(sig, handle)
    try:
        with live_cluster(node, data) as cluster:
            if fmt in ("table", "text"):
                emit(data, tables_of(data, running=True), fmt)
            kept = remove_template_claims(node, data)
            print(banner(node, kept), file=sys.stderr, flush=True)
            while not stop.wait(0.5):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    cluster.unprepare_all()
    data["pods"] = cluster.pod_shares()
    return cluster.unprepared


def run(args: argparse.Namespace) -> int:
    examples = Path(args.examples) if args.examples else default_examples_dir()
    files = args.filename or []
    root_logger = logging.getLogger()
    previous_level = root_logger.level
    root_logger.setLevel(logging.WARNING)  # the plugin's info logs would drown the report
    try:
        fmt = resolve_format(args.output)
        hold = functools.partial(hold_until_signalled, fmt=fmt) if args.keep_running else None
        data = run_demo(examples, files, hold)
    finally:
        root_logger.setLevel(previous_level)
    emit(data, tables_of(data), fmt)
    ok = all(c["allocated"] and c.get("prepared") for c in data["claims"])
    return EXIT_OK if ok and data["cleanup"]["cdiSpecsLeft"] == 0 else EXIT_FINDINGS
