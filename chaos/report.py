"""A chaos run's report: one JSON result (schedule, seed, every checker's output) and one
picture (acknowledgements and failures per second, fault windows shaded). Files only."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on CI machines; must precede the pyplot import
import matplotlib.pyplot as plt

from chaos.checkers import CheckReport
from chaos.history import Op, Window

BIN_S = 0.5


def write_result(
    path: Path,
    schedule: dict[str, Any],
    report: CheckReport,
    extra: dict[str, Any],
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {**report.to_json(), "schedule": schedule, **extra}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def per_second(times: Sequence[float], t0: float, t1: float) -> tuple[list[float], list[float]]:
    """Counts in BIN_S bins from t0 to t1, scaled to events per second."""
    n = max(1, int((t1 - t0) / BIN_S) + 1)
    counts = [0] * n
    for t in times:
        i = int((t - t0) / BIN_S)
        if 0 <= i < n:
            counts[i] += 1
    return [i * BIN_S for i in range(n)], [c / BIN_S for c in counts]


def plot(ops: Sequence[Op], windows: Sequence[Window], path: Path, title: str) -> None:
    if not ops:
        raise ValueError("an empty history has nothing to plot")
    t0, t1 = ops[0].time, ops[-1].time
    acks = [op.time for op in ops if op.f == "send" and op.type == "ok"]
    bad = [op.time for op in ops if op.f == "send" and op.type in ("fail", "info")]
    recv = [op.time for op in ops if op.f == "recv"]
    fig, ax = plt.subplots(figsize=(11, 4))
    try:
        for times, label, colour in (
            (acks, "acknowledged/s", "tab:blue"),
            (recv, "delivered/s", "tab:green"),
            (bad, "failed or unknown/s", "tab:red"),
        ):
            xs, ys = per_second(times, t0, t1)
            ax.step(xs, ys, where="post", label=label, color=colour, linewidth=1)
        top = ax.get_ylim()[1]
        for w in windows:
            stop = w.stop if w.stop is not None else t1
            ax.axvspan(w.start - t0, stop - t0, color="orange", alpha=0.25)
            ax.text(w.start - t0, top * 0.95, w.fault, fontsize=8, va="top")
        ax.set_xlabel("seconds since the first op")
        ax.set_ylabel("per second")
        ax.set_title(title)
        ax.legend(loc="lower right", fontsize=8)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=90, bbox_inches="tight")
    finally:
        plt.close(fig)
