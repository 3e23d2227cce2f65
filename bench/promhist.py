"""Histograms of a Prometheus text exposition (a kubelet's ``/metrics``): read, subtract, quantile.

A :class:`Histogram` is one series (a metric name and one label set): cumulative bucket counts by
upper bound, sum and count. Two scrapes of the same series subtract into the observations made
between them (:meth:`Histogram.minus`); with exactly one observation in between, its ``sum`` is
that observation's exact value. :meth:`Histogram.quantile` interpolates linearly inside a bucket
as Prometheus' ``histogram_quantile`` does, so it is only as fine as the buckets.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Labels = tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Histogram:
    """One histogram series: cumulative ``buckets`` (upper bound -> count, +Inf included)."""

    buckets: Mapping[float, float]
    sum: float
    count: float

    def minus(self, earlier: Histogram | None) -> Histogram:
        """The observations made since ``earlier`` (None: since the start)."""
        if earlier is None:
            return self
        return Histogram(
            {le: n - earlier.buckets.get(le, 0.0) for le, n in self.buckets.items()},
            self.sum - earlier.sum,
            self.count - earlier.count,
        )

    def plus(self, other: Histogram) -> Histogram:
        """The observations of both."""
        bounds = set(self.buckets) | set(other.buckets)
        return Histogram(
            {le: self.buckets.get(le, 0.0) + other.buckets.get(le, 0.0) for le in bounds},
            self.sum + other.sum,
            self.count + other.count,
        )

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1) as ``histogram_quantile`` computes it; NaN when empty. A
        quantile in the +Inf bucket is the highest finite bound."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for le in sorted(self.buckets):
            n = self.buckets[le]
            if n >= rank:
                if math.isinf(le):
                    return lower_bound
                if n == lower_count:
                    return le
                return lower_bound + (le - lower_bound) * (rank - lower_count) / (n - lower_count)
            lower_bound, lower_count = le, n
        return lower_bound

    @property
    def lowest_bound(self) -> float:
        """The upper bound of the first bucket (the finest the histogram resolves)."""
        return min(self.buckets)


def histograms(text: str, name: str) -> dict[Labels, Histogram]:
    """Every series of histogram ``name`` in ``text``, by its label set (``le`` left out)."""
    buckets: dict[Labels, dict[float, float]] = {}
    sums: dict[Labels, float] = {}
    counts: dict[Labels, float] = {}
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = _LINE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match.group("labels") or ""))
        value = float(match.group("value"))
        metric = match.group("name")
        if metric == f"{name}_bucket" and "le" in labels:
            le = float(labels.pop("le"))
            buckets.setdefault(_key(labels), {})[le] = value
        elif metric == f"{name}_sum":
            sums[_key(labels)] = value
        elif metric == f"{name}_count":
            counts[_key(labels)] = value
    return {
        key: Histogram(b, sums.get(key, 0.0), counts.get(key, 0.0)) for key, b in buckets.items()
    }


def _key(labels: Mapping[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


def select(series: Mapping[Labels, Histogram], **wanted: str) -> Histogram | None:
    """The sum of the series whose labels include every ``wanted`` pair (None: no such series)."""
    found = [h for labels, h in series.items() if set(wanted.items()) <= set(labels)]
    if not found:
        return None
    total = found[0]
    for h in found[1:]:
        total = total.plus(h)
    return total
