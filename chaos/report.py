"""A chaos run's report files: one JSON result (scenario, seed, schedule, every checker's
output) and one PNG (acknowledgements and failures per second, fault windows shaded). Writes
files only; it neither runs nor judges anything (chaos/checkers.py does)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import matplotlib

matplotlib.use("Agg")  # CI machines have no display; must come before pyplot is imported
import matplotlib.pyplot as plt

from raftmq.chaos.checkers import CheckReport
from raftmq.chaos.history import Op, Window

RESULT_FORMAT = 1  # bumped when a key of the result file changes meaning
BIN_S = 0.5
MAX_BINS = 100_000  # ~14 h at 0.5 s: more means the history mixes clocks, not a long run
FAULT_COLOURS = ("tab:orange", "tab:purple", "tab:olive", "tab:cyan", "tab:pink", "tab:brown")


@overload
def write_result(
    path: Path,
    scenario: str,
    seed: int,
    schedule: Mapping[str, Any],
    report: CheckReport,
    /,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]: ...


@overload
def write_result(
    path: Path,
    schedule: Mapping[str, Any],
    report: CheckReport,
    /,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]: ...


def write_result(
    path: Path, /, *args: Any, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Writes the run's result as one JSON document and returns it:
    `{"format", "scenario", "seed", "valid", "verdict", "ordered", "schedule", "queue",
    "order", "availability", "latency", **extra}` (the checker sections as
    CheckReport.to_json() gives them; extra's keys may not shadow those). Called as
    write_result(path, scenario, seed, schedule, report, extra), or as
    write_result(path, schedule, report, extra) taking scenario and seed from the report.
    A report checked under another scenario or seed is refused (ValueError). Written to a
    temporary file and renamed, so a reader never sees half a result."""
    # Two call shapes, told apart by position: the runner written first passes no scenario
    # and seed (the report carries them).
    if len(args) in (4, 5) and isinstance(args[0], str):
        scenario, seed, schedule, report, *rest = args
    elif len(args) in (2, 3) and isinstance(args[1], CheckReport):
        schedule, report, *rest = args
        scenario, seed = report.scenario, report.seed
    else:
        raise TypeError(
            "write_result(path, scenario, seed, schedule, report, extra) "
            "or write_result(path, schedule, report, extra)"
        )
    if rest:
        if extra is not None:
            raise TypeError("extra given twice")
        extra = rest[0]
    if not isinstance(report, CheckReport):
        raise TypeError(f"report must be a CheckReport, not {type(report).__name__}")
    if report.scenario and report.scenario != scenario:
        raise ValueError(f"report is for scenario {report.scenario!r}, not {scenario!r}")
    if report.seed is not None and report.seed != seed:
        raise ValueError(f"report is for seed {report.seed}, not {seed}")
    checks = report.to_json()
    doc: dict[str, Any] = {
        "format": RESULT_FORMAT,
        "scenario": scenario,
        "seed": seed,
        "valid": checks["valid"],
        "verdict": checks["verdict"],
        "ordered": checks["ordered"],
        "schedule": dict(schedule),
        **{k: checks[k] for k in ("queue", "order", "availability", "latency")},
    }
    clash = sorted(set(doc) & set(extra or {}))
    if clash:
        raise ValueError(f"extra would overwrite {', '.join(clash)}")
    doc |= dict(extra or {})
    text = json.dumps(doc, indent=1, allow_nan=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)
    return doc


def per_second(times: Sequence[float], t0: float, t1: float) -> tuple[list[float], list[float]]:
    """Bins of BIN_S seconds covering [t0, t1]: their start times relative to t0, and the events
    of `times` in each, scaled to events per second (events outside [t0, t1] dropped)."""
    bins = math.floor((t1 - t0) / BIN_S) + 1
    if bins > MAX_BINS:
        raise ValueError(
            f"the history spans {t1 - t0:.0f} s: more than {MAX_BINS} bins of {BIN_S} s "
            "(are two clocks mixed?)"
        )
    counts = [0] * max(bins, 0)
    for t in times:
        i = math.floor((t - t0) / BIN_S)
        if 0 <= i < bins:
            counts[i] += 1
    return [i * BIN_S for i in range(len(counts))], [c / BIN_S for c in counts]


def plot(ops: Sequence[Op], windows: Sequence[Window], path: Path, title: str) -> None:
    """Writes a PNG: acknowledged sends per second (send ok completions, blue bars) and
    failed or unknown sends per second (fail and info completions, red bars) in BIN_S bins,
    deliveries per second as a green line, each fault window shaded and labelled with its
    name. x: seconds since the history's first op. An empty history raises ValueError (there is
    no time axis to draw)."""
    if not ops:
        raise ValueError("an empty history has nothing to plot")
    t0 = min(op.time for op in ops)
    t1 = max(op.time for op in ops)
    for w in windows:
        t1 = max(t1, w.start if w.stop is None else w.stop)
    acks = [op.time for op in ops if op.f == "send" and op.type == "ok"]
    bad = [op.time for op in ops if op.f == "send" and op.type in ("fail", "info")]
    recv = [op.time for op in ops if op.f == "recv" and op.type == "ok"]
    xs, ack_rate = per_second(acks, t0, t1)  # refuses a span of mixed clocks before drawing
    fig, ax = plt.subplots(figsize=(11, 4))
    try:
        ax.bar(
            xs,
            ack_rate,
            width=BIN_S,
            align="edge",
            color="tab:blue",
            alpha=0.7,
            label="acknowledged/s",
            zorder=2,
        )
        ax.bar(
            xs,
            per_second(bad, t0, t1)[1],
            width=BIN_S,
            align="edge",
            color="tab:red",
            label="failed or unknown/s",
            zorder=2,
        )
        ax.plot(
            [x + BIN_S / 2 for x in xs],
            per_second(recv, t0, t1)[1],
            color="tab:green",
            linewidth=1,
            label="delivered/s",
            zorder=3,
        )
        # Headroom above the bars for the fault names; shading goes behind the bars.
        top = max(ax.get_ylim()[1], 1.0) * 1.25
        ax.set_ylim(0, top)
        for n, w in enumerate(windows):
            colour = FAULT_COLOURS[n % len(FAULT_COLOURS)]
            stop = t1 if w.stop is None else w.stop
            ax.axvspan(w.start - t0, stop - t0, color=colour, alpha=0.3, zorder=0)
            label = w.fault if w.stop is not None else f"{w.fault} (not healed)"
            # Labels of neighbouring windows are staggered so they do not print over each other.
            y = top * (0.98 - 0.06 * (n % 3))
            ax.text(w.start - t0, y, label, fontsize=8, va="top", color=colour, zorder=3)
        ax.set_xlim(0, max(t1 - t0, BIN_S))
        ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
        ax.set_xlabel("seconds since the first op")
        ax.set_ylabel("per second")
        ax.set_title(title)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        fig.savefig(tmp, format="png", dpi=90, bbox_inches="tight")
        tmp.replace(path)
    finally:
        plt.close(fig)
