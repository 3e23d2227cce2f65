"""The plots of docs/performance.md, drawn with matplotlib from the benches' JSON figures.

- ``podstart-cdf.png``: the create->Running latency CDF of each shape (:mod:`bench.podstart`),
  sequential and burst phases side by side on a log scale, the Go test driver's shape drawn
  dashed and the MPS daemon pods' own start (shape c) dotted;
- ``sched-throughput.png``: bound pods/s per batch and node count (:mod:`bench.schedthroughput`),
  with upstream's CI thresholds and the 40 pods/s target as horizontal lines.

Run: ``python -m bench.plots [--results bench/results] [--out docs/img]`` (``make bench
PART=plots``). A missing JSON file skips its plot, saying so.
"""

from __future__ import annotations

import argparse
import json
import sys
from math import nan
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

RESULTS = Path("bench/results")
OUT = Path("docs/img")


def podstart_cdf(figures: dict[str, Any], out: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, phase in zip(axes, ("sequential", "burst"), strict=True):
        for key, shape in sorted(figures["shapes"].items()):
            if "not_measured" in shape:
                continue
            values = sorted(shape[phase]["values"])
            if not values:
                continue
            ys = [(i + 1) / len(values) for i in range(len(values))]
            style = "--" if key == "e" else "-"
            ax.step(
                [v * 1000 for v in values],
                ys,
                style,
                where="post",
                label=f"({key}) {shape['title']}",
            )
        daemon = figures["shapes"].get("c", {}).get("daemon_start", {}).get(phase)
        if daemon and daemon["values"]:
            values = sorted(daemon["values"])
            ax.step(
                [v * 1000 for v in values],
                [(i + 1) / len(values) for i in range(len(values))],
                ":",
                where="post",
                label="(c) its MPS daemon pod alone: created -> Running",
            )
        ax.set_title(
            f"{phase}: "
            + (
                "one pod at a time"
                if phase == "sequential"
                else f"bursts of {figures['args']['burst']}"
            )
        )
        # Log scale: the MPS shape's daemon start is seconds, the other shapes' differences ms.
        ax.set_xscale("log")
        ax.set_xlabel("pod create -> Running (ms, log scale)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of pods")
    axes[0].legend(loc="lower right", fontsize=7)
    fig.suptitle(
        f"Pod start on a real kubelet, Kubernetes {figures['kubernetes']} "
        f"({figures['machine']['cpus']} shared CPUs)"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def sched_bars(figures: dict[str, Any], out: Path) -> None:
    results = figures["results"]
    batches = list(dict.fromkeys(r["batch"] for r in results))
    nodes = sorted({r["nodes"] for r in results})
    width = 0.8 / max(1, len(nodes))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for j, n in enumerate(nodes):
        values = [
            next((r["pods_per_s"] for r in results if r["nodes"] == n and r["batch"] == b), nan)
            for b in batches
        ]
        xs = [i + (j - (len(nodes) - 1) / 2) * width for i in range(len(batches))]
        bars = ax.bar(xs, values, width, label=f"{n} nodes")
        labels = [f"{v:.0f}" if v == v else "not measured" for v in values]
        ax.bar_label(bars, labels=labels, fontsize=8)
    for name, value in figures["upstream_thresholds"].items():
        ax.axhline(value, linestyle=":", color="grey")
        ax.text(
            len(batches) - 0.5,
            value,
            f" upstream CI {name.split('/')[1]}: {value:.0f}",
            fontsize=7,
            va="bottom",
            ha="right",
        )
    ax.axhline(40, linestyle="--", color="red")
    ax.text(-0.5, 40, " target 40 pods/s at 500 nodes", fontsize=7, va="bottom", color="red")
    ax.set_xticks(range(len(batches)), batches)
    ax.set_ylabel("bound pods/s")
    ax.set_title(
        f"kube-scheduler {figures['kubernetes']}: throughput by claim shape "
        f"({figures['machine']['cpus']} shared CPUs)"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    podstart = args.results / "podstart.json"
    if podstart.exists():
        podstart_cdf(json.loads(podstart.read_text()), args.out / "podstart-cdf.png")
        print(f"drew {args.out / 'podstart-cdf.png'}")
    else:
        print(f"{podstart} not found: podstart-cdf.png not drawn")
    sched = sched_figures(args.results)
    if sched is not None:
        sched_bars(sched, args.out / "sched-throughput.png")
        print(f"drew {args.out / 'sched-throughput.png'}")
    else:
        print(f"no {args.results}/schedthroughput*.json: sched-throughput.png not drawn")
    return 0


def sched_figures(results: Path) -> dict[str, Any] | None:
    """The batches of every ``schedthroughput*.json`` (runs of some node counts or batches each),
    a later file's batch replacing an earlier one of the same node count and shape."""
    paths = sorted(results.glob("schedthroughput*.json"))
    if not paths:
        return None
    merged: dict[tuple[int, str], dict[str, Any]] = {}
    figures: dict[str, Any] = {}
    for path in paths:
        figures = json.loads(path.read_text())
        for r in figures["results"]:
            merged[(r["nodes"], r["batch"])] = r
    return {**figures, "results": list(merged.values())}


if __name__ == "__main__":
    sys.exit(main())
