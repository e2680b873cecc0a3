"""`raftmq alerts`: the alarms as the controller leader evaluates them (issue 18 item 3): its
rules, what is pending or firing now, and the recent firing and resolved events. Asks each
controller in turn until the leader answers (a follower names it)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os

import grpc
from rich.table import Table

from raftmq.common import tls
from raftmq.common.auth_client import client_signer, signed
from raftmq.common.errors import BrokerUnavailableError, from_rpc_error
from raftmq.common.pb import controller_pb2, controller_pb2_grpc
from raftmq.common.types import parse_address_list
from raftmq.ops.cli_controller import DEFAULT_CONTROLLERS, console
from raftmq.ops.cli_numbers import whole
from raftmq.ops.terminal_text import literal

RPC_TIMEOUT_S = 3.0


def fetch_alerts(addresses: list[str]) -> controller_pb2.GetAlertsResponse:
    """The controller leader's answer: each address in turn, following one leader hint."""
    errors = []
    tried: set[str] = set()
    todo = list(addresses)
    while todo:
        a = todo.pop(0)
        if a in tried:
            continue
        tried.add(a)
        try:
            with signed(tls.channel(a), client_signer()) as ch:
                return controller_pb2_grpc.ControllerStub(ch).GetAlerts(
                    controller_pb2.GetAlertsRequest(), timeout=RPC_TIMEOUT_S
                )
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            hint = getattr(err, "leader_hint", "")
            if hint:
                todo.insert(0, hint)
            errors.append(f"{a}: {err.message}")
    raise BrokerUnavailableError(
        "no controller leader answered (" + "; ".join(errors) + "); check --controllers"
    )


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="seconds")


def alerts(args: argparse.Namespace) -> int:
    addresses = list(parse_address_list(args.controllers, "--controllers (controller addresses)"))
    resp = fetch_alerts(addresses)
    events = list(resp.events)[-args.last :] if args.last > 0 else []
    if args.json:
        print(
            json.dumps(
                {
                    "controller": resp.node_id,
                    "rules": list(resp.rules),
                    "active": [
                        {"rule": a.rule, "subject": a.subject, "state": a.state,
                         "since_ms": a.since_ms, "value": a.value}
                        for a in resp.active
                    ],
                    "events": [
                        {"seq": e.seq, "status": e.status, "rule": e.rule, "subject": e.subject,
                         "value": e.value, "at_ms": e.at_ms, "since_ms": e.since_ms}
                        for e in events
                    ],
                }
            )
        )  # fmt: skip
        return 0
    print_alerts(resp, events)
    return 0


def print_alerts(
    resp: controller_pb2.GetAlertsResponse, events: list[controller_pb2.AlertEvent]
) -> None:
    """The controller leader's answer as a rules line and two tables."""
    if not resp.rules:
        console.print(
            literal(
                "no alarm rules: set [settings.controller] alarm_rules in the cluster description"
            )
        )
        return
    console.print(
        f"rules (controller {literal(resp.node_id)}): " + literal("; ".join(resp.rules)),
        soft_wrap=True,
    )
    t = Table(title="alerts now")
    for col in ("state", "rule", "subject", "value", "since"):
        t.add_column(col)
    for a in resp.active:
        state = "[red]FIRING[/]" if a.state == "firing" else "[yellow]pending[/]"
        t.add_row(state, literal(a.rule), literal(a.subject), f"{a.value:g}", _when(a.since_ms))
    if not resp.active:
        t.add_row("[green]ok[/]", "nothing pending or firing", "", "", "")
    console.print(t)
    if events:
        h = Table(title="recent events")
        for col in ("#", "at", "status", "rule", "subject", "value"):
            h.add_column(col)
        for e in events:
            status = "[red]firing[/]" if e.status == "firing" else "[green]resolved[/]"
            h.add_row(
                str(e.seq), _when(e.at_ms), status, literal(e.rule), literal(e.subject),
                f"{e.value:g}",
            )  # fmt: skip
        console.print(h)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("alerts", help="alarms: firing and pending now, recent events")
    p.add_argument(
        "--controllers",
        default=os.environ.get("RAFTMQ_CONTROLLERS", DEFAULT_CONTROLLERS),
        help="controller addresses as host:port, separated by ',' or ';' (env RAFTMQ_CONTROLLERS)",
    )
    p.add_argument("--last", type=whole(0), default=20, help="recent events shown (default 20)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    p.set_defaults(func=alerts)
