"""`raftmq producer list`: the producers that write to each broker group (mqadmin's
producerConnection), from the replicated producer table: per producer, group and topic, its
queues, last sequence and last write. Registered by ops/cli_data.py; handlers return an exit
code, typed errors are printed by ops/cli.py."""

from __future__ import annotations

import argparse

from rich.table import Table

from raftmq.client.admin import Admin, ProducerQueue
from raftmq.ops.cli_data import _fmt_ms, _namesrv, console, print_json
from raftmq.ops.terminal_text import literal


def producer_list(args: argparse.Namespace) -> int:
    with Admin(_namesrv(args)) as admin:
        rows = admin.producers(args.topic)
    if args.json:
        print_json(
            [
                {
                    "producer_id": r.producer_id,
                    "broker_group": r.broker_group,
                    "topic": r.topic,
                    "queue_id": r.queue_id,
                    "last_sequence": r.last_sequence,
                    "last_store_timestamp_ms": r.last_store_timestamp_ms,
                }
                for r in rows
            ]
        )
        return 0
    by: dict[tuple[str, str, str], list[ProducerQueue]] = {}
    for r in rows:
        by.setdefault((r.producer_id, r.broker_group, r.topic), []).append(r)
    table = Table(title=f"producers ({len({r.producer_id for r in rows})})")
    for col in ("producer id", "broker group", "topic", "queues", "last sequence", "last write"):
        table.add_column(col, overflow="fold")  # ids are copied from here: never cut them
    newest_first = sorted(by.items(), key=lambda kv: -max(q.last_store_timestamp_ms for q in kv[1]))
    for (pid, group, topic), qs in newest_first:
        table.add_row(
            literal(pid),
            literal(group),
            literal(topic),
            ",".join(str(q.queue_id) for q in qs),
            str(max(q.last_sequence for q in qs)),
            _fmt_ms(max(q.last_store_timestamp_ms for q in qs)),
        )
    console.print(table)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    prod = subparsers.add_parser(
        "producer", help="the producers that write to each broker group (idempotent ones)"
    )
    psub = prod.add_subparsers(dest="producer_command", required=True)
    p = psub.add_parser("list", help="producer ids with their queues and last write, newest first")
    p.add_argument("--topic", default="", help="only producers of this topic")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.set_defaults(func=producer_list)
