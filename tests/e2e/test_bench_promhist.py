"""The kubelet-metrics histograms the pod-start bench reads (bench/promhist.py): parsed by label
set, subtracted between two scrapes, and quantiles interpolated as ``histogram_quantile`` does."""

from __future__ import annotations

import math

from bench.promhist import Histogram, histograms, select

NAME = "dra_grpc_operations_duration_seconds"
METHOD = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"


def _exposition(a: tuple[int, int, int], sum_a: float, b_count: int) -> str:
    """Two series (drivers a and b) in the text format, buckets 0.1 / 0.2 / +Inf."""
    lines = [
        f"# HELP {NAME} Duration in seconds of the DRA gRPC operations",
        f"# TYPE {NAME} histogram",
    ]
    for le, n in zip(("0.1", "0.2", "+Inf"), a, strict=True):
        lines.append(
            f'{NAME}_bucket{{driver_name="a",grpc_status_code="OK",method_name="{METHOD}",'
            f'le="{le}"}} {n}'
        )
    lines.append(
        f'{NAME}_sum{{driver_name="a",grpc_status_code="OK",method_name="{METHOD}"}} {sum_a}'
    )
    lines.append(
        f'{NAME}_count{{driver_name="a",grpc_status_code="OK",method_name="{METHOD}"}} {a[2]}'
    )
    for le in ("0.1", "0.2", "+Inf"):
        lines.append(f'{NAME}_bucket{{driver_name="b",method_name="{METHOD}",le="{le}"}} {b_count}')
    lines.append(f'{NAME}_sum{{driver_name="b",method_name="{METHOD}"}} 0.5')
    lines.append(f'{NAME}_count{{driver_name="b",method_name="{METHOD}"}} {b_count}')
    lines.append('other_metric_bucket{le="0.1"} 99')
    return "\n".join(lines) + "\n"


def test_series_are_read_by_label_set_and_subtract_to_one_observation() -> None:
    before = histograms(_exposition((3, 4, 4), 0.25, 2), NAME)
    after = histograms(_exposition((3, 5, 5), 0.40, 2), NAME)
    assert len(after) == 2
    a_before, a_after = select(before, driver_name="a"), select(after, driver_name="a")
    assert a_before is not None and a_after is not None
    delta = a_after.minus(a_before)
    assert delta.count == 1
    assert math.isclose(delta.sum, 0.15)  # the one call's exact duration
    assert delta.buckets == {0.1: 0.0, 0.2: 1.0, math.inf: 1.0}
    assert select(after, driver_name="c") is None
    assert select(after, method_name=METHOD) == a_after.plus(select(after, driver_name="b"))  # type: ignore[arg-type]


def test_quantiles_interpolate_inside_a_bucket() -> None:
    h = Histogram({0.1: 50.0, 0.2: 100.0, math.inf: 100.0}, 12.0, 100.0)
    assert math.isclose(h.quantile(0.25), 0.05)
    assert math.isclose(h.quantile(0.5), 0.1)
    assert math.isclose(h.quantile(0.99), 0.198)
    assert h.lowest_bound == 0.1
    # Above the last finite bound: that bound; empty: NaN.
    assert Histogram({0.1: 0.0, math.inf: 3.0}, 1.0, 3.0).quantile(0.5) == 0.1
    assert math.isnan(Histogram({0.1: 0.0, math.inf: 0.0}, 0.0, 0.0).quantile(0.5))
