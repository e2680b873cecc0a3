"""Producer: sync, async, oneway and batch sends with Kafka-style auto-batching, an idempotent
sequence per queue, retries on the new leader and avoidance of broker groups that just failed.

This module is the facade: it checks arguments, builds messages and chooses each message's
queue; sender.py buffers, sends and retries (up to max_inflight_per_queue batches per queue in
flight, a retried batch keeps its queue and sequences), by the pure rule in retry.py. No
network call happens here except the route look-ups of queue choice. Sends go over the framed
data path where the leader offers one (client/data_pool.py), over gRPC otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import operator
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TypeVar, cast

from raftmq.client.accumulator import Accumulator
from raftmq.client.data_pool import DataPool
from raftmq.client.messages import OutgoingMessage, SendResult
from raftmq.client.producer.outcome import Outcome, PartsOutcome
from raftmq.client.producer.sender import Bodies, Item, Pending, Sender, SenderConfig
from raftmq.client.queue_selector import PublishQueues, select_by_key
from raftmq.client.routes import ChannelPool, RouteCache, monotonic_ms
from raftmq.client.trace import TraceSender, default_client_id, sends_hook
from raftmq.common import stored_batch, tls
from raftmq.common.arguments import checked
from raftmq.common.auth import Credentials
from raftmq.common.delay import (
    DelayFor,
    DelayLevel,
    DelayPolicy,
    DelaySpec,
    DeliverAt,
    delay_to_properties,
)
from raftmq.common.errors import (
    InvalidArgumentError,
    InvalidMessageError,
    MessageTooLargeError,
    NoRouteError,
    OutcomeUnknownError,
    RaftMQError,
)
from raftmq.common.message import (
    Message,
    MessageLimits,
    ValidNames,
    check_message_types,
    validate_message,
    validate_producer_id,
    validate_topic,
)
from raftmq.common.stored_batch import BodyColumn
from raftmq.common.types import QueueRef

__all__ = ["Producer", "QueueSelector", "SendCallback", "SendOptions"]

log = logging.getLogger("raftmq.producer")

MIB = 1 << 20
MAX_CHECKED_TOPICS = 4096  # topic names remembered as valid (cleared whole when full)
SendCallback = Callable[[SendResult | None, RaftMQError | None], None]
# RocketMQ's MessageQueueSelector: given the topic's writable queues (sorted), the one to use.
QueueSelector = Callable[[Sequence[QueueRef]], QueueRef]


def _wrong(argument: str, expected: str, value: object) -> str:
    return f"argument {argument!r} must be {expected}, not {type(value).__name__} ({value!r:.60})"


@dataclass(frozen=True, slots=True)
class SendOptions:
    """The keyword arguments of one send: the message's attributes and how its queue is chosen
    (at most one of sharding_key, queue_selector, queue; none means sticky round robin)."""

    tags: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] | None = None
    sharding_key: str | None = None
    queue_selector: QueueSelector | None = None
    queue: QueueRef | None = None
    delay: DelaySpec | None = None  # delayed delivery (RocketMQ 4 level or RocketMQ 5 timer)

    def __post_init__(self) -> None:
        # Cheap isinstance checks on the per-message path (tags, keys and properties are checked
        # with the message); a wrong type is the caller's fault, named.
        if self.sharding_key is not None and not isinstance(self.sharding_key, str):
            raise InvalidArgumentError(_wrong("sharding_key", "a str or None", self.sharding_key))
        if self.queue_selector is not None and not callable(self.queue_selector):
            raise InvalidArgumentError(_wrong("queue_selector", "a callable", self.queue_selector))
        if self.queue is not None and not isinstance(self.queue, QueueRef):
            raise InvalidArgumentError(_wrong("queue", "a QueueRef or None", self.queue))

    def delay_properties(self) -> Mapping[str, str] | None:
        if self.delay is None:
            return self.properties
        return {**(self.properties or {}), **delay_to_properties(self.delay)}

    @property
    def movable(self) -> bool:
        """Nothing pins the message to a queue, so it may move to another broker group."""
        return self.sharding_key is None and self.queue_selector is None and self.queue is None


_R = TypeVar("_R")
PLAIN_SEND = SendOptions()  # a body without tag, keys or properties


class Producer:
    """A context manager; thread-safe. `send()` blocks for the result, `send_async()` returns a
    Future, `send_oneway()` returns at once and only logs failures. `send_async(callback=...)`
    runs the callback on the producer's callback thread, in completion order; callbacks added
    to the returned Future yourself run on the I/O thread that completed it: keep them short and
    never block in them (no send() there).

    Every message has its outcome within `send_timeout_ms` of entering the buffer (Kafka's
    delivery.timeout.ms; entering may block up to `max_block_ms` when the buffer is full), time
    spent waiting behind an earlier request of its queue included. A failure is
    OutcomeUnknownError when the message may be stored; any other error means it is not.

    Throughput: up to `max_inflight_per_queue` batches of a queue are in flight at once (5, as
    Kafka's idempotent producer; 1 without idempotence, which keeps the order otherwise), and
    the batches bound for one leader travel together, `max_inflight_requests` requests at a
    time per leader; what arrives meanwhile joins the next request."""

    @checked
    def __init__(
        self,
        namesrv_addresses: str | Sequence[str],
        *,
        producer_id: str | None = None,
        idempotent: bool = True,
        send_timeout_ms: int = 10_000,
        request_timeout_ms: int = 2_000,
        retries: int = 100,  # attempts per request; the send timeout bounds them first
        retry_backoff_ms: int = 50,
        linger_ms: float = 0.0,
        batch_max_messages: int = 1024,
        batch_max_bytes: int = 1 * MIB,
        max_buffered_messages: int = 100_000,
        max_buffered_bytes: int = 64 * MIB,
        max_block_ms: int = 10_000,
        max_message_bytes: int = 4 * MIB,
        route_refresh_ms: int = 30_000,
        sticky_messages: int = 32,
        delay_policy: DelayPolicy | None = None,
        allow_system_topics: bool = False,
        trace: bool = False,
        max_inflight_per_queue: int = 5,
        max_inflight_requests: int = 2,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        if not 1 <= batch_max_messages <= 4096:
            raise InvalidArgumentError("batch_max_messages must be within 1..4096")
        if retries < 0 or send_timeout_ms <= 0 or linger_ms < 0 or batch_max_bytes <= 0:
            raise InvalidArgumentError(
                "retries and linger_ms must be >= 0, send_timeout_ms and batch_max_bytes > 0"
            )
        if request_timeout_ms <= 0:
            raise InvalidArgumentError("request_timeout_ms must be > 0")
        if not 1 <= max_inflight_per_queue <= 5:
            raise InvalidArgumentError("max_inflight_per_queue must be within 1..5")
        if not 1 <= max_inflight_requests <= 64:
            raise InvalidArgumentError("max_inflight_requests must be within 1..64")
        if max_block_ms < 0 or sticky_messages < 1:
            raise InvalidArgumentError("max_block_ms must be >= 0, sticky_messages >= 1")
        self.producer_id = producer_id or f"p-{uuid.uuid4().hex}"
        validate_producer_id(self.producer_id)
        self.idempotent = idempotent
        # The SDK's copy of the delay rules, to fail early; the broker's own are authoritative.
        self._delay_policy = delay_policy or DelayPolicy()
        self._timeout_s = send_timeout_ms / 1000
        self._linger_s = linger_ms / 1000
        self._max_block_s = max_block_ms / 1000
        self._max_message_bytes = max_message_bytes
        self._tls = tls.client_tls(tls_ca, tls_cert, tls_key)  # RAFTMQ_TLS_* if none
        self._pool = ChannelPool(tls_config=self._tls, credentials=credentials)
        self._data = DataPool(
            tls_config=self._tls, name="raftmq-producer-data", credentials=credentials
        )
        self.routes = RouteCache(
            namesrv_addresses, self._pool, refresh_interval_ms=route_refresh_ms
        )
        config = SenderConfig(
            producer_id=self.producer_id,
            idempotent=idempotent,
            send_timeout_s=self._timeout_s,
            # One attempt's deadline (Kafka's request.timeout.ms): a leader cut off by a silent
            # partition never answers, and waiting the whole send timeout on it would stall the
            # queue for that long; after this the attempt is retried (same sequence) elsewhere.
            request_timeout_s=min(request_timeout_ms, send_timeout_ms) / 1000,
            max_attempts=retries + 1,
            backoff_s=retry_backoff_ms / 1000,
            linger_s=self._linger_s,
            max_block_s=self._max_block_s,
            max_inflight_requests=max_inflight_requests,
        )
        accumulator: Accumulator[Item] = Accumulator(
            linger_ms=math.ceil(linger_ms),  # the accumulator counts whole ms
            batch_max_messages=batch_max_messages,
            batch_max_bytes=batch_max_bytes,
            max_buffered_messages=max_buffered_messages,
            max_buffered_bytes=max_buffered_bytes,
            # Several batches per queue keep their order only through the broker's sequence
            # check, which needs the idempotent producer (Kafka's rule too).
            max_inflight_per_queue=max_inflight_per_queue if idempotent else 1,
            seal_on_send=True,
            count_of=operator.attrgetter("count"),  # a batch call's bodies are one item
        )
        self._batch_max_messages, self._batch_max_bytes = batch_max_messages, batch_max_bytes
        self._sender = Sender(config, accumulator, self.routes, self._data)
        # User callbacks run here, never on the I/O loop (a send() in one would deadlock it).
        self._callbacks = ThreadPoolExecutor(1, thread_name_prefix="raftmq-producer-callback")
        self._sticky_lock = threading.Lock()  # guards _sticky
        # topic -> (queue, sends left, the publish queues it was chosen from)
        self._sticky: dict[str, tuple[QueueRef, int, PublishQueues]] = {}
        # Topic names already checked by validate_topic (asked once per message), bounded. The
        # SDK's own producers (dead letters, traces) write system topics; users cannot.
        self._topics_ok = ValidNames(
            functools.partial(validate_topic, allow_system=allow_system_topics), MAX_CHECKED_TOPICS
        )
        self._sticky_messages = sticky_messages
        self._host = socket.gethostname()
        self._limits = MessageLimits(max_message_bytes=self._max_message_bytes)
        # Message trace (issue 16): off by default; records go out on a thread of their own.
        # One hook per settled request (batch), never per message.
        self._tracer: TraceSender | None = TraceSender(namesrv_addresses) if trace else None
        if self._tracer is not None:
            self._sender.on_settled = sends_hook(
                self._tracer, self.producer_id, default_client_id()
            )

    # ---- public API ---------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        queue_selector: QueueSelector | None = None,
        queue: QueueRef | None = None,
        delay_level: int | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> SendResult:
        """Send and wait for the result (stored on a majority of the group).

        Delayed delivery, at most one of: `delay_level` (RocketMQ 4's levels, 1..18 by default:
        1s 5s 10s 30s 1m ... 2h), `delay_ms` (deliver this long after it is stored),
        `deliver_at_ms` (at this time, ms since the epoch; up to the broker's horizon, 7 days by
        default). A delayed message's result has queue_offset -1: it gets its offset when due.
        A bad delay raises InvalidDelayError before anything is sent."""
        self._refuse_blocking("send()")
        spec = self._delay(delay_level, delay_ms, deliver_at_ms)
        options = SendOptions(tags, keys, properties, sharding_key, queue_selector, queue, spec)
        return self._wait(self._send(topic, body, options))

    def send_async(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        queue_selector: QueueSelector | None = None,
        queue: QueueRef | None = None,
        callback: SendCallback | None = None,
        delay_level: int | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> Future[SendResult]:
        """A future of the result; `callback(result, error)` runs when it is known. Messages
        with the same `sharding_key` go to the same queue, in order; `queue_selector` picks the
        queue itself; `queue` names it. The delay arguments are send()'s."""
        spec = self._delay(delay_level, delay_ms, deliver_at_ms)
        options = SendOptions(tags, keys, properties, sharding_key, queue_selector, queue, spec)
        return self._send(topic, body, options, callback)

    def send_oneway(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        queue_selector: QueueSelector | None = None,
        queue: QueueRef | None = None,
        delay_level: int | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> None:
        """Send without waiting for (or reporting) the outcome; failures are only logged."""
        spec = self._delay(delay_level, delay_ms, deliver_at_ms)
        options = SendOptions(tags, keys, properties, sharding_key, queue_selector, queue, spec)
        self._send(topic, body, options).add_done_callback(_log_oneway_failure)

    @checked
    def send_batch(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes],
        *,
        sharding_key: str | None = None,
        queue_selector: QueueSelector | None = None,
        queue: QueueRef | None = None,
    ) -> Sequence[SendResult]:
        """Store `messages` together in one queue, in order (RocketMQ's batch send)."""
        self._refuse_blocking("send_batch()")
        fut = self.send_batch_future(
            topic, messages, sharding_key=sharding_key, queue_selector=queue_selector, queue=queue
        )
        return self._wait(fut)

    @checked
    def send_batch_async(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes],
        *,
        sharding_key: str | None = None,
        queue_selector: QueueSelector | None = None,
        queue: QueueRef | None = None,
    ) -> list[Future[SendResult]]:
        """One future per message. The messages stay together in one queue (never moved to
        another group apart), in order; more than batch_max_messages go in several requests."""
        if not messages:
            return []
        futures: list[Future[SendResult]] = [Future() for _ in messages]
        placement = SendOptions(
            sharding_key=sharding_key, queue_selector=queue_selector, queue=queue
        )
        self._enqueue_together(topic, messages, futures, placement)
        return futures

    @checked
    def send_batch_future(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes] | Sequence[BodyColumn],
        *,
        sharding_key: str | None = None,
        queue_selector: QueueSelector | None = None,
        queue: QueueRef | None = None,
    ) -> Future[Sequence[SendResult]]:
        """The batch-first call: `messages` stored together in one queue, in order, with ONE
        future for all of them (a sequence of results in order, each made when it is read), for
        a caller with many messages at hand; no future or lock per message. It fails with the
        first failed message's typed error (messages before it may be stored). More than
        batch_max_messages (or batch_max_bytes) go in several requests of the same queue.

        Bare `bytes` bodies are the fast form (issue 24): the call's bodies travel as one
        buffered item per request, encoded in one call, answered per request. BodyColumns
        (bodies in an Arrow binary column's buffers, the Spark sink's form) are the same
        without a bytes object per body: each stands for its rows, in order, and is read from
        its buffers when its request is encoded (do not change them before the future is
        done)."""
        placement = SendOptions(
            sharding_key=sharding_key, queue_selector=queue_selector, queue=queue
        )
        kinds = set(map(type, messages))
        if kinds == {BodyColumn}:
            return self._enqueue_columns(topic, cast(Sequence[BodyColumn], messages), placement)
        if BodyColumn in kinds:
            raise InvalidArgumentError("a batch call takes BodyColumns alone, not among messages")
        bare = cast(Sequence[OutgoingMessage | bytes], messages)
        if kinds == {bytes}:
            return self._enqueue_bodies(topic, cast(Sequence[bytes], bare), placement)
        outcome = PartsOutcome(len(bare))
        if not bare:
            return outcome.future
        self._enqueue_together(topic, bare, outcome.slots(), placement)
        return outcome.future

    def _enqueue_bodies(
        self, topic: str, messages: Sequence[bytes], placement: SendOptions
    ) -> Future[Sequence[SendResult]]:
        """The batch call of bare bodies: checked as a list (type, size, not empty: C loops,
        no Python step per body), cut into parts that each fit one request, and buffered as
        one item per part."""
        if self._sender.closed:
            raise InvalidArgumentError("the producer is closed")
        # A snapshot (one copy of the references): the bodies are encoded when their request
        # leaves, and a caller may reuse its list the moment the call returns.
        bodies = cast(tuple[bytes, ...], tuple(messages))  # every item is bytes, checked above
        sizes = list(map(len, bodies))
        if min(sizes) == 0:
            raise InvalidMessageError(f"message body is empty (message {sizes.index(0)})")
        biggest = max(sizes)
        if biggest > self._max_message_bytes:
            raise MessageTooLargeError.for_size(biggest, self._max_message_bytes)
        target = self._choose_queue(topic, placement)
        cuts = _cut(sizes, self._batch_max_messages, self._batch_max_bytes)
        outcome = PartsOutcome(len(cuts))
        born_ms = time.time_ns() // 1_000_000  # one clock read for the whole call
        items: list[Item] = []
        for part, (lo, hi, size) in zip(outcome.parts(), cuts, strict=True):
            chunk = bodies if hi - lo == len(bodies) else bodies[lo:hi]
            items.append(Bodies(topic, chunk, born_ms, self._host, part, size, hi - lo))
        self._sender.enqueue(target, items)
        return outcome.future

    def _enqueue_columns(
        self, topic: str, columns: Sequence[BodyColumn], placement: SendOptions
    ) -> Future[Sequence[SendResult]]:
        """_enqueue_bodies for body columns: the columns' offsets checked in C (no object per
        body), the call cut into parts that each fit one request (a part may span columns: one
        buffered item per column piece, all handed over at once, so a part that fits one request
        is sent as one)."""
        if self._sender.closed:
            raise InvalidArgumentError("the producer is closed")
        runs = [c for c in columns if len(c)]
        if not runs:
            return PartsOutcome(0).future
        measured = [stored_batch.body_sizes(c) for c in runs]  # (total, smallest, biggest)
        if min(m[1] for m in measured) == 0:
            at = next(i for i, b in enumerate(b for c in runs for b in c) if not b)
            raise InvalidMessageError(f"message body is empty (message {at})")
        biggest = max(m[2] for m in measured)
        if biggest > self._max_message_bytes:
            raise MessageTooLargeError.for_size(biggest, self._max_message_bytes)
        count, total = sum(map(len, runs)), sum(m[0] for m in measured)
        if count <= self._batch_max_messages and total <= self._batch_max_bytes:
            cuts = [(0, count, total)]
        else:  # the uncommon call past one request: its sizes, one Python step per body
            cuts = _cut([len(b) for c in runs for b in c], self._batch_max_messages,
                        self._batch_max_bytes)  # fmt: skip
        if len(cuts) == 1:
            pieces = [[(c, m[0]) for c, m in zip(runs, measured, strict=True)]]
        else:
            pieces = [_pieces(runs, lo, hi) for lo, hi, _ in cuts]
        outcome = PartsOutcome(sum(map(len, pieces)))
        futures = iter(outcome.parts())
        born_ms = time.time_ns() // 1_000_000  # one clock read for the whole call
        items: list[Item] = [
            Bodies(topic, col, born_ms, self._host, next(futures), size, len(col))
            for part in pieces
            for col, size in part
        ]
        self._sender.enqueue(self._choose_queue(topic, placement), items)
        return outcome.future

    def _enqueue_together(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes],
        outcomes: Iterable[Outcome],
        placement: SendOptions,
    ) -> None:
        """The batch calls' common step: every message checked and given its outcome, then all
        handed to the sender for one queue, so they stay together and in order."""
        if self._sender.closed:
            raise InvalidArgumentError("the producer is closed")
        born_ms = time.time_ns() // 1_000_000  # one clock read for the whole batch
        pendings = []
        for m, out in zip(messages, outcomes, strict=True):
            if isinstance(m, OutgoingMessage):
                msg = self._message(topic, m.body, SendOptions(m.tags, m.keys, m.properties))
            else:
                msg = self._plain_message(topic, m, born_ms)
            pendings.append(Pending(msg, out, len(msg.body), False))
        self._sender.enqueue(self._choose_queue(topic, placement), pendings)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every buffered message has an outcome; False on timeout."""
        self._refuse_blocking("flush()")
        return self._sender.flush(timeout_s)

    @property
    def throttle_ms(self) -> int:
        """How long brokers have held this producer's answers for its user's produce quota
        (issue 27), in total: the quota slows sends by itself; this says by how much."""
        return self._sender.throttle_ms

    def close(self, timeout_s: float = 30.0) -> None:
        """Send what is buffered (waiting up to timeout_s for outcomes), then release it all."""
        if self._sender.closed:
            return
        self.flush(timeout_s)
        self._sender.close()
        if self._tracer is not None:
            self._tracer.close()  # after the sends: their traces are in its buffer
        self._data.close()
        self._callbacks.shutdown(wait=True)
        self._pool.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(
        self,
        topic: str,
        body: bytes,
        options: SendOptions,
        callback: SendCallback | None = None,
    ) -> Future[SendResult]:
        fut: Future[SendResult] = Future()
        if callback is not None:
            fut.add_done_callback(self._on_callback_thread(_callback_adapter(callback)))
        self._send_into(topic, body, options, fut)
        return fut

    def _send_into(self, topic: str, body: bytes, options: SendOptions, outcome: Outcome) -> None:
        """Check, place and buffer one message whose outcome goes to `outcome` (the asyncio
        face passes a LoopSlot: no concurrent Future per message)."""
        if type(topic) is not str:  # the asyncio face comes here without @checked
            raise InvalidArgumentError(_wrong("topic", "a str", topic))
        msg = self._message(topic, body, options)
        target = self._choose_queue(topic, options)
        pending = Pending(msg, outcome, len(msg.body), options.movable, options.delay is not None)
        self._sender.enqueue(target, [pending])

    def _on_callback_thread(
        self, fn: Callable[[Future[SendResult]], None]
    ) -> Callable[[Future[SendResult]], None]:
        def hop(fut: Future[SendResult]) -> None:
            try:
                self._callbacks.submit(fn, fut)
            except RuntimeError:  # closed: run it here rather than lose it
                fn(fut)

        return hop

    def _refuse_blocking(self, call: str) -> None:
        """A blocking call on the loop that delivers the answers (an AsyncProducer's, or a
        done-callback on the I/O thread) could only wait out its timeout: refused at once."""
        if self._data.on_loop_thread():
            raise InvalidArgumentError(
                f"{call} would block the event loop that delivers its answer; on that loop "
                "use send_async() or the AsyncProducer's awaitables (await send(), flush(), "
                "close())"
            )

    def _wait(self, fut: Future[_R]) -> _R:
        # Bounded: the request's own deadline settles it long before this one.
        limit_s = self._max_block_s + self._linger_s + 2 * self._timeout_s + 5
        try:
            return fut.result(timeout=limit_s)
        except FutureTimeout:
            raise OutcomeUnknownError(
                f"no outcome within {limit_s:.0f} s; the message may or may not be stored"
            ) from None

    def _delay(
        self, level: int | None, delay_ms: int | None, deliver_at_ms: int | None
    ) -> DelaySpec | None:
        """The delay asked for, checked now by the SDK's copy of the rules (the broker checks
        again with its own levels and horizon): InvalidDelayError names the allowed range."""
        given = [
            (n, v)
            for n, v in (
                ("delay_level", level),
                ("delay_ms", delay_ms),
                ("deliver_at_ms", deliver_at_ms),
            )
            if v is not None
        ]
        if not given:
            return None
        if len(given) > 1:
            raise InvalidArgumentError(
                f"give at most one of delay_level, delay_ms, deliver_at_ms, not "
                f"{' and '.join(n for n, _ in given)}"
            )
        name, value = given[0]
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgumentError(_wrong(name, "an int (ms or a level)", value))
        spec: DelaySpec
        if name == "delay_level":
            if value == 0:
                return None  # RocketMQ: level 0 is "not delayed"
            spec = DelayLevel(value)
        elif name == "delay_ms":
            spec = DelayFor(value)
        else:
            spec = DeliverAt(value)
        self._delay_policy.due_ms(spec, time.time_ns() // 1_000_000)
        return spec

    # ---- choosing a queue ---------------------------------------------------------------------

    def _message(self, topic: str, body: bytes, options: SendOptions) -> Message:
        """The message as it will be stored, checked here: a v2 stored batch goes to disk as
        the producer encoded it (issue 24), the broker checks only what its header says."""
        if self._sender.closed:
            raise InvalidArgumentError("the producer is closed")
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"a message body must be bytes, not {type(body).__name__}")
        if len(body) > self._max_message_bytes:
            raise MessageTooLargeError.for_size(len(body), self._max_message_bytes)
        keys, tags, props = options.keys, options.tags, options.properties
        if isinstance(keys, str):
            raise InvalidArgumentError("keys must be a sequence of strings, not one string")
        if tags is not None or keys != () or props is not None:  # a plain body has none to check
            check_message_types(tags, keys, props)  # before tuple(keys)
        msg = Message(
            topic,
            bytes(body),
            tags,
            tuple(keys),
            dict(props) if props else {},
            0,
            time.time_ns() // 1_000_000,
            self._host,
        )
        if tags is not None or keys or props:
            validate_message(msg, self._limits, allow_system_topic=True)  # the user's part
        elif not body:
            raise InvalidMessageError("message body is empty")
        if options.delay is not None:  # reserved names the broker reads (not the user's)
            msg = dataclasses.replace(msg, properties=dict(options.delay_properties() or {}))
        return msg

    def _plain_message(self, topic: str, body: bytes, born_ms: int) -> Message:
        """A body without tag, keys or properties (a batch call's bytes item): _message's
        checks of a body, without those of the fields it lacks; the caller checked the
        producer is open and read the clock once for its batch."""
        if type(body) is not bytes:
            if not isinstance(body, (bytearray, memoryview)):
                raise InvalidArgumentError(
                    f"a message body must be bytes, not {type(body).__name__}"
                )
            body = bytes(body)
        if len(body) > self._max_message_bytes:
            raise MessageTooLargeError.for_size(len(body), self._max_message_bytes)
        if not body:
            raise InvalidMessageError("message body is empty")
        return Message(topic, body, None, (), {}, 0, born_ms, self._host)

    def _choose_queue(self, topic: str, options: SendOptions) -> QueueRef:
        self._topics_ok.check(topic)
        sharding_key, queue_selector, queue = (
            options.sharding_key,
            options.queue_selector,
            options.queue,
        )
        chosen_by = (sharding_key is not None) + (queue_selector is not None) + (queue is not None)
        if chosen_by > 1:
            raise InvalidArgumentError("give at most one of sharding_key, queue_selector, queue")
        if queue is not None:
            if queue.topic != topic:
                raise InvalidArgumentError(f"queue {queue} is not a queue of topic {topic!r}")
            return queue
        try:
            route = self.routes.route(topic)
        except NoRouteError:
            if sharding_key is not None or queue_selector is not None:
                raise
            return self._first_send_queue(topic)
        queues = route.publish_queues()
        if sharding_key is not None:
            return select_by_key(queues, sharding_key)
        if queue_selector is not None:
            chosen = queue_selector(queues.queues)
            if chosen not in queues.queues:
                raise InvalidArgumentError(
                    f"the queue selector chose {chosen}, which is not a writable queue of "
                    f"topic {topic!r}"
                )
            return chosen
        return self._sticky_queue(topic, queues)

    def _sticky_queue(self, topic: str, queues: PublishQueues) -> QueueRef:
        """Kafka's uniform sticky partitioning (KIP-794): unkeyed sends stay on one queue for
        `sticky_messages` sends, so concurrent sends share requests instead of spreading one
        message per request over every queue; then the next queue, round robin, avoiding groups
        that just failed. Over time every queue gets the same share."""
        now = monotonic_ms()
        with self._sticky_lock:
            current = self._sticky.get(topic)
            if current is not None:
                q, left, chosen_from = current
                # The same route object: its queues cannot have changed (no list search).
                if (
                    left > 1
                    and (chosen_from is queues or q in queues.queues)
                    and self._sender.is_available(q.broker_group, now)
                ):
                    self._sticky[topic] = (q, left - 1, queues)
                    return q
            chosen = self._sender.select(queues, now)
            self._sticky[topic] = (chosen, self._sticky_messages, queues)
            return chosen

    def _first_send_queue(self, topic: str) -> QueueRef:
        """No NameServer knows the topic yet: send to some group's leader, which creates it if
        its auto_create_topic is on (RocketMQ's autoCreateTopicEnable) or says it does not
        exist. The group registers the new topic, so later sends find a route."""
        leaders = sorted(
            (g.broker_group, g.leader_address)
            for c in self.routes.cluster_info().clusters
            for g in c.groups
            if g.leader_address
        )
        if not leaders:
            raise NoRouteError.for_topic(topic, self.routes.namesrv_addresses)
        group, address = leaders[self._sender.next_index() % len(leaders)]
        self._sender.hint_leader(group, address)
        return QueueRef(topic, group, 0)


def _cut(sizes: list[int], max_messages: int, max_bytes: int) -> list[tuple[int, int, int]]:
    """(start, end, bytes) of consecutive parts of at most `max_messages` messages and
    `max_bytes` bytes each (one message over `max_bytes` alone), the accumulator's own greedy
    rule: each part fits one request."""
    total = sum(sizes)
    if len(sizes) <= max_messages and total <= max_bytes:
        return [(0, len(sizes), total)]
    cuts: list[tuple[int, int, int]] = []
    lo = size = 0
    for i, n in enumerate(sizes):
        if i > lo and (i - lo >= max_messages or size + n > max_bytes):
            cuts.append((lo, i, size))
            lo, size = i, 0
        size += n
    cuts.append((lo, len(sizes), size))
    return cuts


def _pieces(runs: Sequence[BodyColumn], lo: int, hi: int) -> list[tuple[BodyColumn, int]]:
    """Messages lo..hi of the columns laid end to end, as (column piece, its body bytes)."""
    out: list[tuple[BodyColumn, int]] = []
    at = 0
    for col in runs:
        a, b = max(lo - at, 0), min(hi - at, len(col))
        if a < b:
            piece = col[a:b]
            out.append((piece, stored_batch.body_sizes(piece)[0]))
        at += len(col)
    return out


def _callback_adapter(cb: SendCallback) -> Callable[[Future[SendResult]], None]:
    def done(fut: Future[SendResult]) -> None:
        exc = fut.exception()
        try:
            if exc is None:
                cb(fut.result(), None)
            elif isinstance(exc, RaftMQError):
                cb(None, exc)
            else:
                cb(None, OutcomeUnknownError(f"send failed: {exc}"))
        except Exception:
            log.exception("producer.callback_failed")

    return done


def _log_oneway_failure(fut: Future[SendResult]) -> None:
    exc = fut.exception()
    if exc is not None:
        log.warning("producer.oneway_failed error=%s", exc)
