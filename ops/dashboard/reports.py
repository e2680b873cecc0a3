"""The dashboard's resource reports page (issue 18 item 2): messages produced to a topic or
consumed by a group per minute, with TPS and a bar chart per series, from `Admin.topic_stats` /
`Admin.group_stats` (the same figures as `raftmq stats`). Registered on import (app.py's
PLUGIN_MODULES)."""

from __future__ import annotations

from raftmq.client.stats_report import MINUTE_MS, parse_duration_ms
from raftmq.ops.dashboard.app import Dashboard, Request, register_page
from raftmq.ops.dashboard.html import Cell, bar_chart, form, span, table


def reports_page(d: Dashboard, req: Request) -> list[Cell]:
    topic = req.query.get("topic", "").strip()
    group = req.query.get("group", "").strip()
    since_text = req.query.get("since", "").strip() or "1h"
    out: list[Cell] = [
        form(
            "/reports",
            [
                ("topic", "topic (produced)", topic),
                ("group", "or consumer group (consumed)", group),
                ("since", "since (15m, 1h, 7d)", since_text),
            ],
            form_id="reports-form",
        )
    ]
    if not topic and not group:
        out.append(span("muted", "name a topic or a consumer group"))
        return out
    since = parse_duration_ms(since_text)
    if group:
        report = d.admin.group_stats(group, since, topic=topic)
        what = f"consumed by {group}" + (f" from {topic}" if topic else "")
    else:
        report = d.admin.topic_stats(topic, since)
        what = f"produced to {topic}"
    seconds = report.minutes * MINUTE_MS / 1000
    rows = [
        (
            s.topic,
            s.group or "(produced)",
            s.total,
            f"{s.total / seconds:.2f}",
            f"{max(s.counts, default=0) / 60:.2f}",
        )
        for s in report.series
    ]
    out.append(
        table(
            ("topic", "group", "messages", "avg TPS", "peak TPS (minute)"),
            rows,
            numeric=(2, 3, 4),
            table_id="report",
        )
    )
    starts = report.minute_starts()
    for i, s in enumerate(report.series):
        out.append(
            bar_chart(
                list(zip(starts, [float(c) for c in s.counts], strict=True)),
                label=f"{s.topic} {s.group or '(produced)'}: messages per minute",
                chart_id=f"chart-{i}",
            )
        )
    if not report.series:
        out.append(span("muted", f"no messages {what} in this range"))
    for line in report.unanswered:
        out.append(span("bad", f"not counted (node did not answer): {line}"))
    return out


register_page("/reports", "Reports", reports_page)
