"""PullProcessor: messages of one queue from an offset, with long polling (RocketMQ's
PullMessageProcessor with its PullRequestHoldService folded in).

What to do next is broker/pull_plan.py's pure decision; this module scans the ConsumeQueue,
reads the CommitLog and filters. A pull never changes replicated state. `PullProcessor.steps` is
a generator that yields what to wait for (`WaitDispatched`, `WaitMessage`) and returns the
PullResult: `pull()` drives it with blocking waits (a gRPC handler thread), the framed data
server with futures the dispatcher completes (no thread held), the same decisions for both.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raftmq.broker.errors import CorruptRowError, DispatcherStoppedError, StoreError
from raftmq.broker.pull_plan import (
    CatchUp,
    NoNewMessage,
    OutOfRange,
    WaitForMessage,
    keep_polling_after_empty_scan,
    past_end_may_be_unindexed,
    pull_plan,
)
from raftmq.broker.retention import deleted_by_retention
from raftmq.broker.rows import CQRow
from raftmq.broker.store import RawPart
from raftmq.broker.topics import TopicProcessor
from raftmq.broker.transaction import MOVED_TOPIC
from raftmq.common.errors import (
    BrokerUnavailableError,
    ConsumeDisabledError,
    DeletedByRetentionError,
    InvalidArgumentError,
    InvalidFilterError,
    OffsetOutOfRangeError,
)
from raftmq.common.filter.sql92 import Filter, FilterSyntaxError, compile_filter
from raftmq.common.filter.tag import parse_tag_expression
from raftmq.common.group_config import GroupConfig
from raftmq.common.message import Message, StoredMessage, validate_group
from raftmq.raftlog.record import Role

if TYPE_CHECKING:
    from raftmq.broker.node import BrokerNode

log = logging.getLogger("broker.pull")
SCAN_ROWS_PER_PULL = 16_000  # rows a filtered pull may skip before answering NO_MATCHED_MSG


class PullStatus:
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"


@dataclass(frozen=True, slots=True)
class PullResult:
    status: str
    messages: list[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int
    raw_parts: list[RawPart] = field(default_factory=list)  # instead of messages, when asked

    @property
    def count(self) -> int:
        """Messages answered (a sum over parts: no walk over messages)."""
        return len(self.messages) + sum(len(p.positions) for p in self.raw_parts)


@dataclass(frozen=True, slots=True)
class WaitDispatched:
    """Wait (at most `wait_ms`) until this node's dispatcher has indexed entry `index`."""

    index: int
    wait_ms: int


# At most this long a read (a pull, queue bounds, a search by time) waits for the node's
# index to reach its commit point; a node still behind then answers what it has.
INDEX_CATCHUP_MS = 1_000


@dataclass(frozen=True, slots=True)
class WaitMessage:
    """Wait (at most `wait_ms`) until queue `topic`/`queue_id` holds a message at `offset`."""

    topic: str
    queue_id: int
    offset: int
    wait_ms: int
    # The tag filter's hash codes; None: any message ends the wait (no filter, or SQL92). A held
    # pull is woken only by a new message whose ConsumeQueue tag hash is one of them (RocketMQ
    # checks the tag code before waking a held request too): idle consumers of a busy topic
    # cost nothing per send when they filter it out (issue 14).
    tag_hashes: frozenset[int] | None = None
    # Written by the waker (HeldPulls) while the pull is held: every row below checked[0] went
    # by with a tag hash the filter does not want, so the pull goes on from there instead of
    # scanning them again. [0]: nothing checked (the blocking driver never writes it).
    checked: list[int] = field(default_factory=lambda: [0])


PullWait = WaitDispatched | WaitMessage
# Yields waits; the driver answers each with `closing` (True: the server is going away, answer
# now instead of holding); returns the result.
PullSteps = Generator[PullWait, bool, PullResult]


def _monotonic_ms(t: float | None = None) -> int:
    return int((time.monotonic() if t is None else t) * 1000)


# A blocking driver (the gRPC service, `pull`) holds a handler thread for each held long poll.
# At most max_workers // HELD_THREADS_SHARE of them may be held at once, so that sends and the
# rest always find a thread (issue 14: with 150-200 gRPC long polls held on a leader of 128
# threads every sync send failed with DEADLINE_EXCEEDED); past it a pull that would wait is
# answered NO_NEW_MSG at once (the SDK's fetcher backs off after such an early empty answer).
# The framed data path holds pulls without threads and has no such limit.
HELD_THREADS_SHARE = 2


class PullProcessor:
    def __init__(self, node: BrokerNode, topics: TopicProcessor) -> None:
        self._node = node
        self._topics = topics
        self._store = node.store
        self._settings = node.settings
        self.max_held_threads = max(1, node.settings.max_workers // HELD_THREADS_SHARE)
        self._held_threads = threading.BoundedSemaphore(self.max_held_threads)
        self.holds_refused = 0  # long polls answered at once for want of a thread to hold

    def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        *,
        sql: bool,
        expression: str,
        max_wait_ms: int,
        allow_follower_read: bool,
        max_bytes: int,
        deadline: float,
        raw: bool = False,
    ) -> PullResult:
        """Messages of one queue from `offset` on. When the queue holds nothing at `offset`, the
        request waits (long polling, blocking this thread) until a message arrives or
        `max_wait_ms` passes. `deadline` is the caller's, on time.monotonic()."""
        steps = self.steps(
            group,
            topic,
            queue_id,
            offset,
            max_count,
            sql=sql,
            expression=expression,
            max_wait_ms=max_wait_ms,
            allow_follower_read=allow_follower_read,
            max_bytes=max_bytes,
            deadline=deadline,
            raw=raw,
        )
        return self.run_blocking(steps)

    def run_blocking(self, steps: PullSteps) -> PullResult:
        """Drive `steps` on this thread, blocking in each wait; a long poll holds this thread
        only while one of max_held_threads is free (else it answers now: see above)."""
        try:
            wait = next(steps)
            while True:
                if isinstance(wait, WaitMessage):
                    if not self._held_threads.acquire(blocking=False):
                        self.holds_refused += 1
                        wait = steps.send(True)  # as when closing: answer instead of holding
                        continue
                    try:
                        self._block(wait)
                    finally:
                        self._held_threads.release()
                else:
                    self._block(wait)  # a catch-up wait: short, bounded by the dispatcher
                wait = steps.send(False)
        except StopIteration as done:
            result: PullResult = done.value
            return result

    def _block(self, wait: PullWait) -> None:
        node = self._node
        if isinstance(wait, WaitDispatched):
            node.wait_dispatched(wait.index, wait.wait_ms / 1000)
            return
        try:
            node.dispatcher.wait_for_message(
                wait.topic, wait.queue_id, wait.offset, wait.wait_ms / 1000
            )
        except DispatcherStoppedError as exc:
            raise node.dispatcher_down(exc) from exc

    def steps(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        *,
        sql: bool,
        expression: str,
        max_wait_ms: int,
        allow_follower_read: bool,
        max_bytes: int,
        deadline: float,
        raw: bool = False,
        broadcasting: bool = False,
    ) -> PullSteps:
        """The pull as a generator: it yields each wait the plan asks for (the driver resumes
        it once the condition holds or the wait's time is up: both are re-planned) and returns
        the PullResult. Validation runs on the first `next()`; errors are raised from there.
        The driver sends True to end a long poll early (its server is closing)."""
        node, settings, store = self._node, self._settings, self._store
        validate_group(group)
        check_consume(store.group_config(group), broadcasting=broadcasting)
        node.require_readable(allow_follower_read)
        if node.index_repair.rebuilding:  # its index is behind its log until the rebuild ends
            raise BrokerUnavailableError(
                f"node {node.me.node_id} is rebuilding its index store (a corrupt row was "
                "found); retry: the leader or another replica serves this pull",
                details={"node_id": node.me.node_id},
            )
        if queue_id < 0:
            raise InvalidArgumentError(f"queue id {queue_id} is negative")
        # Every node indexes in rounds (follower_/leader_dispatch_round_ms) and a leader answers
        # a send at its commit, before indexing it: a read first lets the index reach what this
        # node had committed when the read came (the wait ends a gathered round at once), so a
        # topic or a message acknowledged before it is seen (a consumer reads its writes).
        committed = node.rlog.committed_index
        if node.dispatcher.dispatched_index < committed:
            left_ms = int((deadline - time.monotonic()) * 1000)
            yield WaitDispatched(committed, max(0, min(left_ms, INDEX_CATCHUP_MS)))
        self._topics.readable_topic(topic, queue_id)
        try:
            sql_filter = compile_filter(expression) if sql else None
            tag_filter = None if sql else parse_tag_expression(expression or "*")
        except FilterSyntaxError as exc:
            raise InvalidFilterError(f"filter expression {expression!r}: {exc}") from exc
        hashes = tag_filter.hash_codes if tag_filter is not None else None
        max_count = min(max(max_count, 1), settings.pull_max_messages)
        max_bytes = min(max_bytes or settings.pull_max_bytes, settings.pull_max_bytes)
        wait_s = min(max(max_wait_ms, 0), settings.long_poll_max_ms) / 1000
        deadline_ms = _monotonic_ms(min(deadline, time.monotonic() + wait_s))
        caught_up = closing = False
        while True:
            # The dispatched index before the bounds: the bounds then hold all it dispatched.
            dispatched = node.dispatcher.dispatched_index
            low, high = store.queue_bounds(topic, queue_id)
            step = pull_plan(
                (low, high),
                dispatched,
                node.rlog.committed_index,
                offset,
                _monotonic_ms(),
                deadline_ms,
                caught_up=caught_up,
            )
            if isinstance(step, CatchUp):
                caught_up = True
                closing = yield WaitDispatched(step.index, step.wait_ms)
                continue
            if isinstance(step, OutOfRange):
                # Past its end, a node still indexing after its wait, or a new leader that has
                # not applied an entry of its term (its commit index may be older than its
                # predecessor's), cannot tell: it must not say "out of range" (a consumer told
                # so resets its position and re-reads the queue).
                behind = past_end_may_be_unindexed(
                    offset, high, node.dispatcher.dispatched_index, node.rlog.committed_index
                ) or (offset > high and _new_leader_not_ready(node))
                if behind:
                    raise BrokerUnavailableError(
                        f"node {node.me.node_id} has not indexed every committed entry that "
                        f"may hold {topic}/{queue_id} offset {offset} yet; retry",
                        details={"node_id": node.me.node_id},
                    )
                if deleted_by_retention(offset, low, store.cut_index):
                    raise DeletedByRetentionError.for_offset(topic, queue_id, offset, low, high)
                raise OffsetOutOfRangeError.for_offset(topic, queue_id, offset, low, high)
            if isinstance(step, NoNewMessage) or (
                isinstance(step, WaitForMessage) and (node.closed or closing)
            ):
                return PullResult(PullStatus.NO_NEW_MSG, [], offset, low, high)
            if isinstance(step, WaitForMessage):
                held = WaitMessage(topic, queue_id, offset, step.wait_ms, hashes)
                closing = yield held
                offset = max(offset, held.checked[0])  # rows seen going by, all unwanted
                continue
            try:
                scan = store.scan_queue(
                    topic, queue_id, offset, max_count, hashes, max_scan_rows=SCAN_ROWS_PER_PULL
                )
                if raw:
                    keep = _sql_keep(sql_filter) if sql_filter is not None else None
                    parts, cut_at = node.reader.raw_parts(scan.runs, max_bytes, keep)
                    next_offset = scan.next_offset if cut_at is None else cut_at
                    messages = []
                else:
                    rows, next_offset = _cut_by_bytes(scan.rows, max_bytes, scan.next_offset)
                    parts, messages = [], node.reader.read(rows) if rows else []
                check_served(topic, queue_id, offset, next_offset, messages, parts)
            except StoreError as exc:
                raise self._cannot_serve(topic, queue_id, offset, exc) from exc
            if parts:
                return PullResult(PullStatus.FOUND, [], next_offset, low, high, parts)
            if sql_filter is not None:
                messages = [
                    m for m in messages if sql_filter.matches(m.message.properties, m.message.tags)
                ]
            if messages:
                return PullResult(PullStatus.FOUND, messages, next_offset, low, high)
            offset = next_offset
            if not keep_polling_after_empty_scan(offset, high, _monotonic_ms(), deadline_ms):
                return PullResult(PullStatus.NO_MATCHED_MSG, [], offset, low, high)

    def _cannot_serve(
        self, topic: str, queue_id: int, offset: int, exc: StoreError
    ) -> BrokerUnavailableError:
        """What a pull gets instead of data its index or log does not vouch for: a retryable
        error (another replica serves it). The node reports it (storage_error) and rebuilds
        its index from the log (broker/index_repair.py)."""
        node = self._node
        log.error(
            "broker.pull_not_served node=%s topic=%s queue=%d offset=%d error=%s",
            node.me.node_id,
            topic,
            queue_id,
            offset,
            str(exc).replace(" ", "_"),
        )
        if not isinstance(exc, CorruptRowError):  # (a bad row reported itself when read)
            node.index_repair.report(exc)
        return BrokerUnavailableError(
            f"node {node.me.node_id} did not serve {topic}/{queue_id} from offset {offset}: "
            f"{exc}; it reports this in its status and rebuilds its index from the log; retry "
            "(the leader or another replica serves it)",
            details={"node_id": node.me.node_id},
        )


def check_consume(cfg: GroupConfig, *, broadcasting: bool) -> None:
    """Refuse a pull or receive the group's config forbids (RocketMQ's NO_PERMISSION for a
    subscription group with consumeEnable or consumeBroadcastEnable off)."""
    if not cfg.consume_enable:
        raise ConsumeDisabledError.for_group(cfg.group)
    if broadcasting and not cfg.broadcast_enable:
        raise ConsumeDisabledError.for_group(cfg.group, broadcast=True)


def _new_leader_not_ready(node: BrokerNode) -> bool:
    """A leader that has not dispatched an entry of its own term yet (what the leader gate
    waits for): the entries of earlier terms it has not learnt are committed are not indexed."""
    st = node.rlog.status()
    return st.role is Role.LEADER and node.dispatcher.dispatched_term < st.term


def check_served(
    topic: str,
    queue_id: int,
    offset: int,
    next_offset: int,
    messages: list[StoredMessage],
    parts: list[RawPart],
) -> None:
    """The last check before an answer leaves the node: every message is of the queue asked
    for, at an offset from `offset` on, in order, below `next_offset`. A row that passed its
    checksum but names what was not asked for is a StoreError, not data."""
    if not messages and _parts_in_order(parts, offset - 1, next_offset):
        return  # (the loop below then finds nothing: it names what is wrong when something is)
    got: list[tuple[str | None, int, int]] = [
        (m.topic, m.queue_id, m.queue_offset) for m in messages
    ]
    for p in parts:
        got += [(None, queue_id, p.first_offset + position) for position in p.positions]
    last = offset - 1
    for msg_topic, msg_queue, at in got:
        if (
            (msg_topic is not None and topic not in (msg_topic, MOVED_TOPIC))
            or msg_queue != queue_id
            or not last < at < next_offset
        ):
            raise StoreError(
                f"the answer to {topic}/{queue_id} from offset {offset} (next {next_offset}) "
                f"holds {msg_topic or topic}/{msg_queue} offset {at} after {last}"
            )
        last = at


def _parts_in_order(parts: list[RawPart], last: int, next_offset: int) -> bool:
    """check_served's rule for raw parts without a Python step per message: each part's
    positions strictly ascend (compared in C) and its offsets lie past the previous part's,
    below `next_offset`."""
    for p in parts:
        ps = p.positions
        if not ps or not last < p.first_offset + ps[0] or not all(map(operator.lt, ps, ps[1:])):
            return False
        last = p.first_offset + ps[-1]
    return last < next_offset


def _sql_keep(sql_filter: Filter) -> Callable[[Message], bool]:
    def keep(m: Message) -> bool:
        return sql_filter.matches(m.properties, m.tags)

    return keep


def _cut_by_bytes(rows: list[CQRow], max_bytes: int, scan_next: int) -> tuple[list[CQRow], int]:
    """Keep rows while their bodies fit in max_bytes (at least one), and where to go on."""
    total = 0
    for i, row in enumerate(rows):
        total += row.body_bytes
        if total > max_bytes and i > 0:
            return rows[:i], row.queue_offset
    return rows, scan_next
