"""``sharegpu status``: per-GPU usage from the controller's ``GPU`` objects.

Reads ``resource.sharegpu.dev/v1alpha1`` ``gpus`` (cluster-scoped) and prints two tables: the
rows of :func:`~sharegpuctl.cli.gpurows.gpu_rows` (the columns ``kubectl get gpus`` shows, plus the
pods) with each GPU's ``Overcommitted`` condition, and :func:`usage_rows`, one row per allocation
the node plugin measured (``status.allocations[].usage``). With ``--idle``, only
:func:`idle_rows`: the allocations the controller marked idle. Allocations without ``usage`` have
no row; the objects are shown as the API serves them, so a field of the wrong type reads as ``?``,
never as an error.
"""

from __future__ import annotations

import argparse
from typing import Any, Final

from api import names
from api.jsontypes import Obj
from api.quantity import QuantityError, format_bytes_human, quantity_int
from sharegpuctl.cli.common import EXIT_OK, CliError, add_output_flag
from sharegpuctl.cli.gpurows import COLUMNS, gpu_rows
from sharegpuctl.cli.output import Table, emit, resolve_format

HELP = "show every GPU's model, health, allocated cores and memory, claims and pods"
GPUS_PATH: Final = f"/apis/{names.GROUP_VERSION}/{names.GPU_PLURAL}"
#: Column of the GPU table added to :data:`~sharegpuctl.cli.gpurows.COLUMNS`: the status of the
#: GPU's ``Overcommitted`` condition (``-`` when the GPU has none: nothing measured).
OVERCOMMITTED: Final = "OVERCOMMITTED"
#: Columns, in order, of :func:`usage_rows`. MEMORY is ``used/reserved``; SM is the SM
#: utilisation against the reserved cores (both percent of the GPU; ``-`` where the GPU does not
#: report per-process utilisation).
USAGE_COLUMNS: Final = (
    "NODE",
    "GPU",
    "CLAIM",
    "SHARE",
    "MEMORY",
    "SM",
    "PROCESSES",
    OVERCOMMITTED,
)


#: Columns, in order, of :func:`idle_rows` (``sharegpu status --idle``).
IDLE_COLUMNS: Final = ("NODE", "GPU", "CLAIM", "SHARE", "PODS", "MEMORY", "SM")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("status", help=HELP, description=HELP + " (from the GPU objects).")
    p.add_argument(
        "--kubeconfig",
        help="kubeconfig file (else $KUBECONFIG, else ~/.kube/config, else in-cluster)",
    )
    p.add_argument("--node", help="only the GPUs of this node")
    p.add_argument(
        "--idle",
        action="store_true",
        help="only the shares the controller reports idle (measured usage under its idle "
        "threshold of what they reserved for its idle period; nothing is evicted)",
    )
    add_output_flag(p)
    p.set_defaults(run=run)


def list_gpu_objects(kubeconfig: str | None) -> list[Obj]:
    """Every GPU object of the cluster."""
    # The API client is loaded only when the command runs (not for ``status --help``).
    from sharegpu.kube.rest import KubeApiError, KubeConfigError, KubeRest, load_api_client

    try:
        api = load_api_client(kubeconfig, use_home=True)
    except KubeConfigError as exc:
        raise CliError(str(exc)) from None
    try:
        items = KubeRest(api).request("GET", GPUS_PATH).get("items") or []
    except KubeApiError as exc:
        if exc.status == 404:
            raise CliError(
                f"the cluster serves no {names.GPU_CRD_NAME} (is the sharegpu chart installed?)"
            ) from None
        raise CliError(f"cannot list GPU objects: {exc}") from None
    finally:
        api.close()
    return [dict(i) for i in items if isinstance(i, dict)]


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _gpu_key(obj: Obj) -> tuple[str, str]:
    """(node, index) of a GPU object, as :func:`sharegpuctl.cli.gpurows.gpu_rows` shows them."""
    spec = _mapping(obj.get("spec"))
    return str(spec.get("node", "")), str(spec.get("index", ""))


def overcommitted_condition(obj: Obj) -> dict[str, Any] | None:
    """The GPU object's ``Overcommitted`` condition, None when it has none."""
    for condition in _list(_mapping(obj.get("status")).get("conditions")):
        if isinstance(condition, dict) and condition.get("type") == names.CONDITION_OVERCOMMITTED:
            return condition
    return None


def _condition_cell(condition: dict[str, Any] | None) -> str:
    """``True``/``False`` of the condition; ``-`` without one (nothing measured)."""
    return "-" if condition is None else str(condition.get("status", "?"))


def _memory(value: Any) -> str:
    """A quantity as a short size (``12.5Gi``); ``?`` when it is not a quantity."""
    try:
        return format_bytes_human(quantity_int(value))
    except (QuantityError, TypeError, ValueError):
        return "?"


def _percent(value: Any) -> str:
    return f"{value}%" if isinstance(value, int) and not isinstance(value, bool) else "-"


def usage_rows(gpu_objects: list[Obj]) -> list[dict[str, Any]]:
    """One row per measured allocation (keys: :data:`USAGE_COLUMNS`), sorted by node, GPU
    index, claim and share, plus ``usage``: the allocation's measurement as the object holds it.

    SHARE is the allocation's consumable-capacity share ID, else its device (a whole GPU or a
    partition); OVERCOMMITTED lists what the share uses beyond its reservation, ``-`` for none.
    """
    keyed: list[tuple[tuple[str, int, str, str], dict[str, Any]]] = []
    for obj in gpu_objects:
        node, index = _gpu_key(obj)
        for a in _list(_mapping(obj.get("status")).get("allocations")):
            usage = _mapping(a).get("usage")
            if not isinstance(usage, dict):
                continue
            claim = f"{a.get('claimNamespace', '?')}/{a.get('claimName', '?')}"
            share = str(a.get("shareID") or a.get("device") or "-")
            over = [str(o) for o in _list(usage.get("overcommitted"))]
            row = {
                "NODE": node,
                "GPU": index,
                "CLAIM": claim,
                "SHARE": share,
                "MEMORY": f"{_memory(usage.get('usedMemory'))}/{_memory(a.get('memory'))}",
                "SM": f"{_percent(usage.get('smUtilization'))}/{_percent(a.get('cores'))}",
                "PROCESSES": str(usage.get("processes", "?")),
                OVERCOMMITTED: ",".join(over) or "-",
                "usage": usage,
            }
            order = int(index) if index.isdigit() else -1
            keyed.append(((node, order, claim, share), row))
    return [row for _, row in sorted(keyed, key=lambda k: k[0])]


def idle_rows(gpu_objects: list[Obj]) -> list[dict[str, Any]]:
    """One row per allocation the controller marked idle (``status.allocations[].idle``; keys:
    :data:`IDLE_COLUMNS`), sorted by node, GPU index, claim and share, plus ``message``: the
    GPU's ``SharesIdle`` condition message (the rule it applied)."""
    keyed: list[tuple[tuple[str, int, str, str], dict[str, Any]]] = []
    for obj in gpu_objects:
        node, index = _gpu_key(obj)
        status = _mapping(obj.get("status"))
        condition = next(
            (
                c
                for c in _list(status.get("conditions"))
                if isinstance(c, dict) and c.get("type") == names.CONDITION_SHARES_IDLE
            ),
            {},
        )
        for a in _list(status.get("allocations")):
            a = _mapping(a)
            if a.get("idle") is not True:
                continue
            usage = _mapping(a.get("usage"))
            claim = f"{a.get('claimNamespace', '?')}/{a.get('claimName', '?')}"
            share = str(a.get("shareID") or a.get("device") or "-")
            pods = [str(_mapping(p).get("name", "?")) for p in _list(a.get("pods"))]
            row = {
                "NODE": node,
                "GPU": index,
                "CLAIM": claim,
                "SHARE": share,
                "PODS": ",".join(pods) or "-",
                "MEMORY": f"{_memory(usage.get('usedMemory'))}/{_memory(a.get('memory'))}",
                "SM": f"{_percent(usage.get('smUtilization'))}/{_percent(a.get('cores'))}",
                "message": str(condition.get("message", "")),
            }
            order = int(index) if index.isdigit() else -1
            keyed.append(((node, order, claim, share), row))
    return [row for _, row in sorted(keyed, key=lambda k: k[0])]


def run(args: argparse.Namespace) -> int:
    objects = list_gpu_objects(args.kubeconfig)
    if args.node:
        objects = [o for o in objects if (o.get("spec") or {}).get("node") == args.node]
    if args.idle:
        idle = idle_rows(objects)
        table = Table(list(IDLE_COLUMNS), title=f"{len(idle)} idle share(s)")
        for row in idle:
            table.add(*(row[c] for c in IDLE_COLUMNS))
        emit({"idle": idle}, [table], resolve_format(args.output))
        return EXIT_OK
    conditions = {_gpu_key(o): overcommitted_condition(o) for o in objects}
    rows: list[dict[str, Any]] = []
    for row in gpu_rows(objects):
        condition = conditions.get((row["NODE"], row["GPU"]))
        rows.append({**row, OVERCOMMITTED: _condition_cell(condition), "overcommitted": condition})
    where = f"node {args.node}" if args.node else "the cluster"
    table = Table([*COLUMNS, OVERCOMMITTED], title=f"{len(rows)} GPU(s) in {where}")
    for row in rows:
        table.add(*(row[c] for c in (*COLUMNS, OVERCOMMITTED)))
    usage = usage_rows(objects)
    usage_table = Table(list(USAGE_COLUMNS), title=f"{len(usage)} measured allocation(s)")
    for u in usage:
        usage_table.add(*(u[c] for c in USAGE_COLUMNS))
    data = {"gpus": rows, "usage": usage, "objects": objects}
    emit(data, [table, usage_table], resolve_format(args.output))
    return EXIT_OK
