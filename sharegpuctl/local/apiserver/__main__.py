"""Run the in-process API server as a standalone process.

``python -m sharegpuctl.local.apiserver [--port N] [--kubeconfig PATH]`` serves until
SIGINT/SIGTERM; it prints the URL on stdout once it is listening (and writes the kubeconfig
first, when asked).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from sharegpuctl.local.apiserver.server import KubeAPIServer


def build_parser() -> argparse.ArgumentParser:
    """The command-line options."""
    parser = argparse.ArgumentParser(
        prog="python -m sharegpuctl.local.apiserver",
        description="A small in-process Kubernetes API server for tests and demos.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default: any free)")
    parser.add_argument("--kubeconfig", help="write a kubeconfig for the server to this path")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Serve until a termination signal arrives; returns the exit code."""
    args = build_parser().parse_args(argv)
    done = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        server = KubeAPIServer(host=args.host, port=args.port).start()
    except OSError as exc:
        print(f"cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        if args.kubeconfig:
            server.write_kubeconfig(args.kubeconfig)
        print(server.url, flush=True)
        done.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
