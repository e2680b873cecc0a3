"""The producer's sender: buffers messages per queue (client/accumulator.py), keeps up to
`max_inflight_per_queue` batches per queue in flight (strict sequences keep their order at the
broker), and drives each batch through its attempts (retry on the new leader, move to another
group, fail) by the pure rule in retry.py.

Batches go over the framed data path (client/data_pool.py), the SDK's one data transport:
batches bound for one leader wait in its outbox until the pool's loop thread flushes it as one
SEND_STORED frame of v2 stored batches (SEND_BATCHES for delayed messages and older brokers; one
Raft entry on the leader, one chunk per batch), sealing each batch with what arrived for its
queue meanwhile. No thread waits for the answer: its callback runs on the loop thread and does
only non-blocking work (results, the queue's next batch when its leader is known); failures and
anything that may look up routes go to the timer thread. A leader without a data address is an
unavailable broker (retried after a route refresh).

A retried request keeps its queue and sequence numbers, so the broker stores it once whatever
happened to an earlier attempt; only a request that surely never reached a broker may move to
another broker group. It never chooses a queue for a new message (the Producer does).
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import ClassVar

from google.protobuf.message import Message as PbMessage

from raftmq.client import data_pool
from raftmq.client.accumulator import Accumulator, Batch
from raftmq.client.data_pool import DataPool, no_data_address
from raftmq.client.messages import SendResult, StoredRun
from raftmq.client.producer.outcome import Outcome, RunOutcome, Settled
from raftmq.client.producer.retry import (
    Next,
    after_failure,
    final_error,
    retry_delay_s,
)
from raftmq.client.queue_selector import FaultTable, PublishQueues, select_queue
from raftmq.client.routes import RouteCache, monotonic_ms
from raftmq.client.scheduler import Scheduler
from raftmq.common import stored_batch, stored_send, timeline
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    NoRouteError,
    NotLeaderError,
    OutcomeUnknownError,
    OutOfOrderSequenceError,
    QueueFullError,
    RaftMQError,
    RequestTimeoutError,
    UnsupportedError,
)
from raftmq.common.frame import error_from_detail
from raftmq.common.message import Message, msg_id_prefix
from raftmq.common.pb import broker_pb2, common_pb2
from raftmq.common.record_batch import MalformedBatchError, ProducerSequence
from raftmq.common.stored_send import BATCH_VERSION_DETAIL, BatchAnswer
from raftmq.common.types import QueueRef

log = logging.getLogger("raftmq.producer")

FRAME_MAX_BATCHES = 1024  # queue batches in one SEND_BATCHES frame
FRAME_MAX_BYTES = 4 << 20  # message bytes in one frame (the broker takes 8 MiB frames)
_STAMP = timeline.process_stamp()  # None unless RAFTMQ_TIMELINE is set (bench/w2_timeline.py)


@dataclass(slots=True)
class Pending:
    """One message waiting for its outcome."""

    msg: Message
    future: Outcome  # a Future, a batch's Slot or an asyncio face's LoopSlot
    size: int
    movable: bool  # no sharding key and no chosen queue: may move to another group
    # Delayed: the leader stamps its due time into the v1 record (broker/delivery.py), so its
    # batch goes as SEND_BATCHES; every other batch goes as a v2 stored batch (SEND_STORED).
    v1_only: bool = False
    # When its outcome is due (Kafka's delivery.timeout.ms): set when it enters the buffer, so
    # time spent waiting behind an unanswered request on its queue counts too.
    deadline: float = 0.0
    count: ClassVar[int] = 1  # messages it stands for in the accumulator


@dataclass(slots=True)
class Bodies:
    """A batch-first call's bare bodies, or one part of them: ONE buffered item for all its
    messages (issue 24), which take `count` consecutive sequences and are encoded together by
    stored_batch.encode_bodies, with no Message, outcome or result object per message. The
    Producer cut the call into parts that each fit a batch, so an item is never split. The
    asyncio face's plain sends of one loop turn to one queue travel as one too (client/aio.py),
    each message with its own future behind the item's LoopPart."""

    topic: str
    bodies: Sequence[bytes]
    born_ms: int
    host: str
    future: RunOutcome
    size: int
    count: int
    # A batch call's messages stay in their queue together; the asyncio face's gathered plain
    # sends may move to another group when none of them chose its queue (as each alone could).
    movable: bool = False
    v1_only: ClassVar[bool] = False
    deadline: float = 0.0

    def messages(self) -> list[Message]:
        """The bodies as messages: for the v1 wire (older brokers) and batches mixed with
        single sends; never on the common path."""
        topic, born, host = self.topic, self.born_ms, self.host
        return [Message(topic, b, None, (), {}, 0, born, host) for b in self.bodies]


Item = Pending | Bodies  # what the sender buffers


@dataclass(slots=True)
class Request:
    """One send request and its attempts: always the same batch (queue and sequences)."""

    batch: Batch[Item]
    deadline: float
    attempts: int = 0
    started: float = 0.0
    address: str = ""
    maybe_stored: bool = False  # an attempt may have reached a broker: never move it

    @property
    def queue(self) -> QueueRef:
        return self.batch.queue

    @property
    def items(self) -> tuple[Item, ...]:
        return self.batch.items


@dataclass(frozen=True, slots=True)
class SenderConfig:
    """The sender's settings, in the units the Producer's arguments are converted to."""

    producer_id: str
    idempotent: bool
    send_timeout_s: float  # per message, from entering the buffer to its outcome
    request_timeout_s: float  # per attempt (Kafka's request.timeout.ms)
    max_attempts: int
    backoff_s: float
    linger_s: float
    max_block_s: float  # how long enqueue waits for buffer room
    # SEND_BATCHES frames in flight per leader (Kafka's max.in.flight.requests.per.connection):
    # while they are out, batches fill with what arrives, so fewer frames carry more.
    max_inflight_requests: int = 2


class Sender:
    """Thread-safe. `enqueue()` buffers messages for a queue and issues requests as batches fill
    or linger out; every message's future gets its outcome within the send timeout."""

    def __init__(
        self,
        config: SenderConfig,
        accumulator: Accumulator[Item],
        routes: RouteCache,
        data: DataPool,
    ) -> None:
        self.config = config
        self.routes = routes
        self._data = data
        self._acc = accumulator
        self._scheduler = Scheduler("raftmq-producer-timer")
        self._lock = threading.Condition()  # guards _acc and _faults
        self._counter = itertools.count()
        self._faults = FaultTable()
        self._leaders: dict[str, str] = {}  # broker group -> leader address (hints win)
        self._nodes: dict[str, tuple[str, ...]] = {}  # broker group -> every node, leader first
        # Framed batches waiting for the loop thread's flush, per leader data address.
        self._outbox_lock = threading.Lock()
        self._outbox: dict[str, list[Request]] = {}
        self._single_sends: set[str] = set()  # data addresses without SEND_BATCHES
        self._v1_batches: set[str] = set()  # data addresses without SEND_STORED
        # Called with each settled request's messages (every future done), on whichever thread
        # settled it (often the data pool's loop: it must not block). Message trace sets it.
        self.on_settled: Callable[[str, Sequence[Pending]], None] | None = None
        # Called after each settled request freed buffer room (any thread, never blocking): the
        # asyncio face's send() awaits room with it instead of blocking its loop.
        self.on_room: Callable[[], None] | None = None
        self._frames_out: dict[str, int] = {}  # data address -> frames in flight (loop thread)
        # figures for benchmarks and tests: SEND_BATCHES frames, the batches and messages in them
        self.frames_sent = 0
        self.batches_sent = 0
        self.messages_sent = 0
        # ms the brokers held our answers for this user's produce quota (issue 27): the quota
        # slows the producer by itself (answers come later); this says by how much
        self.throttle_ms = 0
        self.closed = False

    # ---- what the Producer's queue choice shares ------------------------------------------------

    def next_index(self) -> int:
        """The round-robin position, shared by every queue choice of this producer."""
        return next(self._counter)

    def is_available(self, broker_group: str, now_ms: int) -> bool:
        """False while `broker_group` is avoided after a slow or failed send."""
        # No lock: the table is copy-on-write, swapped whole (asked once per message).
        return self._faults.is_available(broker_group, now_ms)

    def select(self, queues: PublishQueues, now_ms: int) -> QueueRef:
        """The next queue round robin, avoiding groups that just failed."""
        with self._lock:
            return select_queue(queues, next(self._counter), self._faults, now_ms)

    def hint_leader(self, broker_group: str, address: str) -> None:
        self._leaders[broker_group] = address

    # ---- buffering ----------------------------------------------------------------------------

    def enqueue(self, target: QueueRef, items: Sequence[Item]) -> None:
        """Buffer `items` for `target`, waiting up to max_block_s for room (then QueueFull)."""
        n = len(items)
        if n == 1:
            count, size = items[0].count, items[0].size
        else:
            count, size = sum(it.count for it in items), sum(it.size for it in items)
        with self._lock:
            if not self._acc.has_room(count, size):
                self._wait_for_room(count, size)
            # the send timeout counts from entering the buffer; time.monotonic() is the clock
            # monotonic_ms() reads: one read per call
            now = time.monotonic()
            due = now + self.config.send_timeout_s
            for it in items:
                it.deadline = due
            pairs = [(items[0], size)] if n == 1 else [(it, it.size) for it in items]
            appended = self._acc.append(target, pairs, int(now * 1000))
        if appended.wake_at_ms is not None:
            self._scheduler.call_later(self.config.linger_s, lambda: self._linger_due(target))
        if appended.batch is not None:
            self._issue(self._request(appended.batch))

    def has_room(self, count: int, size: int) -> bool:
        """Whether `count` more messages of `size` bytes fit under the buffer's bounds now (an
        empty buffer's exception for one oversized request aside), read without the lock:
        advice for a caller that buffers on its own first; enqueue decides."""
        acc = self._acc
        return (
            acc.buffered_messages + count <= acc.max_buffered_messages
            and acc.buffered_bytes + size <= acc.max_buffered_bytes
        )

    def _wait_for_room(self, count: int, size: int) -> None:
        """Under the lock: wait up to max_block_s until `count` messages of `size` bytes fit,
        else QueueFullError."""
        deadline = time.monotonic() + self.config.max_block_s
        while not self._acc.has_room(count, size):
            # On the loop that delivers the answers (the asyncio face) waiting would only
            # block them: full is QueueFull at once there; AsyncProducer.send awaits room.
            if self._data.on_loop_thread():
                deadline = 0.0
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                raise QueueFullError(
                    f"{self._acc.buffered_messages} messages "
                    f"({self._acc.buffered_bytes} bytes) already wait to be sent "
                    f"(max_buffered_messages={self._acc.max_buffered_messages}, "
                    f"max_buffered_bytes={self._acc.max_buffered_bytes}); slow down or "
                    "raise them"
                )
            self._lock.wait(left)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every buffered message has an outcome; False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while self._acc.buffered_messages > 0:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._lock.wait(min(left, 1.0) if left is not None else 1.0)
        return True

    def close(self) -> None:
        """Stop the timer and the I/O threads; what is still buffered fails as not sent."""
        self.closed = True
        self._scheduler.close()
        # Batches still waiting in an outbox (their flush will not run once the loop stops)
        # end here; an earlier attempt of one may have stored it, which final_error says.
        with self._outbox_lock:
            waiting = [req for reqs in self._outbox.values() for req in reqs]
            self._outbox.clear()
        for req in waiting:
            err = BrokerUnavailableError("the producer was closed before the send completed")
            group = req.queue.broker_group
            self._finish(
                req,
                final_error(err, maybe_stored=req.maybe_stored, attempts=req.attempts, group=group),
            )

    def _request(self, batch: Batch[Item]) -> Request:
        # The send timeout is per message: a batch is due when its oldest message is.
        return Request(batch, min(it.deadline for it in batch.items))

    def _linger_due(self, target: QueueRef) -> None:
        with self._lock:
            batch = self._acc.due(target, monotonic_ms())
        if batch is not None:
            self._issue(self._request(batch))

    # ---- the attempts of one request ----------------------------------------------------------

    def _leader_of(self, topic: str, group: str, *, refresh: bool = False) -> str:
        if not refresh:
            hint = self._leaders.get(group)
            if hint:
                return hint
        leader = self.routes.leader(topic, group, refresh=refresh)
        self._leaders[group] = leader
        return leader

    def _issue(self, req: Request) -> None:
        if req.attempts == 0:
            fresh = self._expire(req)
            if fresh is None:
                return
            req = fresh
        req.attempts += 1
        req.started = time.monotonic()
        try:
            group = req.queue.broker_group
            refresh = req.attempts > 1 and group not in self._leaders
            req.address = self._leader_of(req.queue.topic, group, refresh=refresh)
        except RaftMQError as exc:
            self._failed(req, exc, maybe_stored=False)  # nothing left this process
            return
        if self.closed:  # an earlier attempt may have stored it
            err = BrokerUnavailableError("the producer was closed before the send completed")
            group = req.queue.broker_group
            self._finish(
                req,
                final_error(err, maybe_stored=req.maybe_stored, attempts=req.attempts, group=group),
            )
            return
        data_address = self.routes.data_address(req.address)
        if not data_address:  # nothing left this process: retried after a route refresh
            self._failed(req, no_data_address(req.address), maybe_stored=False)
            return
        self._post(data_address, req)

    def _wire(self, req: Request) -> broker_pb2.SendMessageRequest:
        """The batch as sent now (hold self._lock): strict unless it is its queue's oldest."""
        idempotent = self.config.idempotent
        return broker_pb2.SendMessageRequest(
            topic=req.queue.topic,
            queue_id=req.queue.queue_id,
            messages=[_to_pb(m) for m in _messages(req.items)],
            producer_id=self.config.producer_id if idempotent else "",
            first_sequence=req.batch.first_sequence if idempotent else 0,
            timeout_ms=int(self.config.request_timeout_s * 1000),
            strict_sequence=idempotent and not self._acc.is_oldest(req.batch),
        )

    def _stored(self, req: Request, strict: bool, version: int) -> bytes:
        """The batch as a stored batch of `version` (the one its leader's group accepts, as
        the data pool heard it): encoded once, stored on every node as these bytes."""
        items = req.items
        producer = None
        if self.config.idempotent:
            producer = ProducerSequence(self.config.producer_id, req.batch.first_sequence, strict)
        topic, queue_id = req.queue.topic, req.queue.queue_id
        bodies = [it for it in items if isinstance(it, Bodies)]
        if len(bodies) == len(items):  # the batch-first call's bodies: no Message per body
            runs = [(it.born_ms, it.bodies) for it in bodies]
            return stored_batch.encode_bodies(
                topic, queue_id, runs, producer, bodies[0].host, version
            )
        messages = _messages(items)
        host = messages[0].born_host
        return stored_batch.encode_batch(topic, queue_id, messages, producer, host, version)

    # ---- the framed path: one SEND_BATCHES frame per leader per flush ---------------------------

    def _post(self, data_address: str, req: Request) -> None:
        """Queue `req` for `data_address`'s next frame; the first one in wakes the loop."""
        if _STAMP is not None:
            _STAMP("sdk.post", req.batch.count)
        if data_address in self._single_sends:
            self._send_single(data_address, req)
            return
        with self._outbox_lock:
            box = self._outbox.get(data_address)
            if box is not None:
                box.append(req)
                return
            self._outbox[data_address] = [req]
        try:
            loop = self._data.loop
            if self._data.on_loop_thread():
                loop.call_soon(self._flush, data_address)
            else:
                loop.call_soon_threadsafe(self._flush, data_address)
        except (RaftMQError, RuntimeError):  # the pool (and its loop) closed meanwhile
            self._flush(data_address)

    def _flush(self, data_address: str) -> None:
        """Loop thread: seal every batch waiting for `data_address` and send them as frames."""
        if _STAMP is not None:
            _STAMP("sdk.flush", 0)
        if self._frames_out.get(data_address, 0) >= self.config.max_inflight_requests:
            return  # the outbox waits (and its open batches fill): the next answer flushes it
        with self._outbox_lock:
            reqs = self._outbox.pop(data_address, [])
        if not reqs:
            return
        more: list[Batch[Item]] = []
        frames: list[tuple[list[Request], list[broker_pb2.SendMessageRequest]]] = []
        stored: list[tuple[list[Request], list[bool]]] = []  # v2: requests, strict flags
        v1_only = data_address in self._v1_batches
        with self._lock:
            now_ms = monotonic_ms()
            size = stored_size = 0
            for req in reqs:
                req.batch, nxt = self._acc.seal(req.batch, now_ms)
                if nxt is not None:
                    more.append(nxt)
                if not v1_only and not any(it.v1_only for it in req.items):
                    if (
                        not stored
                        or len(stored[-1][0]) >= FRAME_MAX_BATCHES
                        or (stored_size + req.batch.size_bytes > FRAME_MAX_BYTES and stored[-1][0])
                    ):
                        stored.append(([], []))
                        stored_size = 0
                    stored[-1][0].append(req)
                    strict = self.config.idempotent and not self._acc.is_oldest(req.batch)
                    stored[-1][1].append(strict)
                    stored_size += req.batch.size_bytes
                    continue
                if (
                    not frames
                    or len(frames[-1][0]) >= FRAME_MAX_BATCHES
                    or (size + req.batch.size_bytes > FRAME_MAX_BYTES and frames[-1][0])
                ):
                    frames.append(([], []))
                    size = 0
                frames[-1][0].append(req)
                frames[-1][1].append(self._wire(req))
                size += req.batch.size_bytes
        now = time.monotonic()
        timeout_ms = int(self.config.request_timeout_s * 1000)
        version = self._data.batch_version(data_address) if stored else 0
        for batch_reqs, stricts in stored:  # encoded outside the lock: per batch, one call
            encoded: list[bytes] = []
            sendable: list[Request] = []
            for req, strict in zip(batch_reqs, stricts, strict=True):
                try:
                    encoded.append(self._stored(req, strict, version))
                    sendable.append(req)
                except ValueError as exc:  # a field the format cannot carry: never sent
                    self._finish(req, InvalidArgumentError(f"cannot encode the batch: {exc}"))
            if not sendable:
                continue
            payload = stored_send.request_parts(encoded, timeout_ms)  # written, not joined
            self._count_frame(data_address, sendable)
            raw = self._data.submit_raw(
                data_address, DataMethod.SEND_STORED, payload, self._left(sendable, now)
            )
            raw.add_done_callback(functools.partial(self._on_stored_answer, data_address, sendable))
        for batch_reqs, wires in frames:
            wire = broker_pb2.SendBatchesRequest(batches=wires, timeout_ms=timeout_ms)
            self._count_frame(data_address, batch_reqs)
            fut = self._data.submit(
                data_address, DataMethod.SEND_BATCHES, wire, self._left(batch_reqs, now)
            )
            fut.add_done_callback(
                functools.partial(self._on_batches_answer, data_address, batch_reqs)
            )
        for nxt in more:
            self._issue(self._request(nxt))

    def _left(self, reqs: list[Request], now: float) -> float:
        left = min(r.deadline for r in reqs) - now
        return max(0.05, min(left, self.config.request_timeout_s))

    def _count_frame(self, data_address: str, reqs: list[Request]) -> None:
        self.frames_sent += 1
        self._frames_out[data_address] = self._frames_out.get(data_address, 0) + 1
        self.batches_sent += len(reqs)
        self.messages_sent += sum(r.batch.count for r in reqs)

    def _on_stored_answer(self, data_address: str, reqs: list[Request], fut: Future[bytes]) -> None:
        """A SEND_STORED answer, on the loop thread: as a SEND_BATCHES answer is."""
        self._frames_out[data_address] -= 1
        try:
            self._on_stored_results(data_address, reqs, fut)
        finally:
            if self._outbox.get(data_address):
                self._flush(data_address)

    def _on_stored_results(
        self, data_address: str, reqs: list[Request], fut: Future[bytes]
    ) -> None:
        exc = fut.exception()
        if isinstance(exc, UnsupportedError):
            # A broker from before SEND_STORED (it stored nothing): SEND_BATCHES there.
            log.info("producer.v1_batches address=%s", data_address)
            self._v1_batches.add(data_address)
            for req in reqs:
                self._post(data_address, req)
            return
        if exc is not None:
            for req in reqs:
                self._frame_failed(req, exc)
            return
        try:
            answer = stored_send.decode_answer(fut.result())
        except MalformedBatchError as err:
            bad = OutcomeUnknownError(f"{data_address} answered SEND_STORED with garbage: {err}")
            for req in reqs:
                self._finish(req, bad)
            return
        if len(answer.results) != len(reqs):
            unknown = OutcomeUnknownError(
                f"broker answered {len(answer.results)} results for {len(reqs)} batches"
            )
            for req in reqs:
                self._finish(req, unknown)
            return
        group = answer.broker_group
        self.throttle_ms += answer.throttle_ms
        for req, r in zip(reqs, answer.results, strict=True):
            if r.error is not None:
                refused = error_from_detail(r.error)
                accepted = refused.details.get(BATCH_VERSION_DETAIL, "")
                if isinstance(refused, UnsupportedError) and accepted.isdigit():
                    # A member of the group does not read the version this batch was encoded
                    # in (it was refused whole, nothing stored): again, in the one it accepts.
                    log.info("producer.batch_version address=%s version=%s", data_address, accepted)
                    self._data.lower_batch_version(data_address, int(accepted))
                    self._post(data_address, req)
                    continue
                self._frame_failed(req, refused)
            else:
                self._answered_batch(req, r, group or req.queue.broker_group)

    def _send_single(self, data_address: str, req: Request) -> None:
        """One batch as one SEND_MESSAGE frame: for a broker without SEND_BATCHES."""
        with self._lock:
            req.batch, nxt = self._acc.seal(req.batch, monotonic_ms())
            wire = self._wire(req)
        left = max(0.05, min(req.deadline - time.monotonic(), self.config.request_timeout_s))
        fut = self._data.submit(data_address, DataMethod.SEND_MESSAGE, wire, left)
        fut.add_done_callback(lambda f: self._on_frame_answer(req, f))
        if nxt is not None:
            self._issue(self._request(nxt))

    def _on_batches_answer(
        self, data_address: str, reqs: list[Request], fut: Future[PbMessage]
    ) -> None:
        """A SEND_BATCHES answer, on the loop thread: each batch's result or error apart; then
        what waited for room in the leader's window of frames goes."""
        self._frames_out[data_address] -= 1
        try:
            self._on_batches_results(data_address, reqs, fut)
        finally:
            if self._outbox.get(data_address):
                self._flush(data_address)

    def _on_batches_results(
        self, data_address: str, reqs: list[Request], fut: Future[PbMessage]
    ) -> None:
        exc = fut.exception()
        if isinstance(exc, UnsupportedError):
            # A broker from before SEND_BATCHES (it stored nothing): one frame per batch there.
            # It also ignores strict sequences, so order per queue needs one batch in flight.
            log.info("producer.single_sends address=%s", data_address)
            self._single_sends.add(data_address)
            with self._lock:
                self._acc.max_inflight_per_queue = 1
            for req in reqs:
                self._send_single(data_address, req)
            return
        if exc is not None:
            for req in reqs:
                self._frame_failed(req, exc)
            return
        resp = fut.result()
        assert isinstance(resp, broker_pb2.SendBatchesResponse)
        self.throttle_ms += resp.throttle_ms
        if len(resp.results) != len(reqs):
            err = OutcomeUnknownError(
                f"broker answered {len(resp.results)} results for {len(reqs)} batches"
            )
            for req in reqs:
                self._finish(req, err)
            return
        group = resp.broker_group
        for req, r in zip(reqs, resp.results, strict=True):
            if r.HasField("error"):
                self._frame_failed(req, error_from_detail(r.error))
            else:
                answer = BatchAnswer(
                    r.count, r.first_offset, r.raft_index, r.slot, r.first_position, r.duplicate
                )
                self._answered_batch(req, answer, group or req.queue.broker_group)

    def _answered_batch(self, req: Request, r: BatchAnswer, group: str) -> None:
        """A batch stored (or found stored): ids derived from where it landed, as the broker
        derives them (common.message.encode_msg_id)."""
        latency_ms = int((time.monotonic() - req.started) * 1000)
        with self._lock:
            self._faults = self._faults.record(req.queue.broker_group, latency_ms, monotonic_ms())
        items = req.items
        if r.count != req.batch.count:
            self._finish(
                req,
                OutcomeUnknownError(
                    f"broker answered {r.count} results for {req.batch.count} messages"
                ),
            )
            return
        topic, queue_id = req.queue.topic, req.queue.queue_id
        # An empty prefix: a duplicate whose original the broker no longer remembers (no ids,
        # no offsets). first_offset -1 with a place in the log: stored, its queue offsets not
        # known yet (a delayed message gets them when it falls due). Each result derives its
        # id from the prefix when it is read (most never are).
        prefix = msg_id_prefix(group, r.raft_index, r.slot) if r.raft_index > 0 else ""
        pos, offset, dup = r.first_position, r.first_offset, r.duplicate
        k = 0  # the item's first message within the request
        for it in items:
            if it.future.done():
                pass
            elif isinstance(it, Bodies):
                first = offset + k if offset >= 0 else -1
                it.future.set_results(
                    StoredRun(prefix, topic, group, queue_id, first, pos + k, it.count, dup)
                )
            elif not prefix:
                it.future.set_result(SendResult("", topic, group, queue_id, -1, dup))
            else:
                it.future.set_result(
                    SendResult(
                        prefix,
                        topic,
                        group,
                        queue_id,
                        offset + k if offset >= 0 else -1,
                        dup,
                        id_position=pos + k,
                    )
                )
            k += it.count
        self._finish(req, None)

    def _expire(self, req: Request) -> Request | None:
        """`req` if its messages still have time; otherwise they fail without being sent (they
        waited out the send timeout behind an unanswered request on their queue), and so does
        every next batch of the queue that is also overdue. Never sent, so surely not stored:
        the sequences are handed out again and the error says so."""
        while req.deadline <= time.monotonic():
            err = RequestTimeoutError(
                f"{req.batch.count} message(s) for {req.queue} waited the whole send timeout "
                f"({self.config.send_timeout_s:.1f} s) in the producer behind an unanswered "
                "request and were not sent (not stored); the broker group may be unreachable "
                "from here: check `raftmq cluster status`, or raise send_timeout_ms"
            )
            nxt = self._settle(req, err, sent=False)
            if nxt is None:
                return None
            req = self._request(nxt)
        return req

    def _on_frame_answer(self, req: Request, fut: Future[PbMessage]) -> None:
        """The framed answer, on the data pool's loop thread: never block here."""
        exc = fut.exception()
        if exc is None:
            resp = fut.result()
            assert isinstance(resp, broker_pb2.SendMessageResponse)
            self.throttle_ms += resp.throttle_ms
            self._answered(req, resp)
            return
        self._frame_failed(req, exc)

    def _frame_failed(self, req: Request, exc: BaseException) -> None:
        """A framed attempt failed (loop thread): final if closed, else retried off the loop."""
        if isinstance(exc, RaftMQError):
            err, maybe = exc, data_pool.may_have_stored(exc)
        else:  # a bug below us: we cannot tell how far it got
            err = BrokerUnavailableError(f"send to {req.address} failed: {exc!r}")
            maybe = True
        if self.closed:  # no timer thread to retry on: the outcome is final now
            req.maybe_stored = req.maybe_stored or maybe
            group = req.queue.broker_group
            self._finish(
                req,
                final_error(err, maybe_stored=req.maybe_stored, attempts=req.attempts, group=group),
            )
            return
        # The failure path may look up routes (blocking): run it on the timer thread.
        self._scheduler.call_later(0, lambda: self._failed(req, err, maybe_stored=maybe))

    def _answered(self, req: Request, resp: broker_pb2.SendMessageResponse) -> None:
        """A broker's answer: every message's result, then the queue's next batch. Runs on the
        loop thread for framed sends, so nothing here may block."""
        latency_ms = int((time.monotonic() - req.started) * 1000)
        with self._lock:
            self._faults = self._faults.record(req.queue.broker_group, latency_ms, monotonic_ms())
        results = resp.results
        if len(results) != req.batch.count:
            self._finish(
                req,
                OutcomeUnknownError(
                    f"broker answered {len(results)} results for {req.batch.count} messages"
                ),
            )
            return
        topic, group = req.queue.topic, resp.broker_group or req.queue.broker_group
        made = [
            SendResult(r.msg_id, topic, group, r.queue_id, r.queue_offset, r.duplicate)
            for r in results
        ]
        k = 0
        for it in req.items:
            if it.future.done():
                pass
            elif isinstance(it, Bodies):
                it.future.set_results(made[k : k + it.count])
            else:
                it.future.set_result(made[k])
            k += it.count
        self._finish(req, None)

    def _failed(self, req: Request, err: RaftMQError, *, maybe_stored: bool) -> None:
        """An attempt failed; `maybe_stored` says whether it may have reached a broker's log
        (data_pool.may_have_stored)."""
        group = req.queue.broker_group
        if maybe_stored:
            req.maybe_stored = True
        log.debug(
            "producer.attempt_failed queue=%s address=%s attempt=%d left=%.2fs error=%s %s",
            req.queue,
            req.address,
            req.attempts,
            req.deadline - time.monotonic(),
            err.code,
            err.message,
        )
        if not isinstance(err, OutOfOrderSequenceError):  # the group is fine: not a fault
            with self._lock:
                self._faults = self._faults.record(group, 0, monotonic_ms(), failed=True)
        if isinstance(err, NotLeaderError):
            if err.leader_hint:
                self._leaders[group] = err.leader_hint
            else:
                self._leaders.pop(group, None)
                self.routes.invalidate(req.queue.topic)
        elif isinstance(
            err, (BrokerUnavailableError, RequestTimeoutError, OutcomeUnknownError, NoRouteError)
        ):
            # The leader may be dead: ask another node of the group next. A follower answers
            # NOT_LEADER with the new leader as soon as it knows one, which is sooner than the
            # NameServers can say.
            self.routes.invalidate(req.queue.topic)
            others = [a for a in self._group_nodes(req.queue) if a != req.address]
            if others:
                self._leaders[group] = others[req.attempts % len(others)]
            else:
                self._leaders.pop(group, None)
        decision = after_failure(
            err,
            attempts=req.attempts,
            max_attempts=self.config.max_attempts,
            time_left_s=req.deadline - time.monotonic(),
            maybe_stored=req.maybe_stored,
            movable=all(it.movable for it in req.items),
        )
        if decision is Next.MOVE and self._move(req):
            return
        if decision is not Next.FAIL:
            delay = retry_delay_s(err, req.attempts, self.config.backoff_s)
            self._scheduler.call_later(delay, lambda: self._issue(req))
            return
        self._finish(
            req,
            final_error(err, maybe_stored=req.maybe_stored, attempts=req.attempts, group=group),
        )

    def _group_nodes(self, queue: QueueRef) -> tuple[str, ...]:
        nodes = self._nodes.get(queue.broker_group)
        if not nodes:
            try:
                nodes = self.routes.nodes(queue.topic, queue.broker_group)
            except RaftMQError:
                return ()
            self._nodes[queue.broker_group] = nodes
        return nodes

    def _move(self, req: Request) -> bool:
        """A request that never reached a broker goes to another group's queue, as RocketMQ
        retries on another broker; its sequences are handed out again on this queue. False if
        no other group is available (the caller retries here)."""
        try:
            queues = self.routes.route(req.queue.topic).publish_queues()
        except RaftMQError:
            return False
        with self._lock:
            other = select_queue(
                queues,
                next(self._counter),
                self._faults,
                monotonic_ms(),
                avoid_broker=req.queue.broker_group,
            )
            if other.broker_group == req.queue.broker_group:
                return False
            nxt = self._acc.abandon(req.batch, monotonic_ms())
            appended = self._acc.append(other, [(it, it.size) for it in req.items], monotonic_ms())
            self._lock.notify_all()
        log.info("producer.moved queue=%s to=%s messages=%d", req.queue, other, req.batch.count)
        if nxt is not None:
            self._issue(self._request(nxt))
        if appended.wake_at_ms is not None:
            self._scheduler.call_later(self.config.linger_s, lambda: self._linger_due(other))
        if appended.batch is not None:
            self._issue(self._request(appended.batch))  # the messages keep their deadlines
        return True

    def _settle(self, req: Request, err: RaftMQError | None, *, sent: bool) -> Batch[Item] | None:
        """Give `req`'s messages their outcome (`err`, unless results were set) and release its
        batch: if it may have reached a broker its sequences stay used, if it never left they
        are handed out again. Returns the queue's next batch, to be issued."""
        if err is not None:
            for it in req.items:
                if not it.future.done():
                    it.future.set_exception(err)
        hook = self.on_settled
        if hook is not None:
            try:
                hook(req.queue.topic, _per_message(req.items))
            except Exception:  # a trace must never fail what it traces
                log.exception("producer.on_settled_failed")
        with self._lock:
            if sent:
                nxt = self._acc.complete(req.batch, monotonic_ms())
            else:
                nxt = self._acc.abandon(req.batch, monotonic_ms())
            self._lock.notify_all()
        room = self.on_room
        if room is not None:
            room()
        return nxt

    def _finish(self, req: Request, err: RaftMQError | None) -> None:
        nxt = self._settle(req, err, sent=True)
        if nxt is None:
            return
        on_loop = self._data.on_loop_thread()
        if on_loop and nxt.queue.broker_group not in self._leaders:
            # Issuing would look the leader up (maybe a NameServer call): not on the loop thread.
            self._scheduler.call_later(0, lambda: self._issue(self._request(nxt)))
            return
        self._issue(self._request(nxt))


def _messages(items: Sequence[Item]) -> list[Message]:
    """Every message of `items`, bodies made into messages (the uncommon paths only)."""
    out: list[Message] = []
    for it in items:
        if isinstance(it, Bodies):
            out += it.messages()
        else:
            out.append(it.msg)
    return out


def _per_message(items: tuple[Item, ...]) -> list[Pending]:
    """`items` as one Pending per message, each with its outcome: what the trace hook reads.
    Only a traced producer calls it, and only its bodies' messages and results are made."""
    out: list[Pending] = []
    for it in items:
        if isinstance(it, Pending):
            out.append(it)
            continue
        error = it.future.exception()
        results = it.future.results()
        for i, m in enumerate(it.messages()):
            done = Settled()
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(results[i])
            out.append(Pending(m, done, len(m.body), False))
    return out


def _to_pb(m: Message) -> common_pb2.Message:
    """The v1 wire form of a message (SEND_BATCHES, gRPC): only for delayed messages and
    brokers without SEND_STORED."""
    return common_pb2.Message(
        body=m.body,
        tags=m.tags or "",
        keys=m.keys,
        properties=m.properties,
        born_timestamp_ms=m.born_timestamp_ms,
        born_host=m.born_host,
    )
