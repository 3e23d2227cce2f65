"""The pod watch of the pod-start bench (bench/podwatch.py): the start of a pod that someone
else deletes (the MPS daemon pods the plugin deletes on unprepare) is kept, and a pod created
before the watch began is never taken for one created during it."""

from __future__ import annotations

from typing import Any, cast

from bench.podwatch import PodWatch


def _pod(name: str, uid: str, phase: str = "Pending", node: str = "") -> dict[str, object]:
    return {
        "metadata": {"name": name, "uid": uid},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


def test_a_deleted_pods_start_is_kept_and_an_older_pod_is_not_counted() -> None:
    watch = PodWatch(cast(Any, None), "ns", "mps.sharegpu.dev/daemon")
    watch._note("ADDED", _pod("daemon-1", "u1"))
    watch._note("MODIFIED", _pod("daemon-1", "u1", "Running", "node"))
    # Created before the watch began: its first event is not ADDED.
    watch._note("MODIFIED", _pod("daemon-0", "u0", "Running", "node"))
    added, running = watch.started["u1"]
    assert running >= added
    watch._note("DELETED", _pod("daemon-1", "u1", "Running", "node"))
    assert "daemon-1" not in watch.running  # a name may come back
    assert set(watch.started) == {"u1"}
    assert watch.started["u1"] == (added, running)
    # The same name again, a new pod: a start of its own.
    watch._note("ADDED", _pod("daemon-1", "u2"))
    watch._note("MODIFIED", _pod("daemon-1", "u2", "Running", "node"))
    assert set(watch.started) == {"u1", "u2"}
