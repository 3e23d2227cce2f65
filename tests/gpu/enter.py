"""Enter an emulated container and run a command in it (run as root inside ``unshare --mount``).

Usage: ``unshare --mount --propagation private -- python enter.py PLAN_JSON`` where the plan is
:meth:`tests.gpu.container.ContainerPlan.to_json`'s output. It makes every mount propagation
private, applies the bind mounts in order, drops to the plan's UID (and its GID, no supplementary
groups), and executes ``argv`` with exactly the plan's environment. Standalone: it imports no
project module, since it runs with a bare environment.

Exit status 70 and one line on stderr when the plan cannot be applied; otherwise that of argv.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any, Final

MS_RDONLY: Final = 0x1
MS_REMOUNT: Final = 0x20
MS_BIND: Final = 0x1000
MS_REC: Final = 0x4000
MS_PRIVATE: Final = 0x40000
EXIT_SETUP: Final = 70


class SetupError(Exception):
    """The plan could not be applied."""


def _mount(libc: Any, source: str | None, target: str, flags: int) -> None:
    src = source.encode() if source is not None else None
    if libc.mount(src, target.encode(), None, ctypes.c_ulong(flags), None) != 0:
        err = ctypes.get_errno()
        raise SetupError(f"mount {source} -> {target} (flags {flags:#x}): {os.strerror(err)}")


def apply_mounts(libc: Any, mounts: list[dict[str, Any]]) -> None:
    _mount(libc, None, "/", MS_REC | MS_PRIVATE)
    for m in mounts:
        flags = MS_BIND | (MS_REC if m["recursive"] else 0)
        _mount(libc, m["source"], m["target"], flags)
        if m["read_only"]:
            _mount(libc, None, m["target"], MS_REMOUNT | MS_BIND | MS_RDONLY)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: enter.py PLAN_JSON", file=sys.stderr)
        return EXIT_SETUP
    try:
        plan = json.loads(argv[1])
        libc = ctypes.CDLL(None, use_errno=True)
        apply_mounts(libc, plan["mounts"])
        uid = int(plan["uid"])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        command = [str(a) for a in plan["argv"]]
        env = {str(k): str(v) for k, v in plan["env"].items()}
        os.execve(command[0], command, env)
    except (SetupError, OSError, KeyError, TypeError, ValueError) as exc:
        print(f"enter.py: cannot set up the container: {exc}", file=sys.stderr)
        return EXIT_SETUP


if __name__ == "__main__":
    sys.exit(main(sys.argv))
