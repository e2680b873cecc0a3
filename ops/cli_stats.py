"""`raftmq stats topic T` / `raftmq stats group G`: resource reports (issue 18 item 2), messages
produced to a topic or consumed by a group per minute over a time range, as a table with TPS
and a sparkline, per minute with --per-minute, as JSON with --json, and as a PNG with --plot
(matplotlib: the `plot` extra). Everything comes from `Admin.topic_stats` / `Admin.group_stats`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from raftmq.client.admin import Admin
from raftmq.client.stats_report import MINUTE_MS, StatsReport, parse_duration_ms
from raftmq.common.errors import InvalidArgumentError
from raftmq.ops import cli_data  # the console, --namesrv and time parsing
from raftmq.ops.terminal_text import literal

SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60  # columns at most: minutes are summed into this many cells


def sparkline(counts: Sequence[int], width: int = SPARK_WIDTH) -> str:
    if not counts:
        return ""
    step = max(1, -(-len(counts) // width))
    cells = [sum(counts[i : i + step]) for i in range(0, len(counts), step)]
    top = max(cells)
    if top == 0:
        return SPARK[0] * len(cells)
    return "".join(SPARK[min(len(SPARK) - 1, c * len(SPARK) // (top + 1))] for c in cells)


def _minute_text(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ms / 1000))


def report_json(report: StatsReport) -> dict[str, object]:
    return {
        "since_ms": report.since_ms,
        "until_ms": report.until_ms,
        "minutes": report.minute_starts(),
        "series": [
            {"topic": s.topic, "group": s.group, "total": s.total, "counts": list(s.counts)}
            for s in report.series
        ],
        "unanswered": list(report.unanswered),
        "truncated": report.truncated,
    }


def print_report(report: StatsReport, title: str, per_minute: bool) -> None:
    console = cli_data.console
    seconds = report.minutes * MINUTE_MS / 1000
    table = Table(
        title=f"{literal(title)}: {_minute_text(report.since_ms)} .. "
        f"{_minute_text(report.until_ms)}"
    )
    for col in ("topic", "group", "messages", "avg TPS", "peak TPS (minute)", "per minute"):
        table.add_column(col, justify="right" if "TPS" in col or col == "messages" else "left")
    for s in report.series:
        table.add_row(
            literal(s.topic),
            literal(s.group) or "[dim](produced)[/]",
            str(s.total),
            f"{s.total / seconds:.2f}",
            f"{max(s.counts, default=0) / 60:.2f}",
            sparkline(s.counts),
        )
    if not report.series:
        table.add_row("[dim]no traffic in this range[/]", "", "0", "0.00", "0.00", "")
    console.print(table)
    if per_minute and report.series:
        minutes = Table(title="per minute")
        minutes.add_column("minute")
        for s in report.series:
            minutes.add_column(literal(f"{s.topic} {s.group}".strip()), justify="right")
        for i, start in enumerate(report.minute_starts()):
            minutes.add_row(_minute_text(start), *(str(s.counts[i]) for s in report.series))
        console.print(minutes)
    for line in report.unanswered:
        console.print(f"[yellow]not counted (node did not answer): {literal(line)}[/]")
    if report.truncated:
        console.print("[yellow]a node had more rows than one answer holds: ask a shorter range[/]")


def plot(report: StatsReport, title: str, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        raise InvalidArgumentError("--plot needs matplotlib: pip install 'raftmq[plot]'") from None
    import datetime as dt

    # matplotlib takes datetimes on an axis; its stubs only say numbers.
    xs: Any = [dt.datetime.fromtimestamp(m / 1000) for m in report.minute_starts()]
    fig, ax = plt.subplots(figsize=(10, 4))
    for s in report.series:
        ax.plot(xs, [c / 60 for c in s.counts], label=f"{s.topic} {s.group or '(produced)'}")
    ax.set_title(title)
    ax.set_ylabel("messages / s (per-minute average)")
    if report.series:
        ax.legend(loc="best", fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _range(args: argparse.Namespace) -> tuple[int, int | None]:
    since = parse_duration_ms(args.since)
    until = None if args.until is None else cli_data.parse_time_ms(args.until)
    return since, until


def _show(args: argparse.Namespace, report: StatsReport, title: str) -> int:
    if args.json:
        print(json.dumps(report_json(report)))
    else:
        print_report(report, title, args.per_minute)
    if args.plot:
        plot(report, title, Path(args.plot))
        if not args.json:
            cli_data.console.print(f"chart written to {literal(args.plot)}")
    return 0


def stats_topic(args: argparse.Namespace) -> int:
    since, until = _range(args)
    with Admin(cli_data._namesrv(args)) as admin:
        report = admin.topic_stats(args.topic, since, until)
    return _show(args, report, f"messages produced to {args.topic}")


def stats_group(args: argparse.Namespace) -> int:
    since, until = _range(args)
    with Admin(cli_data._namesrv(args)) as admin:
        report = admin.group_stats(args.group, since, until, topic=args.topic)
    return _show(args, report, f"messages consumed by {args.group}")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", default="1h", help="how far back: 90s, 15m, 1h, 7d (default 1h)")
    p.add_argument(
        "--until", default=None, help="the end: ms since the epoch or ISO time (default now)"
    )
    p.add_argument("--per-minute", action="store_true", help="also a row per minute")
    p.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    p.add_argument("--plot", default="", metavar="FILE.png", help="also draw the rates to a PNG")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stats = subparsers.add_parser(
        "stats", help="resource reports: messages per minute produced and consumed, with TPS"
    )
    ssub = stats.add_subparsers(dest="stats_command", required=True)
    p = ssub.add_parser("topic", help="messages produced to a topic per minute")
    p.add_argument("topic")
    _common(p)
    p.set_defaults(func=stats_topic)
    p = ssub.add_parser("group", help="messages consumed by a group per minute and topic")
    p.add_argument("group")
    p.add_argument("--topic", default="", help="only this topic")
    _common(p)
    p.set_defaults(func=stats_group)
