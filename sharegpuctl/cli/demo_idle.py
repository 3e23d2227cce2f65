"""The demo's measured usage and idle verdict: one busy share and one idle share.

- :func:`simulated_shares` picks the shares the mock GPUs report processes for: of the prepared
  shares whose GPU reports per-process SM utilisation (not MPS: NVML reports an MPS share's SM
  time under its server, so the controller never judges an MPS share idle), the first uses
  three quarters of what it reserved (busy) and the second almost nothing (idle). Fewer than
  two such shares: fewer rows, never an error.
- :func:`usage_file_text` writes them as the plugin's ``--mock-usage-file``; the plugin's own
  sampler measures them and writes them into the claims' ``status.devices``.
- :func:`judge_idle` runs the controller's tracker with the default
  :class:`~controller.idle.IdlePolicy` on a :class:`~sharegpu.kube.clock.FakeClock`: once the
  tracker sees the measurements, the demo moves that clock one idle period ahead, so the
  verdict appears at once instead of after an hour. The tracker does not lead, so it writes
  nothing: the GPU objects and metric samples it would publish are read from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import yaml

from api import names
from api.jsontypes import Obj
from api.quantity import format_bytes_human, quantity_int
from controller.idle import IdlePolicy
from controller.tracker import Tracker
from sharegpu.kube.clock import FakeClock
from sharegpu.kube.rest import KubeRest
from sharegpuctl.cli.common import CliError
from sharegpuctl.cli.output import Table

#: The usage file of the demo's plugin (in its temporary directory).
USAGE_FILE: Final = "usage.yaml"
BUSY: Final = "busy"
IDLE: Final = "idle"
#: Real seconds the demo waits for the tracker to see the plugin's measurements.
MEASURE_WAIT_S: Final = 10.0
#: Memory of the idle share's process: this, or 1 % of its reservation when that is less.
IDLE_MEMORY: Final = 256 * 2**20


def _is_mps(limits: Mapping[str, str]) -> bool:
    return "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in limits


def simulated_shares(claims: Sequence[Obj]) -> list[Obj]:
    """The busy and the idle share (module text), in claim order: claim, uid, device, share ID,
    GPU UUID, reserved cores and memory (bytes), and the ``state``, ``sm`` and ``memory`` the
    mock GPU reports."""
    out: list[Obj] = []
    for c in claims:
        results = {(r["device"], r.get("shareID")): r for r in c.get("results", [])}
        for d in c.get("devices", []) if c.get("prepared") else []:
            limits = d.get("limits") or {}
            result = results.get((d["device"], d.get("shareID")))
            if result is None or _is_mps(limits) or "SHAREGPU_GPU_UUID" not in limits:
                continue
            consumed = result["consumedCapacity"]
            cores = int(consumed.get(names.CAP_CORES, names.CORES_PER_GPU))
            memory = quantity_int(consumed.get(names.CAP_MEMORY, 0))
            if cores <= 0 or memory <= 0:
                continue
            busy = not out
            out.append(
                {
                    "claim": c["claim"],
                    "uid": c["uid"],
                    "device": d["device"],
                    "shareID": d.get("shareID"),
                    "gpuUUID": limits["SHAREGPU_GPU_UUID"],
                    "cores": cores,
                    "reservedMemory": memory,
                    "state": BUSY if busy else IDLE,
                    "sm": cores * 3 // 4 if busy else 0,
                    "memory": memory * 3 // 4 if busy else min(IDLE_MEMORY, memory // 100),
                }
            )
            if len(out) == 2:
                return out
    return out


def usage_file_text(shares: Sequence[Obj]) -> str:
    """The mock usage file (:mod:`kubeletplugin.usage.mocksource`): one process per share."""
    by_gpu: dict[str, list[Obj]] = {}
    for s in shares:
        by_gpu.setdefault(s["gpuUUID"], []).append(
            {"claim": s["uid"], "memory": s["memory"], "sm": s["sm"]}
        )
    return yaml.safe_dump(by_gpu, sort_keys=True)


def _allocation(manifests: Sequence[Obj], share: Obj) -> tuple[Obj, Obj] | None:
    """``(GPU object, allocation)`` of ``share`` among the tracker's objects."""
    namespace, _, name = str(share["claim"]).partition("/")
    for gpu in manifests:
        for a in (gpu.get("status") or {}).get("allocations") or []:
            if (
                a.get("claimNamespace") == namespace
                and a.get("claimName") == name
                and a.get("device") == share["device"]
                and a.get("shareID") == share["shareID"]
            ):
                return gpu, a
    return None


def _measured(manifests: Sequence[Obj], shares: Sequence[Obj]) -> bool:
    """Whether every share's allocation carries the processes and SM the file gives."""
    for s in shares:
        found = _allocation(manifests, s)
        usage = (found[1].get("usage") or {}) if found is not None else {}
        if usage.get("processes") != 1 or usage.get("smUtilization") != s["sm"]:
            return False
    return True


def judge_idle(
    rest: KubeRest,
    driver: str,
    sample: Callable[[], object],
    shares: Sequence[Obj],
    policy: IdlePolicy | None = None,
) -> Obj:
    """Measure ``shares`` (``sample``: one round of the plugin's sampler) and judge them with
    the controller's tracker on a clock moved one idle period ahead (module text). Returns the
    rule, how far the clock moved, and per share its measurement, whether it is idle, its GPU's
    ``SharesIdle`` condition and its ``sharegpu_share_idle_seconds`` samples."""
    policy = policy or IdlePolicy()
    judged: Obj = {"rule": policy.describe(), "clockAdvancedSeconds": policy.period_s}
    if not shares:
        return {**judged, "shares": []}
    clock = FakeClock()
    tracker = Tracker(
        rest,
        driver,
        is_leader=lambda: False,
        clock=clock,
        freeze_gc=False,
        watch_timeout_s=60,
        idle=policy,
    )
    for informer in tracker.informers:
        informer.start()
    try:
        if not tracker.wait_synced(MEASURE_WAIT_S):
            raise CliError(f"the controller's tracker did not sync within {MEASURE_WAIT_S:.0f} s")
        deadline = time.monotonic() + MEASURE_WAIT_S
        while True:
            sample()
            tracker.flush()
            if _measured(tracker.manifests(), shares):
                break
            if time.monotonic() > deadline:
                raise CliError(
                    "the plugin's measurements did not reach the controller's tracker within "
                    f"{MEASURE_WAIT_S:.0f} s"
                )
            time.sleep(0.05)
        clock.advance(policy.period_s)
        tracker.flush()
        manifests = tracker.manifests()
        gauges = tracker.idle_gauges()
    finally:
        tracker.stop()
    rows = []
    for s in shares:
        found = _allocation(manifests, s)
        if found is None:
            continue
        gpu, a = found
        condition: Obj = next(
            (
                c
                for c in (gpu.get("status") or {}).get("conditions") or []
                if c.get("type") == names.CONDITION_SHARES_IDLE
            ),
            {},
        )
        namespace, _, name = str(s["claim"]).partition("/")
        rows.append(
            {
                **{k: v for k, v in s.items() if k != "uid"},
                "gpu": gpu["metadata"]["name"],
                "index": (gpu.get("spec") or {}).get("index"),
                "usage": a.get("usage"),
                "idle": a.get("idle") is True,
                "condition": condition,
                "idleSeconds": [
                    g.seconds for g in gauges if (g.namespace, g.claim) == (namespace, name)
                ],
            }
        )
    return {**judged, "shares": rows}


def idle_table(idle: Mapping[str, Any]) -> Table:
    """The busy and the idle share as the controller judged them."""
    table = Table(
        ["GPU", "CLAIM", "SHARE", "SM USED", "MEMORY USED", "IDLE", "GPU CONDITION SharesIdle"],
        title=f"Idle shares (simulated usage; the controller's rule: {idle['rule']}; the demo's "
        f"clock moved {idle['clockAdvancedSeconds']} s ahead; IDLE: sharegpu_share_idle_seconds; "
        "`sharegpu status --idle` lists them)",
    )
    for r in idle["shares"]:
        condition = r["condition"]
        seconds = r["idleSeconds"]
        table.add(
            r["index"],
            r["claim"],
            (r["shareID"] or r["device"])[:8],
            f"{r['sm']}%/{r['cores']}%",
            f"{format_bytes_human(r['memory'])}/{format_bytes_human(r['reservedMemory'])}",
            f"yes ({seconds[0]:.0f} s)" if r["idle"] and seconds else "yes" if r["idle"] else "no",
            f"{condition.get('status', '-')} ({condition.get('reason', '')})" if condition else "-",
        )
    return table
