"""Message trace in the SDK (RocketMQ's msgTrace, issue 16 item 4): the hooks that record send and
consume traces, the background sender that ships them to RMQ_SYS_TRACE_TOPIC, and the reading
side that turns a message's trace records into a time-stamped path.

Off by default; `Producer(trace=True)` / `PushConsumer(trace=True)` turn it on per client. The
records and the bounded batching buffer are common/trace.py's (pure). Recording never blocks and
never raises into a send or a listener: a full buffer drops the record and counts it. One thread
per traced client drains the buffer, in batches, through a producer of its own (system topic
allowed, never traced itself), with at most `max_inflight` batches unanswered.

A trace batch's keys are the message ids it traces, so `Admin.message_trace(id)` finds every
batch naming a message through the broker's key index (one lookup per id).
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from raftmq.client.messages import OutgoingMessage, ReceivedMessage, SendResult
from raftmq.common.errors import RaftMQError
from raftmq.common.retry import PROPERTY_ORIGIN_MESSAGE_ID, reconsume_times
from raftmq.common.trace import (
    TRACE_TOPIC,
    ConsumeTrace,
    EndTransactionTrace,
    MalformedTraceError,
    MoveTrace,
    SendTrace,
    TraceBatch,
    TraceBuffer,
    TraceRecord,
    decode_batch,
    encode_batch,
    encode_sends,
)

if TYPE_CHECKING:  # the producer package imports this module
    from raftmq.client.producer.sender import Pending

log = logging.getLogger("raftmq.trace")

DEFAULT_MAX_INFLIGHT_BATCHES = 4
CLOSE_FLUSH_S = 5.0
POLL_S = 0.05  # the trace thread drains what the hooks recorded at least this often
WAKE_AT_INCOMING = 256  # or at once when this many are waiting
DRAIN_YIELD_EVERY = 8  # records encoded between two releases of the GIL
MAX_BATCHES_PER_REQUEST = 8  # trace-topic messages (32 records each) sent in one request
MAX_REQUEST_BYTES = 256 * 1024  # then no more are added: far below a request's 1 MiB batch
TRACE_CODEC = "TRACE_CODEC"  # property of a trace-topic message: "zlib", or absent (plain)
MAX_INFLATED_BYTES = 4 * 1024 * 1024  # a batch is at most 128 KiB; anything larger is not ours


def _mono_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def default_client_id() -> str:
    return f"{socket.gethostname()}@{os.getpid()}"


class TraceSender:
    """Buffers trace records and sends them to the trace topic from one background thread.

    The hooks only append to `_incoming` (a deque append: no lock, no encoding), because they
    run on the SDK's I/O thread (a send's completion) or a listener thread, which are a sender's
    critical path; the trace thread turns what they left into records, encodes them into the
    TraceBuffer and sends the batches."""

    def __init__(
        self,
        namesrv_addresses: str | Sequence[str],
        *,
        buffer: TraceBuffer | None = None,
        max_inflight: int = DEFAULT_MAX_INFLIGHT_BATCHES,
        send_timeout_ms: int = 5_000,
    ) -> None:
        from raftmq.client.producer import Producer  # the producer module imports this one

        self._buffer = buffer if buffer is not None else TraceBuffer()
        # Bounded like the buffer: together at most twice its records wait in memory.
        self._incoming: collections.deque[TraceRecord | _SendsDone] = collections.deque()
        self._max_incoming = self._buffer.max_buffered
        self._dropped_incoming = 0
        self._max_inflight = max(1, max_inflight)
        self._cond = threading.Condition()
        self._inflight = 0
        self._closed = False
        self._flush_requested = False
        self.sent_batches = 0
        self.sent_records = 0
        self.failed_batches = 0
        # Non-idempotent and non-blocking: a trace batch is best effort, never worth a wait.
        self._producer = Producer(
            namesrv_addresses,
            allow_system_topics=True,
            idempotent=False,
            send_timeout_ms=send_timeout_ms,
            max_block_ms=0,
            retries=3,
        )
        self._thread = threading.Thread(target=self._run, name="raftmq-trace", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Records lost to a full buffer (or larger than a batch): counted, never raised."""
        return self._buffer.dropped + self._dropped_incoming

    def record(self, rec: TraceRecord | _SendsDone) -> bool:
        """Keep `rec` for the next batch: False (counted) when the buffer is full or closed.
        Never blocks, never raises."""
        if self._closed:
            return False
        if len(self._incoming) >= self._max_incoming:
            self._dropped_incoming += 1  # racy by a few under contention: a statistic
            return False
        self._incoming.append(rec)
        if len(self._incoming) == WAKE_AT_INCOMING:  # a burst: drain before the next poll
            with self._cond:
                self._cond.notify()
        return True

    def flush(self, timeout_s: float = CLOSE_FLUSH_S) -> bool:
        """Send everything recorded so far; True once it is answered (or dropped)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._flush_requested = True
            self._cond.notify()
            while self._incoming or len(self._buffer) or self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._flush_requested = True
                self._cond.notify()
                self._cond.wait(min(left, 0.05))
        return True

    def close(self, timeout_s: float = CLOSE_FLUSH_S) -> None:
        if self._closed:
            return
        self.flush(timeout_s)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        self._producer.close(timeout_s)
        if self.dropped:
            log.warning("trace.dropped records=%d (buffer full or oversized)", self.dropped)

    # ---- the sender thread ----------------------------------------------------------------------

    def _drain_incoming(self) -> None:
        """Turn what the hooks left into encoded records in the buffer. Only this thread
        writes the buffer, so no lock; it lets the GIL go every few records, or a sender's I/O
        thread would wait up to the interpreter's switch interval (5 ms) behind a long drain."""
        incoming = self._incoming
        now = _mono_ms()
        n = 0
        while incoming:
            item = incoming.popleft()
            try:
                if isinstance(item, _SendsDone):
                    for ids, line in item.lines(self._buffer.max_batch_records):
                        self._buffer.add_encoded(ids, line, now)
                else:
                    self._buffer.add(item, now)
            except Exception:  # a trace must never fail what it traces, nor stop the thread
                log.exception("trace.record_failed")
            n += 1
            if n % DRAIN_YIELD_EVERY == 0:
                time.sleep(0)

    def _next_batches(self) -> list[TraceBatch] | None:
        """Wait until a batch is due, then take it and whatever else is buffered, up to
        MAX_BATCHES_PER_REQUEST batches: one request (one Raft entry) for all of them, so a
        sender's own sends queue behind as few trace requests as possible. None: closed."""
        while True:
            self._drain_incoming()
            with self._cond:
                if self._closed:
                    return None
                now = _mono_ms()
                if self._inflight < self._max_inflight:
                    first = self._buffer.take(now, flush=self._flush_requested)
                    if first is not None:
                        batches = [first]
                        size = len(first.body)
                        while len(batches) < MAX_BATCHES_PER_REQUEST and size < MAX_REQUEST_BYTES:
                            more = self._buffer.take(now, flush=True)
                            if more is None:
                                break
                            batches.append(more)
                            size += len(more.body)
                        self._inflight += 1
                        return batches
                    if not self._incoming:
                        self._flush_requested = False
                if self._incoming and len(self._incoming) >= WAKE_AT_INCOMING:
                    continue
                deadline = self._buffer.next_deadline_ms()
                wait_s = POLL_S if deadline is None else max(0.001, (deadline - now) / 1000)
                self._cond.wait(min(wait_s, POLL_S))

    def _run(self) -> None:
        while True:
            batches = self._next_batches()
            if batches is None:
                return
            try:
                futures = self._producer.send_batch_async(
                    TRACE_TOPIC, [_trace_message(b) for b in batches]
                )
            except RaftMQError as exc:
                self._sent(batches, exc)
                continue
            # One request: its messages succeed or fail together; the last answer settles it.
            futures[-1].add_done_callback(functools.partial(self._request_done, batches))

    def _request_done(self, batches: list[TraceBatch], fut: Future[SendResult]) -> None:
        self._sent(batches, None if fut.cancelled() else fut.exception())

    def _sent(self, batches: list[TraceBatch], exc: BaseException | None) -> None:
        records = sum(b.count for b in batches)
        with self._cond:
            self._inflight -= 1
            if exc is None:
                self.sent_batches += len(batches)
                self.sent_records += records
            else:
                self.failed_batches += len(batches)
            failed = self.failed_batches
            self._cond.notify_all()
        if exc is not None and (failed <= len(batches) or failed % 1000 < len(batches)):
            log.warning("trace.batch_failed records=%d failed_batches=%d error=%s", records,
                        failed, exc)  # fmt: skip


def _trace_message(batch: TraceBatch) -> OutgoingMessage:
    """A trace batch as a trace-topic message: the JSON lines compressed (zlib, level 1: ~16x
    smaller, ~12 us a batch), which keeps the broker's bytes per traced message at ~20 instead
    of ~350, more than a small message's own body; the keys are the traced ids."""
    return OutgoingMessage(
        zlib.compress(batch.body, 1), keys=batch.keys, properties={TRACE_CODEC: "zlib"}
    )


def trace_message(records: Sequence[TraceRecord], keys: Sequence[str]) -> OutgoingMessage:
    """Records written outside a TraceSender (Admin's resend record) as one trace-topic message
    keyed by `keys`, the ids a trace lookup finds it by."""
    return _trace_message(
        TraceBatch(encode_batch(records), tuple(dict.fromkeys(k for k in keys if k)), len(records))
    )


def records_of_message(m: ReceivedMessage) -> list[TraceRecord]:
    """The records of one trace-topic message (compressed or not). MalformedTraceError for
    bytes that are not trace records, bounded in what it inflates."""
    body = m.body
    codec = m.properties.get(TRACE_CODEC, "")
    if codec == "zlib":
        inflater = zlib.decompressobj()
        try:
            body = inflater.decompress(body, MAX_INFLATED_BYTES)
        except zlib.error as exc:
            raise MalformedTraceError(f"trace message {m.msg_id} does not inflate: {exc}") from None
        if inflater.unconsumed_tail:
            raise MalformedTraceError(
                f"trace message {m.msg_id} inflates past {MAX_INFLATED_BYTES} bytes"
            )
    elif codec:
        raise MalformedTraceError(f"trace message {m.msg_id} has an unknown codec {codec!r}")
    return decode_batch(body)


# ---- the hooks -----------------------------------------------------------------------------------


@dataclass(slots=True)  # not frozen: a frozen init costs a few us more on the I/O thread
class _SendsDone:
    """What a settled request leaves for the trace thread: one per stored batch (the messages
    of one request for one queue, every future done), never one per message."""

    topic: str
    items: Sequence[Pending]
    producer_group: str
    client_id: str
    done_ms: int

    def lines(self, per_line: int) -> Iterable[tuple[tuple[str, ...], bytes]]:
        """The traced ids and encode_sends line of each slice of at most `per_line` messages
        (a trace-topic message's keys are the ids it traces: at most MessageLimits.max_keys)."""
        items = self.items
        for at in range(0, len(items), per_line):
            part = items[at : at + per_line]
            first = part[0].future
            result = None if first.cancelled() or first.exception() is not None else first.result()
            messages = [
                (
                    it.future.result().msg_id if result is not None else "",
                    it.msg.born_timestamp_ms,
                    tuple(it.msg.keys),
                    it.msg.tags or None,
                )
                for it in part
            ]
            ids = tuple(m[0] for m in messages)
            yield (
                ids,
                encode_sends(
                    self.topic,
                    self.producer_group,
                    self.client_id,
                    result.broker_group if result is not None else "",
                    result.queue_id if result is not None else -1,
                    result.queue_offset if result is not None else -1,
                    self.done_ms,
                    result is not None,
                    messages,
                ),
            )


def sends_hook(
    sender: TraceSender, producer_group: str, client_id: str
) -> Callable[[str, Sequence[Pending]], None]:
    """The producer's per-batch hook (client/producer/sender.py `on_settled`, on the SDK's I/O
    thread): hands the batch to the trace thread; nothing here encodes or takes a lock."""

    def settled(topic: str, items: Sequence[Pending]) -> None:
        sender.record(_SendsDone(topic, items, producer_group, client_id, _wall_ms()))

    return settled


R = TypeVar("R")


def traced_listener(
    listener: Callable[[ReceivedMessage], R], sender: TraceSender, group: str, client_id: str
) -> Callable[[ReceivedMessage], R]:
    """`listener`, recording a ConsumeTrace of each call (its result or exception unchanged)."""

    def call(m: ReceivedMessage) -> R:
        wall, mono = _wall_ms(), _mono_ms()
        status = "exception"
        try:
            result = listener(m)
            name = getattr(result, "value", None)
            status = "reconsume_later" if name == "reconsume_later" else "success"
            return result
        finally:
            try:
                sender.record(
                    ConsumeTrace(
                        msg_id=m.msg_id,
                        timestamp_ms=wall,
                        topic=m.topic,
                        group=group,
                        client_id=client_id,
                        status=status,
                        reconsume_times=max(m.reconsume_times, reconsume_times(m.properties)),
                        cost_ms=_mono_ms() - mono,
                        origin_msg_id=m.properties.get(PROPERTY_ORIGIN_MESSAGE_ID, ""),
                        broker_group=m.broker_group,
                        queue_id=m.queue_id,
                        queue_offset=m.queue_offset,
                    )
                )
            except Exception:
                log.exception("trace.consume_hook_failed")

    return call


# ---- reading a trace -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceStep:
    """One row of `raftmq message trace`: when, what, where, and the rest."""

    timestamp_ms: int
    step: str  # send, store, consume, end-transaction, retry, dlq
    msg_id: str
    where: str  # broker group / queue / offset, or the topics of a move
    who: str  # the producer or consumer group and client
    status: str
    cost_ms: int | None
    detail: str


@dataclass(frozen=True, slots=True)
class MessageTrace:
    """A message's path as `Admin.message_trace` found it: its trace records (and its retry and
    dead-letter copies'), time ordered, and the stored messages of the path still on a broker."""

    msg_id: str
    records: tuple[TraceRecord, ...]
    stored: tuple[ReceivedMessage, ...] = ()

    def steps(self) -> list[TraceStep]:
        return trace_steps(self.records, self.stored)


def trace_steps(
    records: Iterable[TraceRecord], stored: Iterable[ReceivedMessage] = ()
) -> list[TraceStep]:
    """The rows of a message's path, time ordered; `stored` adds a store row per message the
    broker still holds (its store time is the broker's, not a client's)."""
    rows: list[TraceStep] = []
    for r in records:
        if isinstance(r, SendTrace):
            rows.append(
                TraceStep(
                    r.timestamp_ms,
                    "send",
                    r.msg_id,
                    f"{r.topic}@{r.broker_group}#{r.queue_id} offset {r.queue_offset}",
                    f"{r.producer_group} ({r.client_id})",
                    "ok" if r.success else "failed",
                    r.cost_ms,
                    f"keys={','.join(r.keys)} tags={r.tags or ''}".strip(),
                )
            )
        elif isinstance(r, ConsumeTrace):
            detail = f"reconsume {r.reconsume_times}"
            if r.origin_msg_id:
                detail += f", origin {r.origin_msg_id}"
            rows.append(
                TraceStep(
                    r.timestamp_ms,
                    "consume",
                    r.msg_id,
                    f"{r.topic}@{r.broker_group}#{r.queue_id} offset {r.queue_offset}",
                    f"{r.group} ({r.client_id})",
                    r.status,
                    r.cost_ms,
                    detail,
                )
            )
        elif isinstance(r, EndTransactionTrace):
            rows.append(
                TraceStep(
                    r.timestamp_ms,
                    "end-transaction",
                    r.msg_id,
                    r.topic,
                    r.producer_group,
                    r.resolution,
                    None,
                    f"transaction {r.transaction_id}" + (" (check-back)" if r.from_check else ""),
                )
            )
        elif isinstance(r, MoveTrace):
            rows.append(
                TraceStep(
                    r.timestamp_ms,
                    r.move.value,
                    r.msg_id,
                    f"{r.from_topic} -> {r.to_topic}",
                    r.group,
                    "moved",
                    None,
                    f"new id {r.new_msg_id}, delay {r.delay_ms} ms, reconsume {r.reconsume_times}",
                )
            )
    for m in stored:
        rows.append(
            TraceStep(
                m.store_timestamp_ms,
                "store",
                m.msg_id,
                f"{m.topic}@{m.broker_group}#{m.queue_id} offset {m.queue_offset}",
                m.broker_group,
                "stored",
                None,
                f"born {m.born_host}",
            )
        )
    order = {"send": 0, "store": 1, "end-transaction": 2, "consume": 3}
    rows.sort(key=lambda s: (s.timestamp_ms, order.get(s.step, 4)))
    return rows
