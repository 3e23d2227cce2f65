"""Hostile NodePrepareResources / NodeUnprepareResources calls through the real socket.

Property (hypothesis): whatever a call carries (claim references of any text, duplicates,
claims whose allocation names other drivers, nodes, pools, devices, absurd capacities or share
IDs), every claim gets an answer of its own (devices, or an error that names the claim), an
honest claim in the same call is prepared, no file outside the plugin's own directories is
touched, the daemon answers the next call, and its threads stay bounded.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeletplugin.kubelet.preparer import ClaimRef
from sharegpuctl.local.kubelet import KubeletSim
from tests.kubeletplugin.kubelet.helpers import DRIVER, Dirs, running_server, socket_dirs
from tests.kubeletplugin.prepare import helpers as h

GI = 1024**3

#: Text an attacker may put where a UID, namespace, name, pool, device or share ID goes.
HOSTILE_TEXT = st.one_of(
    st.sampled_from(
        [
            "",
            ".",
            "..",
            "../../victim",
            "/etc/passwd",
            "x/../../victim",
            "a" * 300,
            "nvidia.com/gpu=all",
            "gpu-0\x00",
            "GPU-0",
            "gpu-0/../gpu-1",
            "\u202egpu-0",
        ]
    ),
    st.text(min_size=0, max_size=40),
)
QUANTITY = st.one_of(
    st.sampled_from(["1e1500000", "-1", "abc", "1Gi", "0", "9Ei", " 1", "NaN", "1e-1500000"]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=12),
)


@st.composite
def hostile_result(draw: st.DrawFn) -> dict[str, Any]:
    result: dict[str, Any] = {
        "request": draw(st.one_of(st.just("gpu"), HOSTILE_TEXT)),
        "driver": draw(st.one_of(st.just(h.DRIVER), st.just("other.example.com"), HOSTILE_TEXT)),
        "pool": draw(st.one_of(st.just(h.NODE), st.just("another-node"), HOSTILE_TEXT)),
        "device": draw(st.one_of(st.sampled_from(["gpu-0", "gpu-1", "gpu-99"]), HOSTILE_TEXT)),
    }
    if draw(st.booleans()):
        result["shareID"] = draw(st.one_of(st.just(str(uuid.uuid4())), HOSTILE_TEXT))
        result["consumedCapacity"] = {
            draw(st.sampled_from(["cores", "memory", "bogus"])): draw(QUANTITY) for _ in range(2)
        }
    if draw(st.booleans()):
        result["adminAccess"] = draw(st.one_of(st.booleans(), st.integers(), HOSTILE_TEXT))
    return result


@st.composite
def hostile_claim(draw: st.DrawFn) -> tuple[ClaimRef, dict[str, Any] | None]:
    """A reference kubelet might send, and the object the API server answers for it (None:
    not found)."""
    name = draw(st.one_of(st.sampled_from(["c", "c-1"]), HOSTILE_TEXT))
    namespace = draw(st.one_of(st.just("default"), HOSTILE_TEXT))
    uid = draw(st.one_of(st.just(str(uuid.uuid4())), HOSTILE_TEXT))
    obj = h.claim(name, [draw(hostile_result()) for _ in range(draw(st.integers(0, 3)))], uid=uid)
    obj["metadata"]["namespace"] = namespace
    return ClaimRef(namespace=namespace, uid=uid, name=name), draw(st.sampled_from([obj, None]))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def plugin_dirs() -> Iterator[Dirs]:
    with socket_dirs() as d:
        yield d


def test_hostile_prepare_calls_get_per_claim_answers_and_touch_nothing_outside(
    plugin_dirs: Dirs,
) -> None:
    (plugin_dirs.root / "node").mkdir()
    node = h.Node(plugin_dirs.root / "node")
    victim = plugin_dirs.root / "victim"
    victim.mkdir()
    (victim / "keep").write_text("keep me")
    claims = h.FakeClaims()
    state = node.state(claims)
    outside_before = _files(victim)
    with (
        running_server(plugin_dirs, preparer=state) as _,
        KubeletSim(plugin_dirs.registry) as kubelet,
    ):
        plugin = kubelet.register(DRIVER)
        threads_before = threading.active_count()

        @settings(
            max_examples=150,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(st.lists(hostile_claim(), min_size=1, max_size=4))
        def call(hostile: list[tuple[ClaimRef, dict[str, Any] | None]]) -> None:
            claims.claims.clear()
            honest = h.claim(
                "honest", [h.result("gpu", "gpu-2", share={"cores": 10, "memory": GI})]
            )
            claims.add(honest)
            for _, obj in hostile:
                if obj is not None:
                    claims.claims[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
            refs = [ref for ref, _ in hostile] + [h.ref(honest)]
            answers = plugin.prepare(refs)
            assert answers[honest["metadata"]["uid"]].error == ""
            for ref, _ in hostile:
                answer = answers.get(ref.uid)
                assert answer is not None, f"no answer for {ref.uid!r}"
                assert answer.error or answer.devices
            # Unprepare everything again: the state must stay consistent and answer.
            unprepared = plugin.unprepare(refs)
            assert unprepared[honest["metadata"]["uid"]] == ""
            assert _files(victim) == outside_before
            for path in plugin_dirs.root.rglob("*"):
                if path.is_dir():
                    continue
                assert path.is_relative_to(victim) or any(
                    path.is_relative_to(d)
                    for d in (node.root, plugin_dirs.registry, plugin_dirs.data)
                ), f"file outside the plugin's directories: {path}"

        call()
        assert threading.active_count() <= threads_before + 2
        # Still answering an honest claim after all of it.
        late = h.claim("late", [h.result("gpu", "gpu-3", share={"cores": 10, "memory": GI})])
        claims.add(late)
        assert plugin.prepare([h.ref(late)])[late["metadata"]["uid"]].error == ""
