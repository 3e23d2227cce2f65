"""``sharegpu status``: per-GPU usage from the controller's ``GPU`` objects.

Reads ``resource.sharegpu.dev/v1alpha1`` ``gpus`` (cluster-scoped) and prints the rows of
:func:`controller.status.gpu_rows` (the columns ``kubectl get gpus`` shows, plus the pods).
"""

from __future__ import annotations

import argparse
from typing import Any, Final

from api import names
from controller.status import COLUMNS, gpu_rows
from sharegpu.cli.common import EXIT_OK, CliError, Obj, add_output_flag
from sharegpu.cli.output import Table, emit, resolve_format
from sharegpu.kube.rest import KubeApiError, KubeConfigError, KubeRest, load_api_client

HELP = "show every GPU's model, health, allocated cores and memory, claims and pods"
GPUS_PATH: Final = f"/apis/{names.GROUP_VERSION}/{names.GPU_PLURAL}"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("status", help=HELP, description=HELP + " (from the GPU objects).")
    p.add_argument(
        "--kubeconfig",
        help="kubeconfig file (else $KUBECONFIG, else ~/.kube/config, else in-cluster)",
    )
    p.add_argument("--node", help="only the GPUs of this node")
    add_output_flag(p)
    p.set_defaults(run=run)


def list_gpu_objects(kubeconfig: str | None) -> list[Obj]:
    """Every GPU object of the cluster."""
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


def run(args: argparse.Namespace) -> int:
    objects = list_gpu_objects(args.kubeconfig)
    if args.node:
        objects = [o for o in objects if (o.get("spec") or {}).get("node") == args.node]
    rows = gpu_rows(objects)
    where = f"node {args.node}" if args.node else "the cluster"
    table = Table(list(COLUMNS), title=f"{len(rows)} GPU(s) in {where}")
    for row in rows:
        table.add(*(row[c] for c in COLUMNS))
    data = {"gpus": rows, "objects": objects}
    emit(data, [table], resolve_format(args.output))
    return EXIT_OK
