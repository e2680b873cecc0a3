"""The dashboard's alerts page (issue 18 item 3): the controller leader's alarm rules, what is
pending or firing, and the recent firing and resolved events (the same as `raftmq alerts`). The
controllers are RAFTMQ_CONTROLLERS (or the default), or `?controllers=` on the page. Registered on
import (app.py's PLUGIN_MODULES)."""

from __future__ import annotations

import os

from raftmq.common.types import parse_address_list
from raftmq.ops.cli_alerts import fetch_alerts
from raftmq.ops.cli_controller import DEFAULT_CONTROLLERS
from raftmq.ops.dashboard.app import Dashboard, Request, register_page
from raftmq.ops.dashboard.html import Cell, fmt_ms, span, table

MAX_EVENTS_SHOWN = 50


def alerts_page(d: Dashboard, req: Request) -> list[Cell]:
    text = req.query.get("controllers", "").strip() or os.environ.get(
        "RAFTMQ_CONTROLLERS", DEFAULT_CONTROLLERS
    )
    resp = fetch_alerts(list(parse_address_list(text, "controllers")))
    out: list[Cell] = []
    if not resp.rules:
        out.append(span("muted", "no alarm rules: [settings.controller] alarm_rules"))
        return out
    out.append(span("muted", f"rules (controller {resp.node_id}): " + "; ".join(resp.rules)))
    out.append(
        table(
            ("state", "rule", "subject", "value", "since"),
            [
                (
                    span("bad" if a.state == "firing" else "muted", a.state),
                    a.rule,
                    a.subject,
                    f"{a.value:g}",
                    fmt_ms(a.since_ms),
                )
                for a in resp.active
            ],
            table_id="active-alerts",
        )
    )
    if not resp.active:
        out.append(span("leader", "nothing pending or firing"))
    events = list(resp.events)[-MAX_EVENTS_SHOWN:]
    out.append(
        table(
            ("#", "at", "status", "rule", "subject", "value"),
            [
                (e.seq, fmt_ms(e.at_ms), e.status, e.rule, e.subject, f"{e.value:g}")
                for e in reversed(events)
            ],
            table_id="alert-events",
        )
    )
    return out


register_page("/alerts", "Alerts", alerts_page)
