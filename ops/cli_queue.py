"""`raftmq message range`: one queue's messages by offset (mqadmin's queryMsgByOffset and
printMsgByQueue, kafka-console-consumer's --partition --offset), read without committing, with
a progress bar on standard error for long ranges. Registered by ops/cli_data.py; handlers
return an exit code, typed errors are printed by ops/cli.py."""

from __future__ import annotations

import argparse
import re

from rich.table import Table

from raftmq.client.admin import Admin
from raftmq.client.messages import ReceivedMessage
from raftmq.common.errors import InvalidArgumentError, MessageNotFoundError
from raftmq.common.types import QueueRef
from raftmq.ops import cli_admin
from raftmq.ops.cli_data import _fmt_ms, _namesrv, console, listing_progress
from raftmq.ops.terminal_text import literal, make_console

CHUNK = 500  # messages per Admin call: the progress bar moves once per chunk
_QUEUE = re.compile(r"(?P<group>[^#\s]+)#(?P<queue>[0-9]+)")


def parse_queue(text: str) -> tuple[str, int]:
    """`broker-a#3`, as every listing prints a queue, to (broker group, queue id)."""
    m = _QUEUE.fullmatch(text)
    if m is None:
        raise InvalidArgumentError(
            f"--queue {text!r}: write BROKER_GROUP#QUEUE_ID as listings print it, e.g. broker-a#0 "
            "(`raftmq topic status TOPIC` lists a topic's queues)"
        )
    return m.group("group"), int(m.group("queue"))


def message_range(args: argparse.Namespace) -> int:
    group, queue_id = parse_queue(args.queue)
    queue = QueueRef(args.topic, group, queue_id)
    begin = args.from_offset
    end = args.to_offset if args.to_offset is not None else begin + 1
    if begin < 0 or end <= begin:
        raise InvalidArgumentError(
            f"offsets {begin}..{end}: --from-offset must be >= 0 and --to-offset above it"
        )
    found: list[ReceivedMessage] = []
    low = high = 0
    err = make_console(stderr=True)
    with Admin(_namesrv(args)) as admin, listing_progress(err, end - begin > CHUNK) as bar:
        task = bar.add_task(f"reading {literal(args.queue)}", total=end - begin)
        at = begin
        while at < end:
            part = admin.messages_in_queue(queue, at, min(end, at + CHUNK))
            low, high = part.min_offset, part.max_offset
            found += part.messages
            bar.update(task, completed=min(end, at + CHUNK) - begin)
            at = max(at + CHUNK, low)
            if at >= high:
                break
    where = f"{args.topic} {args.queue}"
    if not found:
        raise MessageNotFoundError(
            f"no message at offsets {begin}..{end - 1} of {where}: it holds offsets {low}.."
            f"{high - 1}" + (" (those before were deleted: retention or a purge)" if low else ""),
            details={"min_offset": str(low), "max_offset": str(high)},
        )
    summary = (
        f"{len(found)} messages of {literal(where)} at offsets {found[0].queue_offset}.."
        f"{found[-1].queue_offset}; the queue holds {low}..{high - 1}"
    )
    if begin < low:
        summary += f"; offsets {begin}..{low - 1} were deleted (retention or a purge)"
    if args.json:
        for m in found:
            cli_admin.print_json(m)
        err.print(summary, highlight=False)
        return 0
    table = Table(title=f"{literal(where)} from offset {begin}")
    for col in ("offset", "msg id", "stored", "tags", "keys", "body"):
        table.add_column(col)
    for m in found:
        table.add_row(
            str(m.queue_offset),
            literal(m.msg_id),
            _fmt_ms(m.store_timestamp_ms),
            literal(m.tags or ""),
            literal(",".join(m.keys)),
            literal(m.body, 60),
        )
    console.print(table)
    console.print(summary, highlight=False)
    return 0


def register(msub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = msub.add_parser(
        "range",
        help="one queue's messages by offset (one message, or --to-offset for a range)",
    )
    p.add_argument("--topic", required=True)
    p.add_argument("--queue", required=True, help="BROKER_GROUP#QUEUE_ID, e.g. broker-a#0")
    p.add_argument("--from-offset", type=int, required=True, help="the first offset")
    p.add_argument(
        "--to-offset", type=int, default=None, help="end, exclusive (default: one message)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per message")
    p.set_defaults(func=message_range)
