"""`raftmq dlq list|show|resend`: a consumer group's dead letters (%DLQ%<group>), what each was
(original topic and id, how often it failed), and sending one back to its original topic.
Registered by ops/cli_data.py; handlers return an exit code, typed errors are printed by ops/cli.py.
"""

from __future__ import annotations

import argparse

from rich.table import Table

from raftmq.client.admin import Admin
from raftmq.client.messages import ReceivedMessage
from raftmq.common.errors import InvalidArgumentError
from raftmq.common.message import DLQ_TOPIC_PREFIX
from raftmq.common.retry import (
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    reconsume_times,
)
from raftmq.ops.cli_data import _fmt_ms, _namesrv, console, print_json
from raftmq.ops.cli_numbers import whole
from raftmq.ops.terminal_text import literal


def _origin(m: ReceivedMessage) -> tuple[str, str]:
    return (
        m.properties.get(PROPERTY_DLQ_ORIGIN_TOPIC, ""),
        m.properties.get(PROPERTY_DLQ_ORIGIN_MESSAGE_ID, ""),
    )


def dlq_list(args: argparse.Namespace) -> int:
    if args.max < 1:
        raise InvalidArgumentError("--max must be at least 1")
    with Admin(_namesrv(args)) as admin:
        found = admin.dead_letters(args.group, max_count=args.max)
    if args.json:  # one JSON object per dead letter, its origin among the properties
        from raftmq.ops import cli_admin

        for m in found:
            cli_admin.print_json(m)
        return 0
    table = Table(title=f"dead letters of group {literal(args.group)} ({len(found)})")
    for col in ("msg id", "original topic", "original id", "failures", "stored", "body"):
        table.add_column(col, overflow="fold")  # ids are copied from here: never cut them
    for m in found:
        topic, origin_id = _origin(m)
        table.add_row(
            literal(m.msg_id),
            literal(topic),
            literal(origin_id),
            str(reconsume_times(m.properties)),
            _fmt_ms(m.store_timestamp_ms),
            literal(m.body, 40),
        )
    console.print(table)
    return 0


def dlq_show(args: argparse.Namespace) -> int:
    with Admin(_namesrv(args)) as admin:
        m = admin.message_by_id(args.id)
    if not m.topic.startswith(DLQ_TOPIC_PREFIX):
        raise InvalidArgumentError(
            f"message {args.id} is in topic {m.topic!r}, not a dead-letter topic; "
            "`raftmq message get --id` shows any message"
        )
    if args.json:  # the message, its origin among the properties
        from raftmq.ops import cli_admin

        cli_admin.print_json(m)
        return 0
    topic, origin_id = _origin(m)
    table = Table(title=f"dead letter {literal(m.msg_id)}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    rows: list[tuple[str, str | bytes]] = [
        ("dead-letter topic", m.topic),
        ("original topic", topic),
        ("original id", origin_id),
        ("failures", str(reconsume_times(m.properties))),
        ("stored", _fmt_ms(m.store_timestamp_ms)),
        ("born", _fmt_ms(m.born_timestamp_ms)),
        ("tags", m.tags or ""),
        ("keys", ",".join(m.keys)),
        *((f"property {k}", v) for k, v in sorted(m.properties.items())),
        ("body", m.body[:200]),
    ]
    for field, value in rows:
        table.add_row(literal(field), literal(value))
    console.print(table)
    return 0


def dlq_resend(args: argparse.Namespace) -> int:
    if (args.id is None) == (args.group is None):
        raise InvalidArgumentError(
            "give --id (one dead letter) or --group (all of a group's dead letters)"
        )
    if args.group is not None:
        return _resend_group(args)
    if args.dry_run:
        raise InvalidArgumentError("--dry-run goes with --group; `dlq show --id` shows one")
    with Admin(_namesrv(args)) as admin:
        result = admin.resend_dead_letter(args.id, force=args.force)
    console.print(
        f"[green]resent[/] {literal(args.id)} to {literal(result.topic)} as "
        f"{literal(result.msg_id)} ({literal(result.broker_group)}#{result.queue_id}"
        f"@{result.queue_offset})",
        highlight=False,
    )
    return 0


def _resend_group(args: argparse.Namespace) -> int:
    """Every dead letter of --group (at most --max) back to its topic, each once; --dry-run
    sends nothing and says what would go; a table (or --json) and the counts."""
    if args.max < 1:
        raise InvalidArgumentError("--max must be at least 1")
    with Admin(_namesrv(args)) as admin:
        done = admin.resend_dead_letters(
            args.group, max_count=args.max, dry_run=args.dry_run, force=args.force
        )
    counts = {k: sum(1 for d in done if d.outcome == k) for k in OUTCOMES}
    if args.json:
        print_json(
            {
                "group": args.group,
                "dry_run": args.dry_run,
                "counts": counts,
                "dead_letters": [
                    {"msg_id": d.msg_id, "outcome": d.outcome, "new_msg_id": d.new_msg_id}
                    for d in done
                ],
            }
        )
        return 0
    verb = "would resend" if args.dry_run else "resent"
    table = Table(title=f"dead letters of group {literal(args.group)}: {verb}")
    for col in ("dead letter", "outcome", "new id"):
        table.add_column(col, overflow="fold")
    for d in done:
        table.add_row(literal(d.msg_id), d.outcome, literal(d.new_msg_id))
    if done:
        console.print(table)
    console.print(
        f"{counts[verb]} {verb}, {counts['skipped']} skipped (resent before: --force sends "
        f"them again) of {len(done)} dead letters"
        + (" (--dry-run: nothing was sent)" if args.dry_run else ""),
        highlight=False,
    )
    return 0


OUTCOMES = ("resent", "would resend", "skipped")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dlq = subparsers.add_parser("dlq", help="a consumer group's dead letters: list, show, resend")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True)
    p = dsub.add_parser("list", help="the dead letters of a consumer group")
    p.add_argument("--group", required=True, help="consumer group")
    p.add_argument("--max", type=whole(1), default=100, help="at most this many (default 100)")
    p.add_argument("--json", action="store_true", help="one JSON object per dead letter")
    p.set_defaults(func=dlq_list)
    p = dsub.add_parser("show", help="one dead letter with its origin and properties")
    p.add_argument("--id", required=True, help="the dead letter's message id")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=dlq_show)
    p = dsub.add_parser(
        "resend",
        help="send a dead letter (--id) or all of a group's (--group) back to the original "
        "topic, each once unless --force",
    )
    p.add_argument("--id", default=None, help="the dead letter's message id")
    p.add_argument("--group", default=None, help="every dead letter of this consumer group")
    p.add_argument("--max", type=whole(1), default=1000, help="with --group: at most this many")
    p.add_argument("--dry-run", action="store_true", help="with --group: say, send nothing")
    p.add_argument("--json", action="store_true", help="with --group: one JSON document")
    p.add_argument("--force", action="store_true", help="resend even though it was resent before")
    p.set_defaults(func=dlq_resend)
