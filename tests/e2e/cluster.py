"""A local cluster to try sharegpu's control-plane side with kubectl, no docker needed:
``python -m tests.e2e.cluster`` (``make local-cluster``).

It starts what ``make e2e`` tests (etcd, kube-apiserver, kube-controller-manager, kube-scheduler
from the cached upstream binaries, the CRDs, the controller with the chart's RBAC and its webhook),
publishes a ResourceSlice of mock GPUs for one node, prints the ``KUBECONFIG`` to use and runs
until Ctrl-C or SIGTERM, then stops every process it started by its PID.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

import yaml

from tests.controller.helpers import node_slice
from tests.deploy.helpers import helm_binary
from tests.e2e import driver
from tests.e2e.binaries import CONTROL_PLANE, bin_dir, missing_binaries, missing_prerequisites
from tests.e2e.controlplane import ControlPlane
from tests.e2e.processes import StepFailed


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``python -m tests.e2e.cluster``."""
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.cluster", description=__doc__)
    parser.add_argument("--work", type=Path, help="work directory (default: a new temporary one)")
    parser.add_argument("--node", default="local-node", help="node of the mock GPUs")
    parser.add_argument(
        "--gpus", type=int, default=4, choices=range(0, 9), metavar="0..8", help="mock GPUs"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the local cluster until interrupted; returns the exit code."""
    args = build_parser().parse_args(argv)
    missing = missing_prerequisites()
    absent = missing_binaries(CONTROL_PLANE[:3])
    helm = helm_binary()
    if missing or absent or helm is None:
        problems = [*missing]
        if absent:
            problems.append(
                f"binaries not built: {', '.join(absent)} (make local-cluster builds them)"
            )
        if helm is None:
            problems.append("helm not found (bash tests/install-helm.sh installs it)")
        print("local cluster cannot start: " + "; ".join(problems), file=sys.stderr)
        return 1
    work = args.work or Path(tempfile.mkdtemp(prefix="sharegpu-cluster-"))
    work.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _stop)
    plane = ControlPlane(bin_dir(), work)
    try:
        plane.start()
        driver.apply_crds(plane)
        chart = driver.render_chart(helm)
        controller = driver.start_controller(plane, chart)
        driver.register_webhook(plane, controller, chart)
        if args.gpus:
            plane.kubectl(
                "apply", "-f", "-", stdin=yaml.safe_dump(node_slice(args.node, args.gpus))
            )
        print(
            f"local cluster running (logs in {work / 'logs'}); in another shell:\n"
            f"  export KUBECONFIG={plane.admin_kubeconfig} PATH={bin_dir()}:$PATH\n"
            "  kubectl get gpus; kubectl get resourceslices; kubectl explain gpus.spec\n"
            "Ctrl-C stops it.",
            flush=True,
        )
        while True:
            plane.check_running("local cluster")
            time.sleep(2)
    except KeyboardInterrupt:
        return 0
    except StepFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        plane.stop()


if __name__ == "__main__":
    sys.exit(main())
