"""An informer of a collection the API server does not serve, told to count it as empty."""

from __future__ import annotations

from typing import Any

from sharegpu.kube.informer import Backoff, Informer
from sharegpu.kube.rest import KubeRest, resource_path

UNSERVED = resource_path("example.com", "v1", "nothings")


def test_unserved_collection_counts_as_empty(kube: KubeRest) -> None:
    events: list[Any] = []
    relists: list[int] = []
    informer = Informer(
        kube,
        UNSERVED,
        lambda *e: events.append(e),
        name="nothings",
        backoff=Backoff(initial=0.01, cap=0.01),
        on_relist=lambda: relists.append(1),
        unserved_is_empty=True,
    )
    informer.start()
    try:
        assert informer.synced.wait(30.0)
        assert informer.store == {} and events == []
    finally:
        informer.stop()
    assert relists


def test_without_the_option_an_unserved_collection_never_syncs(kube: KubeRest) -> None:
    informer = Informer(
        kube,
        UNSERVED,
        lambda *e: None,
        name="nothings",
        backoff=Backoff(initial=0.01, cap=0.01),
    )
    informer.start()
    try:
        assert not informer.synced.wait(0.5)
        assert informer.relists == 0
    finally:
        informer.stop()
