"""`raftmq` subcommands for data: topic create|list|route|delete, produce, consume,
group lag|reset, message get|list|trace. Each handler takes the parsed args (with `namesrv` from the
top-level parser) and returns an exit code; typed errors are printed by client/cli.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from raftmq.client.admin import Admin, GroupInfo
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.messages import OutgoingMessage, ReceivedMessage, SendResult
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.common.errors import (
    InvalidArgumentError,
    MessageNotFoundError,
    OutcomeUnknownError,
    RaftMQError,
    RequestTimeoutError,
)
from raftmq.common.pb import common_pb2
from raftmq.common.types import parse_address_list
from raftmq.ops.cli_numbers import amount, whole
from raftmq.ops.terminal_text import literal, make_console

console = make_console()
Handler = Callable[[argparse.Namespace], int]
DEFAULT_NAMESRV = "127.0.0.1:9876,127.0.0.1:9877"
MAX_INFLIGHT = 1024  # sends of one `produce` not yet settled
PERMS = {
    "rw": common_pb2.PERM_READ_WRITE,
    "r": common_pb2.PERM_READ_ONLY,
    "w": common_pb2.PERM_WRITE_ONLY,
    "none": common_pb2.PERM_NONE,
}


def _namesrv(args: argparse.Namespace) -> str:
    """The --namesrv value as given (an empty one is an error, never the default)."""
    value = getattr(args, "namesrv", None)
    if value is None:
        value = os.environ.get("RAFTMQ_NAMESRV", DEFAULT_NAMESRV)
    return ",".join(parse_address_list(str(value), "--namesrv (NameServer addresses)"))


def parse_time_ms(text: str) -> int:
    """Milliseconds since the epoch from `1700000000000`, an ISO time, or `-10m`/`-2h`/`-30s`."""
    text = text.strip()
    if text.lstrip("-").isdigit() and not text.startswith("-"):
        return int(text)
    if text.startswith("-") and text[-1] in "smhd" and text[1:-1].isdigit():
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[text[-1]]
        return time.time_ns() // 1_000_000 - int(text[1:-1]) * unit * 1000
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgumentError(
            f"time {text!r} is not ms since the epoch, an ISO time (2026-11-22T10:00:00) "
            "or a relative time like -10m"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()
    return int(when.timestamp() * 1000)


def _fmt_ms(ms: int) -> str:
    if ms <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


# ---- topic ---------------------------------------------------------------------------------------


def _groups(args: argparse.Namespace) -> list[str] | None:
    return [g.strip() for g in (args.groups or "").split(",") if g.strip()] or None


def topic_create(args: argparse.Namespace) -> int:
    groups = _groups(args)
    with Admin(_namesrv(args)) as admin:
        done = admin.create_topic(
            args.topic, queues=args.queues, ordered=args.ordered, broker_groups=groups
        )
    console.print(
        f"[green]topic {literal(args.topic)}[/] created on {literal(', '.join(done))} "
        f"({args.queues} queues each)"
    )
    return 0


def topic_update(args: argparse.Namespace) -> int:
    if args.queues is None and args.perm is None and args.ordered is None:
        raise InvalidArgumentError(
            "nothing to change: give --queues N, --perm rw|r|w|none, --ordered or --no-ordered"
        )
    with Admin(_namesrv(args)) as admin:
        done = admin.update_topic(
            args.topic,
            queues=args.queues,
            perm=None if args.perm is None else PERMS[args.perm],
            ordered=args.ordered,
            broker_groups=_groups(args),
            drop_unconsumed=args.drop_unconsumed,
        )
    changes = [
        f"{args.queues} queues" if args.queues is not None else "",
        f"permission {args.perm}" if args.perm is not None else "",
        ("ordered" if args.ordered else "not ordered") if args.ordered is not None else "",
    ]
    console.print(
        f"[green]topic {literal(args.topic)}[/] updated on {literal(', '.join(done))}: "
        + ", ".join(c for c in changes if c)
    )
    return 0


def topic_list(args: argparse.Namespace) -> int:
    with Admin(_namesrv(args)) as admin:
        topics = admin.list_topics()
    if args.json:
        print_json(
            {
                name: [
                    {
                        "broker_group": g,
                        "read_queues": c.read_queue_nums,
                        "write_queues": c.write_queue_nums,
                        "perm": common_pb2.Permission.Name(c.perm),
                        "ordered": c.ordered,
                    }
                    for g, c in entries
                ]
                for name, entries in topics.items()
            }
        )
        return 0
    table = Table(title="topics")
    for col in ("topic", "broker groups", "queues (r/w)", "ordered"):
        table.add_column(col)
    for name, entries in topics.items():
        table.add_row(
            literal(name),
            literal(", ".join(g for g, _ in entries)),
            ", ".join(f"{c.read_queue_nums}/{c.write_queue_nums}" for _, c in entries),
            "yes" if any(c.ordered for _, c in entries) else "",
        )
    console.print(table)
    return 0


def topic_route(args: argparse.Namespace) -> int:
    with Admin(_namesrv(args)) as admin:
        route = admin.route(args.topic)
    if args.json:
        groups = [(q, route.group(q.broker_group)) for q in route.queues]
        print_json(
            [
                {
                    "broker_group": q.broker_group,
                    "leader_address": g.leader_address if g else "",
                    "addresses": list(g.addresses) if g else [],
                    "term": g.term if g else 0,
                    "read_queues": q.read_queue_nums,
                    "write_queues": q.write_queue_nums,
                    "writable": q.writable,  # false: its topic or its broker takes no sends
                }
                for q, g in groups
            ]
        )
        return 0
    table = Table(title=f"route of {literal(args.topic)}")
    for col in ("broker group", "leader", "nodes", "term", "read queues", "write queues"):
        table.add_column(col)
    for q in route.queues:
        g = route.group(q.broker_group)
        table.add_row(
            literal(q.broker_group),
            literal(g.leader_address if g else "") or "[red]none[/]",
            literal(", ".join(g.addresses) if g else ""),
            str(g.term if g else 0),
            str(q.read_queue_nums),
            str(q.write_queue_nums),
        )
    console.print(table)
    return 0


def topic_delete(args: argparse.Namespace) -> int:
    with Admin(_namesrv(args)) as admin:
        done = admin.delete_topic(args.topic)
    console.print(f"topic {literal(args.topic)} deleted from {literal(', '.join(done))}")
    return 0


# ---- produce / consume ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Tally:
    """Outcomes of the sends of one `produce`, counted as their futures complete."""

    acknowledged: list[SendResult] = field(default_factory=list)
    failed: int = 0
    unknown: int = 0
    first_error: RaftMQError | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, future: Future[SendResult]) -> None:
        exc = future.exception()
        if exc is None:
            with self.lock:
                self.acknowledged.append(future.result())
            return
        if not isinstance(exc, RaftMQError):
            raise exc  # a bug, not an outcome: let it be seen
        self.failure(exc, 1)

    def failure(self, exc: RaftMQError, count: int) -> None:
        with self.lock:
            if isinstance(exc, OutcomeUnknownError | RequestTimeoutError):
                self.unknown += count
            else:
                self.failed += count
            if self.first_error is None:
                self.first_error = exc


def produce(args: argparse.Namespace) -> int:
    text: bytes | None = args.message.encode() if args.message is not None else None
    size: int = args.size
    pad = b"x" * size

    def body_of(i: int) -> bytes:
        if text is not None:
            return text
        head = f"{i:012d} ".encode()
        return (head + pad)[: max(size, len(head))]

    from raftmq.ops import cli_admin

    keys = (args.key,) if args.key else ()
    props = cli_admin.parse_properties(args.property)
    if args.key_separator is not None and not args.stdin:
        raise InvalidArgumentError("--key-separator reads keys from lines: it needs --stdin")
    source: Iterator[OutgoingMessage]
    if args.stdin:
        total: int | None = None  # as many as there are lines
        source = cli_admin.stdin_messages(
            sys.stdin.buffer,
            args.topic,
            tags=args.tags,
            keys=keys,
            properties=props,
            key_separator=args.key_separator,
        )
    else:
        total = args.count
        source = (OutgoingMessage(body_of(i), args.tags, keys, props) for i in range(args.count))
    tally = _Tally()
    started = time.monotonic()
    interval = 1.0 / args.rate if args.rate else 0.0
    sent = 0
    inflight: list[Future[SendResult]] = []
    interrupted = False
    bad_line: cli_admin.BadLineError | None = None
    with Producer(_namesrv(args)) as p, _progress() as progress:
        task = progress.add_task(f"producing to {literal(args.topic)}", total=total)

        def done(f: Future[SendResult]) -> None:
            tally.count(f)
            progress.update(task, completed=len(tally.acknowledged))  # successes only

        try:
            while True:
                msgs: list[OutgoingMessage] = []
                try:
                    msgs.extend(itertools.islice(source, args.batch))
                except cli_admin.BadLineError as exc:
                    bad_line = exc  # send the lines before it in this batch, then stop
                n = len(msgs)
                if not msgs:
                    break
                try:
                    if args.batch > 1:
                        futures = p.send_batch_async(args.topic, msgs)
                    else:
                        m = msgs[0]
                        futures = [
                            p.send_async(
                                args.topic,
                                m.body,
                                tags=m.tags,
                                keys=m.keys,
                                properties=m.properties or None,
                            )
                        ]
                except RaftMQError as exc:  # refused before sending: count it and stop
                    tally.failure(exc, n)
                    sent += n
                    break
                for f in futures:
                    f.add_done_callback(done)
                inflight.extend(futures)
                if len(inflight) >= MAX_INFLIGHT:  # bounded: wait for these before sending more
                    for f in inflight:
                        f.exception()
                    inflight.clear()
                sent += n
                if interval:
                    time.sleep(max(0.0, started + sent * interval - time.monotonic()))
                if bad_line is not None:
                    break
        except KeyboardInterrupt:
            interrupted = True  # the producer's close() below still settles what was sent
    elapsed = time.monotonic() - started
    ok = tally.acknowledged
    groups = sorted({r.broker_group for r in ok})
    pending = sent - len(ok) - tally.failed - tally.unknown
    summary = (
        f"{len(ok)} messages acknowledged, {tally.failed} failed, "
        f"{tally.unknown + pending} outcome unknown, of {sent} sent in {elapsed:.2f} s "
        f"({len(ok) / max(elapsed, 1e-9):,.0f} msg/s)"
        + (f" on {literal(', '.join(groups))}" if groups else "")
    )
    clean = not (tally.failed or tally.unknown or pending or interrupted)
    console.print(f"[green]{summary}[/]" if clean else f"[yellow]{summary}[/]", highlight=False)
    if ok and args.show_ids:
        for r in ok[:20]:
            console.print(
                f"  {literal(r.msg_id)}  {literal(r.broker_group)}#{r.queue_id}@{r.queue_offset}"
            )
    if interrupted:
        return 130
    if bad_line is not None:
        before = f"lines 1-{sent} before it were sent (the line above)" if sent else "none sent"
        raise InvalidArgumentError(
            f"{bad_line.message}; {before}, nothing from line {bad_line.line} on was; fix it "
            f"and send the rest with `tail -n +{bad_line.line}`",
            details={"line": str(bad_line.line), "sent": str(sent)},
        )
    if tally.first_error is not None:
        raise tally.first_error  # the first failure, as the one error line (exit 1)
    return 0 if clean else 1


def consume(args: argparse.Namespace) -> int:
    from raftmq.ops import cli_admin

    start = StartFrom.EARLIEST if args.from_beginning else StartFrom.LATEST
    got = 0
    deadline = time.monotonic() + args.timeout if args.timeout else None
    show = cli_admin.print_json if args.json else None
    if args.sql and args.tags != "*":
        raise InvalidArgumentError("give --tags or --sql, not both (a subscription has one filter)")
    err = make_console(stderr=True)
    # --quiet prints no message: a live count and rate on standard error instead.
    live = Progress(
        TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=True,
        disable=not args.quiet,
    )  # fmt: skip
    meter = RateMeter(time.monotonic())
    with (
        PullConsumer(
            _namesrv(args),
            args.group,
            start_from=start,
            tag_expression=args.tags if not args.sql else "*",
            sql_expression=args.sql,
        ) as c,
        live,
    ):
        task = live.add_task("waiting for messages")
        c.subscribe(args.topic)
        try:
            while args.max == 0 or got < args.max:
                if deadline is not None and time.monotonic() >= deadline:
                    break
                batch = c.poll(500, max_messages=(args.max - got) if args.max else 10_000)
                for m in batch:
                    if show is not None:
                        show(m)
                    else:
                        _print_message(m, args.quiet)
                got += len(batch)
                meter.add(time.monotonic(), len(batch))
                live.update(task, description=f"{got} messages, {meter.recent:.0f} msg/s")
                if batch:
                    c.commit()
        except KeyboardInterrupt:
            pass
        c.commit()
    # With --json standard output holds only the messages (for jq and pipes).
    (err if args.json else console).print(
        f"[green]{got} messages[/] consumed by group {literal(args.group)} in "
        f"{meter.elapsed_s:.1f} s ({meter.average:.0f} msg/s)",
        highlight=False,
    )
    return 0


@dataclass
class RateMeter:
    """Messages per second for `consume`: on average since the first message, and over the
    last RATE_WINDOW_S (what the live line shows). Time passed in."""

    started: float
    first: float | None = None
    last: float = 0.0
    count: int = 0
    window: list[tuple[float, int]] = field(default_factory=list)

    def add(self, now: float, n: int) -> None:
        self.last = now
        if n == 0:
            return
        if self.first is None:
            self.first = now
        self.count += n
        self.window.append((now, n))
        while self.window and self.window[0][0] < now - RATE_WINDOW_S:
            self.window.pop(0)

    @property
    def elapsed_s(self) -> float:
        return max(0.0, self.last - self.started)

    @property
    def average(self) -> float:
        span = self.last - self.first if self.first is not None else 0.0
        return self.count / span if span > 0 else float(self.count)

    @property
    def recent(self) -> float:
        return sum(n for _, n in self.window) / RATE_WINDOW_S


RATE_WINDOW_S = 5.0


def _print_message(m: ReceivedMessage, quiet: bool) -> None:
    if quiet:
        return
    tags = f" tags={literal(m.tags)}" if m.tags else ""
    keys = f" keys={literal(','.join(m.keys))}" if m.keys else ""
    console.print(
        f"{literal(m.broker_group)}#{m.queue_id}@{m.queue_offset} {literal(m.msg_id)}{tags}{keys} "
        + f"'{literal(m.body, 80)}'",
        highlight=False,
        soft_wrap=True,
    )


# ---- group and message ---------------------------------------------------------------------------


def group_lag(args: argparse.Namespace) -> int:
    """One topic's lag per queue, or (without --topic) every topic the group reads, as
    kafka-consumer-groups --describe does."""
    with Admin(_namesrv(args)) as admin:
        if args.topic:
            topics = [args.topic]
        else:
            found = [g for g in admin.consumer_groups() if g.group == args.group]
            topics = list(found[0].topics) if found else []
            if not topics:
                raise InvalidArgumentError(
                    f"consumer group {args.group!r} has no committed offset and no member "
                    "online: check the name (`raftmq group list`), or give --topic"
                )
        lags = [lag for t in topics for lag in admin.group_lag(args.group, t)]
    if args.json:
        print_json(
            [
                {
                    "topic": q.queue.topic,
                    "broker_group": q.queue.broker_group,
                    "queue_id": q.queue.queue_id,
                    "committed": q.committed,
                    "max_offset": q.max_offset,
                    "lag": q.lag,
                }
                for q in lags
            ]
        )
        return 0
    where = literal(args.topic) if args.topic else f"{len(topics)} topics"
    table = Table(title=f"group {literal(args.group)} on {where}")
    for col in ("topic", "queue", "committed", "max offset", "lag"):
        table.add_column(col, justify="right" if col not in ("topic", "queue") else "left")
    total = 0
    for q in lags:
        total += q.lag
        table.add_row(
            literal(q.queue.topic),
            literal(f"{q.queue.broker_group}#{q.queue.queue_id}"),
            "-" if q.committed is None else str(q.committed),
            str(q.max_offset),
            str(q.lag),
        )
    table.add_row("[bold]total[/]", "", "", "", f"[bold]{total}[/]")
    console.print(table)
    return 0


def print_json(value: object) -> None:
    """One JSON document on standard output, for scripts (`--json`): never markup."""
    sys.stdout.write(json.dumps(value, ensure_ascii=False) + "\n")


def group_elect(args: argparse.Namespace) -> int:
    with Admin(_namesrv(args)) as admin:
        leader = admin.elect(args.group, args.node)
        groups = admin.groups()
    if leader != args.node:
        console.print(
            f"[yellow]{literal(args.group)} is led by {literal(leader or 'nobody')} "
            f"(asked: {literal(args.node)})[/]"
        )
        return 1
    console.print(f"[green]{literal(args.group)} is now led by {literal(leader)}[/]")
    preferred = _preferred_leader(groups, args.group)
    if preferred and preferred != leader:
        console.print(balancer_warning(args.group, leader, preferred), highlight=False)
    return 0


def balancer_warning(group: str, leader: str, preferred: str) -> str:
    """`group elect`'s warning (markup) when the balancer will hand `group` back to `preferred`."""
    advice = (
        f"the controllers' leader balancer (balance_leaders, on by default) hands {group} back "
        f"to its preferred leader {preferred} within about 15 s, unless it is configured "
        f'otherwise. To keep {leader}: set preferred_leader = "{leader}" in the [[group]] table '
        f"of {group} in the cluster description (the controllers' preferred_leaders = "
        f'"{group}={leader}"), or balance_leaders = false, and restart the controllers'
    )
    return f"[yellow]warning:[/] {literal(advice)}"


def _preferred_leader(groups: list[GroupInfo], group: str) -> str:
    """The node the controllers' balancer prefers for `group` when none is configured (the
    controller's own rule; "" when the controller package is not installed)."""
    try:
        balance = importlib.import_module("raftmq.controller.balance")
    except ModuleNotFoundError:
        return ""
    names = [g.broker_group for g in groups]
    members = next(([n.node_id for n in g.nodes] for g in groups if g.broker_group == group), [])
    return str(balance.preferred_node(group, members, names, {}))


def message_get(args: argparse.Namespace) -> int:
    with Admin(_namesrv(args)) as admin:
        if args.id:
            found = [admin.message_by_id(args.id)]
        else:
            if not args.topic:
                raise InvalidArgumentError("--key needs --topic")
            found = admin.messages_by_key(args.topic, args.key)
    if found and args.json:
        from raftmq.ops import cli_admin

        for m in found:
            cli_admin.print_json(m)
        return 0
    if not found:
        # The same outcome as a lookup by id that finds nothing: one line, exit 1.
        raise MessageNotFoundError(
            f"no message with key {args.key!r} in topic {args.topic!r}; keys are matched exactly, "
            "and messages older than the retention are gone",
            details={"key": args.key, "topic": args.topic},
        )
    table = Table(title="messages")
    for col in ("msg id", "queue", "offset", "tags", "keys", "stored", "body"):
        table.add_column(col)
    for m in found:
        table.add_row(
            literal(m.msg_id),
            literal(f"{m.broker_group}#{m.queue_id}"),
            str(m.queue_offset),
            literal(m.tags or ""),
            literal(",".join(m.keys)),
            _fmt_ms(m.store_timestamp_ms),
            literal(m.body, 60),
        )
    console.print(table)
    return 0


def message_list(args: argparse.Namespace) -> int:
    """A topic's messages stored within --from..--to, one page (or --all pages) as a table."""
    begin_ms = parse_time_ms(args.from_time)
    end_ms = parse_time_ms(args.to_time) if args.to_time else time.time_ns() // 1_000_000
    token = args.page_token
    shown = 0
    # --all may walk many pages: a count on standard error meanwhile (the total is not known).
    with (
        Admin(_namesrv(args)) as admin,
        listing_progress(make_console(stderr=True), args.all) as bar,
    ):
        task = bar.add_task(f"listing {literal(args.topic)}", total=None)
        while True:
            page = admin.messages_by_time(
                args.topic, begin_ms, end_ms, page_size=args.page_size, page_token=token
            )
            bar.update(task, advance=len(page.messages))
            if args.json:  # one JSON object per message, as `consume --json` prints them
                from raftmq.ops import cli_admin

                for m in page.messages:
                    cli_admin.print_json(m)
            table = Table(
                title=f"{literal(args.topic)}: stored {_fmt_ms(begin_ms)} .. {_fmt_ms(end_ms)}"
            )
            for col in ("stored", "msg id", "queue", "offset", "tags", "keys", "body"):
                table.add_column(col)
            for m in page.messages:
                table.add_row(
                    _fmt_ms(m.store_timestamp_ms),
                    literal(m.msg_id),
                    literal(f"{m.broker_group}#{m.queue_id}"),
                    str(m.queue_offset),
                    literal(m.tags or ""),
                    literal(",".join(m.keys)),
                    literal(m.body, 40),
                )
            if page.messages and not args.json:
                console.print(table)
            shown += len(page.messages)
            token = page.next_page_token
            if not token or not args.all:
                break
    summary = make_console(stderr=True) if args.json else console  # stdout: the JSON lines
    if token:
        summary.print(f"{shown} messages; next page: --page-token {literal(token)}")
    else:
        summary.print(f"{shown} messages; no more in this range")
    return 0


def message_trace(args: argparse.Namespace) -> int:
    """A traced message's path (Admin.message_trace) as a time-stamped table."""
    with Admin(_namesrv(args)) as admin:
        trace = admin.message_trace(args.id)
    steps = trace.steps()
    if args.json:
        print_json({"msg_id": trace.msg_id, "steps": [dataclasses.asdict(s) for s in steps]})
        return 0
    table = Table(title=f"trace of {literal(trace.msg_id)}")
    for col in ("time", "step", "msg id", "where", "who", "status", "cost ms", "detail"):
        table.add_column(col)
    for s in steps:
        table.add_row(
            _fmt_ms(s.timestamp_ms),
            literal(s.step),
            literal(s.msg_id),
            literal(s.where),
            literal(s.who),
            literal(s.status),
            "" if s.cost_ms is None else str(s.cost_ms),
            literal(s.detail),
        )
    console.print(table)
    return 0


def listing_progress(where: Console, shown: bool) -> Progress:
    """A long listing's progress bar, on `where` (standard error, so standard output holds only
    the listing), gone when it ends; `shown` False: a bar that prints nothing (short listings)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=where,
        transient=True,
        disable=not shown,
    )


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


# ---- parser --------------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from raftmq.ops import cli_admin, cli_stats  # they import this module (console, parsing)

    cli_admin.register(subparsers)
    cli_stats.register(subparsers)
    topic = subparsers.add_parser("topic", help="create, update, list, route, purge, delete topics")
    tsub = topic.add_subparsers(dest="topic_command", required=True)
    p = tsub.add_parser("create", help="create a topic on every (or the named) broker group")
    p.add_argument("topic")
    p.add_argument(
        "--queues", type=int, default=8, help="read and write queues per group (1..1024)"
    )
    p.add_argument("--ordered", action="store_true", help="senders use a sharding key")
    p.add_argument("--groups", default="", help="comma-separated broker groups (default: all)")
    p.set_defaults(func=topic_create)
    p = tsub.add_parser("update", help="change a topic's queues, permission or ordering")
    p.add_argument("topic")
    p.add_argument("--queues", type=int, default=None, help="read and write queues per group")
    p.add_argument("--perm", choices=sorted(PERMS), default=None, help="rw, r, w or none")
    p.add_argument(
        "--ordered",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="senders use a sharding key (--no-ordered: they do not)",
    )
    p.add_argument("--groups", default="", help="comma-separated broker groups (default: all)")
    p.add_argument(
        "--drop-unconsumed",
        action="store_true",
        help="shrink --queues even though the queues dropped hold messages a consumer group has "
        "not consumed: those messages become unreachable (refused without this flag)",
    )
    p.set_defaults(func=topic_update)
    p = tsub.add_parser("list", help="every topic with its groups and queues")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.set_defaults(func=topic_list)
    p = tsub.add_parser("route", help="a topic's route: groups, leaders, queues")
    p.add_argument("topic")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.set_defaults(func=topic_route)
    p = tsub.add_parser("delete", help="delete a topic from every group")
    p.add_argument("topic")
    p.set_defaults(func=topic_delete)
    cli_admin.register_topic(tsub)

    p = subparsers.add_parser(
        "produce", help="send messages (the bar counts acknowledged ones; a summary at the end)"
    )
    p.add_argument("topic")
    p.add_argument("--count", type=whole(1), default=1)
    p.add_argument("--size", type=whole(1), default=100, help="body bytes of generated messages")
    p.add_argument("--message", default=None, help="send this text instead of generated bodies")
    p.add_argument("--batch", type=whole(1), default=1, help="messages per batch send (1 = single)")
    p.add_argument("--tags", default=None)
    p.add_argument("--key", default=None)
    p.add_argument("--rate", type=amount(), default=0.0, help="messages per second (0 = as fast)")
    p.add_argument("--show-ids", action="store_true", help="print the first message ids")
    cli_admin.add_produce_args(p)
    p.set_defaults(func=produce)

    p = subparsers.add_parser("consume", help="read messages as a consumer group")
    p.add_argument("topic")
    p.add_argument("--group", required=True)
    p.add_argument("--from-beginning", action="store_true", help="a new group starts at the start")
    p.add_argument(
        "--max", type=whole(0), default=0, help="stop after this many (0 = until Ctrl-C)"
    )
    p.add_argument("--timeout", type=amount(), default=0.0, help="stop after this many seconds")
    p.add_argument("--tags", default="*", help='tag expression, e.g. "TagA || TagB"')
    p.add_argument("--quiet", action="store_true", help="count only, print no messages")
    cli_admin.add_consume_args(p)
    p.set_defaults(func=consume)

    group = subparsers.add_parser(
        "group", help="consumer group lag, offset resets, deletion; broker group leader elections"
    )
    gsub = group.add_subparsers(dest="group_command", required=True)
    p = gsub.add_parser("lag", help="committed offset, max offset and lag per queue")
    p.add_argument("group")
    p.add_argument("--topic", default="", help="one topic (default: every topic of the group)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.set_defaults(func=group_lag)
    cli_admin.register_group(gsub)
    p = gsub.add_parser("elect", help="hand a broker group's leadership to one of its nodes")
    p.add_argument("--group", required=True, help="broker group, e.g. broker-a")
    p.add_argument("--node", required=True, help="node id, e.g. n1")
    p.set_defaults(func=group_elect)

    msg = subparsers.add_parser("message", help="look messages up")
    msub = msg.add_subparsers(dest="message_command", required=True)
    p = msub.add_parser("get", help="by message id or by key")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--id")
    g.add_argument("--key")
    p.add_argument("--topic", default=None, help="with --key")
    p.add_argument("--json", action="store_true", help="one JSON object per message")
    p.set_defaults(func=message_get)
    p = msub.add_parser(
        "trace",
        help="the path of a message sent or consumed with trace=True (send, store, consume)",
    )
    p.add_argument("--id", required=True, help="the message id a send returned")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.set_defaults(func=message_trace)
    p = msub.add_parser("list", help="a topic's messages stored within a time range, paged")
    p.add_argument("--topic", required=True)
    p.add_argument(
        "--from",
        dest="from_time",
        required=True,
        help="start, inclusive: ms since the epoch, an ISO time or a relative time like -10m",
    )
    p.add_argument("--to", dest="to_time", default="", help="end, inclusive (default: now)")
    p.add_argument(
        "--page-size", type=whole(1, 1024), default=32, help="messages per page (1..1024)"
    )
    p.add_argument("--page-token", default="", help="continue where a page ended")
    p.add_argument("--all", action="store_true", help="print every page, not only the first")
    p.add_argument("--json", action="store_true", help="one JSON object per message")
    p.set_defaults(func=message_list)
    from raftmq.ops import cli_queue  # here: it imports this module's helpers

    cli_queue.register(msub)

    from raftmq.ops import cli_dlq, cli_producer  # here: they import this module's helpers

    cli_dlq.register(subparsers)
    cli_producer.register(subparsers)
