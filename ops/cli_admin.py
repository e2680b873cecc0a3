"""`raftmq` admin commands RocketMQ and Kafka users reach for (mqadmin, kafka-consumer-groups):
`group list` (members and their connections), `group reset` to earliest / latest / an offset /
a shift / a time with --dry-run before --execute, `topic status` (min and max offset per queue),
`broker status` (with --config), and what `produce` reads from standard input and `consume`
prints as JSON. Everything goes through `Admin` (client/admin.py); cli_data.py registers these
beside its own commands.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from google.protobuf.json_format import MessageToDict
from rich.table import Table

from raftmq.client.admin import Admin
from raftmq.client.messages import OutgoingMessage, ReceivedMessage
from raftmq.client.offset_reset import QueueReset, ResetTarget, ResetTo
from raftmq.common.errors import InvalidArgumentError, InvalidMessageError
from raftmq.common.message import Message, MessageLimits, validate_message
from raftmq.common.pb import broker_pb2, common_pb2
from raftmq.ops import cli_data  # the console, --namesrv and time parsing
from raftmq.ops.terminal_text import literal

MAX_STDIN_LINE_BYTES = 4 << 20  # one message per line; a longer line is refused, not cut
ROLE_NAMES = {common_pb2.LEADER: "leader", common_pb2.FOLLOWER: "follower"}


# ---- group list / reset ------------------------------------------------------------------------


def group_list(args: argparse.Namespace) -> int:
    with Admin(cli_data._namesrv(args)) as admin:
        groups = admin.consumer_groups()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "group": g.group,
                        "topics": list(g.topics),
                        "config": {
                            b: {
                                "retry_max_times": c.retry_max_times,
                                "consume_enable": c.consume_enable,
                                "broadcast_enable": c.broadcast_enable,
                            }
                            for b, c in g.configs
                        },
                        "members": [
                            {
                                "client_id": m.client_id,
                                "topics": list(m.topics),
                                "connections": list(m.broker_groups),
                            }
                            for m in g.members
                        ],
                    }
                    for g in groups
                ]
            )
        )
        return 0
    table = Table(title="consumer groups")
    for col in ("group", "topics", "config", "members", "client id", "connections (broker groups)"):
        table.add_column(col)
    for g in groups:
        first = True
        for m in g.members or (None,):
            table.add_row(
                literal(g.group) if first else "",
                literal(", ".join(g.topics)) if first else "",
                literal(g.config_text()) if first else "",
                str(len(g.members)) if first else "",
                literal(m.client_id) if m else "[dim]none online[/]",
                literal(", ".join(m.broker_groups)) if m else "",
            )
            first = False
    cli_data.console.print(table)
    return 0


def reset_target(args: argparse.Namespace) -> ResetTarget:
    if args.to_earliest:
        return ResetTarget(ResetTo.EARLIEST)
    if args.to_latest:
        return ResetTarget(ResetTo.LATEST)
    if args.to_offset is not None:
        return ResetTarget(ResetTo.OFFSET, args.to_offset)
    if args.shift_by is not None:
        return ResetTarget(ResetTo.SHIFT, args.shift_by)
    return ResetTarget(ResetTo.TIME, cli_data.parse_time_ms(args.to_time))


def group_reset(args: argparse.Namespace) -> int:
    """kafka-consumer-groups --reset-offsets: the plan first (--dry-run, also when neither flag
    is given), changed only with --execute."""
    target = reset_target(args)
    with Admin(cli_data._namesrv(args)) as admin:
        if not args.create and not admin.group_exists(args.group, args.topic):
            raise InvalidArgumentError(
                f"consumer group {args.group!r} has no committed offset on topic {args.topic!r} "
                "and no consumer online: check the name (`raftmq group list`), or add --create "
                "to start a new group at these offsets"
            )
        if args.execute:
            rows = admin.reset_offsets(args.group, args.topic, target, allow_new_group=True)
        else:
            rows = admin.plan_offset_reset(args.group, args.topic, target)
    done = "reset" if args.execute else "reset plan (dry run: nothing changed)"
    title = f"group {literal(args.group)} {done}: {literal(args.topic)} to {target.describe()}"
    cli_data.console.print(_reset_table(rows, title))
    if args.execute:
        cli_data.console.print(
            "running consumers of the group move to the new offsets at their next heartbeat"
        )
    else:
        cli_data.console.print("[yellow]dry run:[/] add --execute to apply this plan")
    return 0


def _reset_table(rows: Iterable[QueueReset], title: str) -> Table:
    table = Table(title=title)
    for col in ("queue", "min", "max", "current", "new", "change"):
        table.add_column(col, justify="left" if col == "queue" else "right")
    for r in rows:
        table.add_row(
            str(r.queue),
            str(r.min_offset),
            str(r.max_offset),
            "-" if r.current is None else str(r.current),
            str(r.new),
            "-" if r.change is None else f"{r.change:+d}",
        )
    return table


# ---- topic status / broker status --------------------------------------------------------------


def topic_status(args: argparse.Namespace) -> int:
    with Admin(cli_data._namesrv(args)) as admin:
        queues = admin.topic_status(args.topic)
    if args.json:
        cli_data.print_json(
            [
                {
                    "broker_group": q.queue.broker_group,
                    "queue_id": q.queue.queue_id,
                    "min_offset": q.min_offset,
                    "max_offset": q.max_offset,
                    "last_store_timestamp_ms": q.last_store_timestamp_ms,
                }
                for q in queues
            ]
        )
        return 0
    table = Table(title=f"topic {literal(args.topic)}")
    for col in ("broker group", "queue", "min offset", "max offset", "messages", "last stored"):
        table.add_column(col, justify="left" if col in ("broker group", "last stored") else "right")
    total = 0
    for q in queues:
        total += q.max_offset - q.min_offset
        table.add_row(
            literal(q.queue.broker_group),
            str(q.queue.queue_id),
            str(q.min_offset),
            str(q.max_offset),
            str(q.max_offset - q.min_offset),
            cli_data._fmt_ms(q.last_store_timestamp_ms),
        )
    table.add_row("[bold]total[/]", "", "", "", f"[bold]{total}[/]", "")
    cli_data.console.print(table)
    return 0


def broker_status(args: argparse.Namespace) -> int:
    groups = cli_data._groups(args)
    with Admin(cli_data._namesrv(args)) as admin:
        nodes = admin.broker_statuses(groups)
    if args.json:  # every field of each node's status (the config only with --config)
        cli_data.print_json(
            [
                {
                    "broker_group": n.broker_group,
                    "node_id": n.node_id,
                    "address": n.address,
                    "error": n.error,
                    "status": None
                    if n.status is None
                    else MessageToDict(
                        _without_config(n.status, args.config),
                        preserving_proto_field_name=True,
                        always_print_fields_with_no_presence=True,
                    ),
                }
                for n in nodes
            ]
        )
        return 0
    table = Table(title="broker nodes")
    for col in (
        "group", "node", "address", "role", "term", "commit", "applied", "dispatched",
        "topics", "storage",
    ):  # fmt: skip
        table.add_column(col)
    for n in nodes:
        st = n.status
        if st is None:
            table.add_row(
                literal(n.broker_group),
                literal(n.node_id),
                literal(n.address),
                f"[red]{literal(n.error)}[/]",
                *[""] * 6,
            )
            continue
        table.add_row(
            literal(n.broker_group),
            literal(n.node_id),
            literal(n.address),
            ROLE_NAMES.get(st.role, "candidate"),
            str(st.term),
            str(st.commit_index),
            str(st.applied_index),
            str(st.dispatch_index),
            str(len(st.topics)),
            f"[red]{literal(st.storage_error)}[/]" if st.storage_error else "ok",
        )
    cli_data.console.print(table)
    if args.config:
        shown = [(n, n.status) for n in nodes if n.status is not None]
        keys = sorted({k for _, st in shown for k in st.config})
        conf = Table(title="broker config")
        conf.add_column("key")
        for n, _ in shown:
            conf.add_column(literal(f"{n.broker_group}/{n.node_id}"))
        for k in keys:
            conf.add_row(literal(k), *(literal(st.config.get(k, "")) for _, st in shown))
        cli_data.console.print(conf)
    return 0


def parse_settings(items: Iterable[str]) -> dict[str, str]:
    """`KEY=VALUE` items (the command line's, or the dashboard's form split on whitespace)."""
    changes: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidArgumentError(f"{item!r} is not KEY=VALUE (e.g. retention_ms=3600000)")
        changes[key.strip()] = value.strip()
    return changes


def broker_config(args: argparse.Namespace) -> int:
    """Change settings live on every node of --groups (all by default): a table of what each
    node now runs with, or why it refused (then it changed nothing; exit 1)."""
    changes = parse_settings(args.settings)
    with Admin(cli_data._namesrv(args)) as admin:
        nodes = admin.update_broker_config(changes, cli_data._groups(args), dry_run=args.dry_run)
    refused = any(n.refused or n.error for n in nodes)
    if args.json:
        cli_data.print_json(
            [
                {
                    "broker_group": n.broker_group,
                    "node_id": n.node_id,
                    "applied": n.applied,
                    "refused": n.refused,
                    "error": n.error,
                }
                for n in nodes
            ]
        )
        return 1 if refused else 0
    verb = "would change" if args.dry_run else "changed"
    table = Table(title=f"broker settings: {verb} until each node restarts")
    for col in ("node", "key", "value", "refused because"):
        table.add_column(col, overflow="fold")
    for n in nodes:
        node = literal(f"{n.broker_group}/{n.node_id}")
        if n.error:
            table.add_row(node, "", "", f"[red]{literal(n.error)}[/]")
        for k, v in sorted(n.applied.items()):
            table.add_row(node, literal(k), literal(v), "")
        for k, why in sorted(n.refused.items()):
            table.add_row(node, literal(k), literal(changes.get(k, "")), f"[red]{literal(why)}[/]")
    cli_data.console.print(table)
    if refused:
        cli_data.console.print("[red]nothing changed where a key was refused[/]")
    elif not args.dry_run:
        cli_data.console.print(
            "to keep them after a restart, set them in the cluster description too", highlight=False
        )
    return 1 if refused else 0


def _without_config(st: broker_pb2.BrokerStatus, config: bool) -> broker_pb2.BrokerStatus:
    if config:
        return st
    out = broker_pb2.BrokerStatus()
    out.CopyFrom(st)
    out.ClearField("config")
    return out


# ---- produce from standard input, consume as JSON ----------------------------------------------


def parse_properties(items: Iterable[str]) -> dict[str, str]:
    """`--property k=v` (repeatable) as a dict; a missing `=` names the item."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidArgumentError(f"--property {item!r} is not NAME=VALUE")
        out[name] = value
    return out


class BadLineError(InvalidArgumentError):
    """A line of standard input that cannot be a message; `line` is its number (from 1)."""

    def __init__(self, line: int, why: str) -> None:
        super().__init__(f"line {line} of standard input {why}", details={"line": str(line)})
        self.line = line


def stdin_messages(
    stream: BinaryIO,
    topic: str,
    *,
    tags: str | None,
    keys: tuple[str, ...],
    properties: dict[str, str],
    key_separator: str | None,
) -> Iterator[OutgoingMessage]:
    """One message per line of `stream` (the line end dropped), its bytes as the body; with
    `key_separator`, each line is KEY<sep>BODY (kafka-console-producer's parse.key), the key (UTF-8)
    added to `keys`. Each line is checked as the broker would check it before it is yielded, so a
    bad line stops the stream (BadLineError naming it) before anything of it is sent."""
    sep = None if key_separator is None else key_separator.encode()
    limits = MessageLimits()
    n = 0
    while line := stream.readline(MAX_STDIN_LINE_BYTES + 2):  # bounded: a line is read whole
        n += 1
        body = line.removesuffix(b"\n").removesuffix(b"\r")
        if len(body) > MAX_STDIN_LINE_BYTES:
            raise BadLineError(n, "is over 4 MiB")
        line_keys = keys
        if sep is not None:
            raw_key, found, body = body.partition(sep)
            if not found:
                raise BadLineError(n, f"has no key separator {key_separator!r}")
            try:
                key = raw_key.decode("utf-8")
            except UnicodeDecodeError:
                raise BadLineError(n, "has a key that is not UTF-8") from None
            line_keys = (*keys, key) if key else keys
        if not body:
            raise BadLineError(n, "is empty: a message needs a body (drop empty lines first)")
        try:
            validate_message(Message(topic, body, tags, line_keys, properties), limits)
        except InvalidMessageError as exc:
            raise BadLineError(n, f"is refused: {exc.message}") from None
        yield OutgoingMessage(body, tags, line_keys, properties)


def message_json(m: ReceivedMessage) -> str:
    """One line of `consume --json`: the body as text when it is UTF-8, else base64."""
    try:
        body: dict[str, str] = {"body": m.body.decode("utf-8")}
    except UnicodeDecodeError:
        body = {"body_base64": base64.b64encode(m.body).decode()}
    return json.dumps(
        {
            "msg_id": m.msg_id,
            "topic": m.topic,
            "broker_group": m.broker_group,
            "queue_id": m.queue_id,
            "queue_offset": m.queue_offset,
            "tags": m.tags,
            "keys": list(m.keys),
            "properties": dict(m.properties),
            "store_timestamp_ms": m.store_timestamp_ms,
            "born_timestamp_ms": m.born_timestamp_ms,
            "born_host": m.born_host,
            "reconsume_times": m.reconsume_times,
            **body,
        },
        ensure_ascii=False,
    )


def print_json(m: ReceivedMessage) -> None:
    sys.stdout.write(message_json(m) + "\n")


# ---- parser ------------------------------------------------------------------------------------


def topic_purge(args: argparse.Namespace) -> int:
    """Every queue's messages before an offset or a time, gone: per queue the old and new min
    offset (a table or --json); --dry-run changes nothing."""
    before_ms = cli_data.parse_time_ms(args.before) if args.before else None
    with Admin(cli_data._namesrv(args)) as admin:
        queues = admin.purge_topic(
            args.topic, before_offset=args.before_offset, before_ms=before_ms, dry_run=args.dry_run
        )
    gone = sum(q.new_min_offset - q.old_min_offset for q in queues)
    if args.json:
        cli_data.print_json(
            {
                "topic": args.topic,
                "dry_run": args.dry_run,
                "messages": gone,
                "queues": [
                    {
                        "broker_group": q.queue.broker_group,
                        "queue_id": q.queue.queue_id,
                        "old_min_offset": q.old_min_offset,
                        "new_min_offset": q.new_min_offset,
                        "max_offset": q.max_offset,
                    }
                    for q in queues
                ],
            }
        )
        return 0
    verb = "would purge" if args.dry_run else "purged"
    table = Table(title=f"topic {literal(args.topic)}: {verb} {gone} messages")
    for col in ("queue", "min offset before", "min offset now", "max offset"):
        table.add_column(col, justify="left" if col == "queue" else "right")
    for q in queues:
        table.add_row(
            literal(f"{q.queue.broker_group}#{q.queue.queue_id}"),
            str(q.old_min_offset),
            str(q.new_min_offset),
            str(q.max_offset),
        )
    cli_data.console.print(table)
    return 0


def group_delete(args: argparse.Namespace) -> int:
    with Admin(cli_data._namesrv(args)) as admin:
        per_group = admin.delete_group(args.group, force=args.force)
    total = sum(d.offsets for d in per_group.values())
    configs = sorted(g for g, d in per_group.items() if d.config)
    if not total and not configs:
        raise InvalidArgumentError(
            f"consumer group {args.group!r} has no committed offset and no config on any "
            "broker group (`raftmq group list` shows the groups)"
        )
    where = ", ".join(
        f"{literal(g)}: {d.offsets}" for g, d in sorted(per_group.items()) if d.offsets
    )
    config = f"; its config on {literal(', '.join(configs))}" if configs else ""
    cli_data.console.print(
        f"[green]deleted[/] consumer group {literal(args.group)}: {total} committed offsets"
        + (f" ({where})" if where else "")
        + config,
        highlight=False,
    )
    return 0


def _switch(value: str | None) -> bool | None:
    return None if value is None else value == "on"


def group_config(args: argparse.Namespace) -> int:
    """mqadmin updateSubGroup: set what is given on every broker group (or --groups), then
    show each broker group's config; with nothing to set, only show it."""
    with Admin(cli_data._namesrv(args)) as admin:
        per_group = admin.update_group_config(
            args.group,
            retry_max_times=args.retry_max,
            consume_enable=_switch(args.consume),
            broadcast_enable=_switch(args.broadcast),
            broker_groups=cli_data._groups(args),
        )
    if args.json:
        cli_data.print_json(
            [
                {
                    "broker_group": g,
                    "group": cfg.group,
                    "retry_max_times": cfg.retry_max_times,
                    "consume_enable": cfg.consume_enable,
                    "broadcast_enable": cfg.broadcast_enable,
                }
                for g, cfg in sorted(per_group.items())
            ]
        )
        return 0
    changed = any(v is not None for v in (args.retry_max, args.consume, args.broadcast))
    table = Table(title=f"consumer group {literal(args.group)}: config{' now' if changed else ''}")
    for col in ("broker group", "retry max times", "consume", "broadcast"):
        table.add_column(col)
    for g, cfg in sorted(per_group.items()):
        table.add_row(
            literal(g),
            "the consumer's" if cfg.retry_max_times < 0 else str(cfg.retry_max_times),
            "on" if cfg.consume_enable else "[red]off[/]",
            "on" if cfg.broadcast_enable else "[red]off[/]",
        )
    cli_data.console.print(table)
    return 0


def register_group(gsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = gsub.add_parser("list", help="consumer groups with their members and connections")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.set_defaults(func=group_list)
    p = gsub.add_parser(
        "delete",
        help="delete a consumer group's committed offsets on every broker group (refused "
        "while members are online, unless --force)",
    )
    p.add_argument("group")
    p.add_argument(
        "--force", action="store_true", help="although members are online (they may bring it back)"
    )
    p.set_defaults(func=group_delete)
    p = gsub.add_parser(
        "config",
        help="a group's retry limit, consume and broadcast switches on every broker group "
        "(mqadmin updateSubGroup); without options, show them",
    )
    p.add_argument("group")
    p.add_argument(
        "--retry-max",
        type=int,
        default=None,
        metavar="N",
        help="failures before a message is dead-lettered; wins over the consumer's own limit "
        "(-1: the consumer's)",
    )
    p.add_argument(
        "--consume", choices=("on", "off"), default=None, help="off: every pull is refused"
    )
    p.add_argument(
        "--broadcast",
        choices=("on", "off"),
        default=None,
        help="off: a consumer in broadcasting mode is refused",
    )
    p.add_argument("--groups", default="", help="comma-separated broker groups (default: all)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.set_defaults(func=group_config)
    p = gsub.add_parser(
        "reset",
        help="reset a group's offsets (earliest, latest, offset, shift, time): --dry-run "
        "shows the plan, --execute applies it",
    )
    p.add_argument("group")
    p.add_argument("--topic", required=True)
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the first stored message")
    to.add_argument("--to-latest", action="store_true", help="after the last message")
    to.add_argument("--to-offset", type=int, default=None, help="this offset in every queue")
    to.add_argument(
        "--shift-by", type=int, default=None, help="move each committed offset by N (-N: back)"
    )
    to.add_argument(
        "--to-time",
        default=None,
        help="ms since the epoch, ISO time, or a relative time: --to-time -10m (or -2h, -30s)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="show the plan (the default)")
    mode.add_argument("--execute", action="store_true", help="apply the plan")
    p.add_argument(
        "--create", action="store_true", help="allow a group that has never committed an offset"
    )
    p.set_defaults(func=group_reset)


def register_topic(tsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = tsub.add_parser(
        "purge",
        help="delete a topic's messages before an offset or a time, in every queue "
        "(kafka-delete-records)",
    )
    p.add_argument("topic")
    before = p.add_mutually_exclusive_group(required=True)
    before.add_argument("--before-offset", type=int, default=None, help="in every queue")
    before.add_argument(
        "--before", default="", help="stored before: ms since the epoch, an ISO time or -1h"
    )
    p.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.set_defaults(func=topic_purge)
    p = tsub.add_parser("status", help="min and max offset and last store time per queue")
    p.add_argument("topic")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.set_defaults(func=topic_status)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    broker = subparsers.add_parser("broker", help="broker nodes: status and configuration")
    bsub = broker.add_subparsers(dest="broker_command", required=True)
    p = bsub.add_parser("status", help="every node: role, term, indexes, storage (and --config)")
    p.add_argument("--groups", default="", help="comma-separated broker groups (default: all)")
    p.add_argument("--config", action="store_true", help="also each node's settings")
    p.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    p.set_defaults(func=broker_status)
    p = bsub.add_parser(
        "config",
        help="change settings that take effect without a restart (KEY=VALUE ...), on every "
        "node; others are refused with the reason",
    )
    p.add_argument("settings", nargs="+", metavar="KEY=VALUE")
    p.add_argument("--groups", default="", help="comma-separated broker groups (default: all)")
    p.add_argument("--dry-run", action="store_true", help="check only; change nothing")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.set_defaults(func=broker_config)


def add_produce_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stdin", action="store_true", help="one message per line of standard input")
    p.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a user property of every message (repeatable)",
    )
    p.add_argument(
        "--key-separator",
        default=None,
        help="with --stdin: each line is KEY<separator>BODY (e.g. --key-separator :)",
    )


def add_consume_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sql", default="", help='SQL92 filter on properties, e.g. "a > 5"')
    p.add_argument("--json", action="store_true", help="print one JSON object per message")
