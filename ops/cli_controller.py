"""`raftmq controller status`: the controllers' roles and their record of every broker group
(leader, term, epoch). A planned hand-off is `raftmq group elect` (client/cli_data.py)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

import grpc
from google.protobuf.json_format import MessageToDict
from rich.table import Table

from raftmq.common import tls
from raftmq.common.auth_client import client_signer, signed
from raftmq.common.errors import BrokerUnavailableError, from_rpc_error
from raftmq.common.pb import common_pb2, controller_pb2, controller_pb2_grpc
from raftmq.common.types import parse_address_list
from raftmq.ops.terminal_text import literal, make_console

console = make_console()
DEFAULT_CONTROLLERS = "127.0.0.1:9881,127.0.0.1:9882,127.0.0.1:9883"


def status(args: argparse.Namespace) -> int:
    addresses = parse_address_list(args.controllers, "--controllers (controller addresses)")
    rows = []
    answers: list[dict[str, object]] = []
    groups: list[controller_pb2.GroupRecord] = []
    for a in addresses:
        try:
            with signed(tls.channel(a), client_signer()) as ch:
                st = controller_pb2_grpc.ControllerStub(ch).GetControllerStatus(
                    controller_pb2.GetControllerStatusRequest(), timeout=3
                )
        except grpc.RpcError as exc:
            error = from_rpc_error(exc).message
            answers.append({"address": a, "error": error})
            rows.append((literal(a), "[red]down[/]", "", "", literal(error[:60])))
            continue
        role = common_pb2.Role.Name(st.role) if st.role else "-"
        answers.append(
            {"address": a, "role": role, "node_id": st.node_id, "term": st.term,
             "applied_index": st.applied_index}
        )  # fmt: skip
        rows.append((literal(a), role, literal(st.node_id), str(st.term), str(st.applied_index)))
        if st.role == common_pb2.LEADER or not groups:
            groups = list(st.groups)
    if all(r[1] == "[red]down[/]" for r in rows):
        raise BrokerUnavailableError(f"no controller answered at {', '.join(addresses)}")
    if args.json:  # the answers as they came (a down controller: its error)
        sys.stdout.write(json.dumps({"controllers": answers, "groups": [
            MessageToDict(g, preserving_proto_field_name=True) for g in groups
        ]}) + "\n")  # fmt: skip
        return 0
    t = Table(title="controllers")
    for col in ("address", "role", "node", "term", "applied"):
        t.add_column(col)
    for r in rows:
        t.add_row(*r)
    console.print(t)
    g = Table(title="broker groups (controller record)")
    for col in ("group", "leader", "address", "term", "epoch", "changed", "members"):
        g.add_column(col)
    for rec in groups:
        changed = dt.datetime.fromtimestamp(rec.changed_ms / 1000).isoformat(
            sep=" ", timespec="seconds"
        )
        g.add_row(
            literal(rec.broker_group),
            literal(rec.leader_node_id),
            literal(rec.leader_address),
            str(rec.term),
            str(rec.epoch),
            changed,
            literal(", ".join(sorted(rec.members))),
        )
    console.print(g)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ctl = subparsers.add_parser("controller", help="the controllers' record of group leaders")
    sub = ctl.add_subparsers(dest="controller_command", required=True)
    p = sub.add_parser("status", help="controller roles and each group's leader, term, epoch")
    p.add_argument(
        "--controllers",
        default=os.environ.get("RAFTMQ_CONTROLLERS", DEFAULT_CONTROLLERS),
        help="controller addresses as host:port, separated by ',' or ';' (env RAFTMQ_CONTROLLERS)",
    )
    p.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    p.set_defaults(func=status)
    from raftmq.ops import cli_alerts  # it imports this module (console, default addresses)

    cli_alerts.register(subparsers)
