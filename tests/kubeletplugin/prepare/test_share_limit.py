"""Prepare refuses a share beyond its GPU's share limit: the published slices keep the scheduler
within it; this holds for an allocation made against older slices (a node whose limit was
lowered, or a claim allocated by hand)."""

from __future__ import annotations

import dataclasses

from tests.kubeletplugin.prepare import helpers as h
from tests.kubeletplugin.sharing.helpers import GI


def test_a_share_beyond_the_gpus_limit_is_refused(node: h.Node) -> None:
    # A pre-Volta GPU: MPS serves 16 clients.
    old = [dataclasses.replace(g, cuda_compute_capability="6.0") for g in h.gpus(2)]
    claims = h.FakeClaims()
    objs = [
        h.claim(f"s{i}", [h.result("gpu", "gpu-0", share={"cores": 1, "memory": GI})])
        for i in range(17)
    ]
    other = h.claim("other", [h.result("gpu", "gpu-1", share={"cores": 1, "memory": GI})])
    claims.add(*objs, other)
    state = node.state(claims, gpu_list=old)
    outs = state.prepare([h.ref(o) for o in objs[:16]])
    assert all(o.error == "" for o in outs.values())
    last = objs[16]["metadata"]["uid"]
    error = state.prepare([h.ref(objs[16])])[last].error
    assert "already holds 16 shares and its limit is 16" in error
    # Another GPU has its own limit; a share that ends frees a place.
    assert state.prepare([h.ref(other)])[other["metadata"]["uid"]].error == ""
    first = objs[0]["metadata"]["uid"]
    assert state.unprepare([h.ref(objs[0])])[first].error == ""
    assert state.prepare([h.ref(objs[16])])[last].error == ""
