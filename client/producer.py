"""Producer: sync, async, oneway and batch sends with Kafka-style auto-batching, an idempotent
sequence per queue, retries on the new leader and avoidance of broker groups that just failed.

At most one request per queue is in flight (client/accumulator.py): messages that arrive
meanwhile wait and go in the next request (that is the batching), and a retried request keeps
its queue and sequence numbers, so the broker stores it once whatever happened to an earlier
attempt. Only a request that surely never reached a broker may move to another broker group.
"""

from __future__ import annotations

import enum
import itertools
import logging
import math
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import grpc

from raftmq.client.accumulator import Accumulator, Batch
from raftmq.client.messages import OutgoingMessage, SendResult, to_pb
from raftmq.client.queue_selector import FaultTable, PublishQueues, select_by_key, select_queue
from raftmq.client.routes import ChannelPool, RouteCache, monotonic_ms
from raftmq.client.scheduler import Scheduler
from raftmq.common.errors import (
    BrokerUnavailableError,
    Fault,
    InvalidArgumentError,
    MessageTooLargeError,
    NoRouteError,
    NotLeaderError,
    OutcomeUnknownError,
    QueueFullError,
    RaftMQError,
    RequestTimeoutError,
    from_rpc_error,
)
from raftmq.common.message import validate_producer_id, validate_topic
from raftmq.common.pb import broker_pb2, common_pb2
from raftmq.common.types import QueueRef

log = logging.getLogger("raftmq.producer")

MIB = 1 << 20
MAX_RETRY_BACKOFF_S = 0.1  # failover takes ~1 s: retry often within the send timeout
SendCallback = Callable[[SendResult | None, RaftMQError | None], None]
# RocketMQ's MessageQueueSelector: given the topic's writable queues (sorted), the one to use.
QueueSelector = Callable[[Sequence[QueueRef]], QueueRef]


def _split(addresses: str | Sequence[str]) -> list[str]:
    if isinstance(addresses, str):
        return [a.strip() for a in addresses.split(",") if a.strip()]
    return [a.strip() for a in addresses if a.strip()]


@dataclass(slots=True)
class _Pending:
    msg: common_pb2.Message
    future: Future[SendResult]
    size: int
    movable: bool  # no sharding key and no chosen queue: may move to another group
    # When its outcome is due (Kafka's delivery.timeout.ms): set when it enters the buffer, so
    # time spent waiting behind an unanswered request on its queue counts too.
    deadline: float = 0.0


@dataclass(slots=True)
class _Request:
    """One send request and its attempts: always the same batch (queue and sequences)."""

    batch: Batch[_Pending]
    deadline: float
    attempts: int = 0
    started: float = 0.0
    address: str = ""
    maybe_stored: bool = False  # an attempt may have reached a broker: never move it

    @property
    def queue(self) -> QueueRef:
        return self.batch.queue

    @property
    def items(self) -> tuple[_Pending, ...]:
        return self.batch.items


class Next(enum.Enum):
    """What the producer does after a failed attempt."""

    RETRY = "retry"  # the same request (same queue, same sequences) again, maybe another node
    MOVE = "move"  # to another broker group's queue: only if no attempt can have stored it
    FAIL = "fail"


def after_failure(
    err: RaftMQError,
    *,
    attempts: int,
    max_attempts: int,
    time_left_s: float,
    maybe_stored: bool,
    movable: bool,
) -> Next:
    """The retry rule, pure. System faults are retried until the attempts or the send timeout
    run out; caller faults fail at once. A request moves to another group only when its items
    may move (no key, no chosen queue) and no attempt of it can have been stored, since the
    other group's broker cannot deduplicate what this one may hold. A leader hint is followed
    at once instead: the group has a leader, so its queue (and the order in it) is kept."""
    retryable = err.retryable or isinstance(err, OutcomeUnknownError)
    if not retryable or attempts >= max_attempts or time_left_s <= 0:
        return Next.FAIL
    hinted = isinstance(err, NotLeaderError) and bool(err.leader_hint)
    if movable and not maybe_stored and not hinted:
        return Next.MOVE
    return Next.RETRY


def final_error(err: RaftMQError, *, maybe_stored: bool, attempts: int, group: str) -> RaftMQError:
    """The error a failed send reports: whether it may be stored is what the caller must know."""
    if maybe_stored and err.fault is Fault.SYSTEM and not isinstance(err, OutcomeUnknownError):
        return OutcomeUnknownError(
            f"send to broker group {group} did not complete after {attempts} attempt(s) "
            f"({err.message}); it may or may not be stored",
            details={"broker_group": group},
        )
    return err


def retry_delay_s(err: RaftMQError, attempts: int, backoff_s: float) -> float:
    """At once on a leader hint; otherwise a linear back-off, capped (failover takes ~1 s)."""
    if isinstance(err, NotLeaderError) and err.leader_hint:
        return 0.0
    return min(backoff_s * attempts, MAX_RETRY_BACKOFF_S)


class Producer:
    """A context manager; thread-safe. `send()` blocks for the result, `send_async()` returns a
    Future, `send_oneway()` returns at once and only logs failures.

    Every message has its outcome within `send_timeout_ms` of entering the buffer (Kafka's
    delivery.timeout.ms; entering may block up to `max_block_ms` when the buffer is full), time
    spent waiting behind an earlier request of its queue included. A failure is
    OutcomeUnknownError when the message may be stored; any other error means it is not."""

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
        max_io_threads: int = 32,
        sticky_messages: int = 32,
    ) -> None:
        if not 1 <= batch_max_messages <= 4096:
            raise InvalidArgumentError("batch_max_messages must be within 1..4096")
        if retries < 0 or send_timeout_ms <= 0 or linger_ms < 0 or batch_max_bytes <= 0:
            raise InvalidArgumentError(
                "retries and linger_ms must be >= 0, send_timeout_ms and batch_max_bytes > 0"
            )
        if request_timeout_ms <= 0:
            raise InvalidArgumentError("request_timeout_ms must be > 0")
        if max_block_ms < 0 or max_io_threads < 1 or sticky_messages < 1:
            raise InvalidArgumentError(
                "max_block_ms must be >= 0, max_io_threads and sticky_messages >= 1"
            )
        self.producer_id = producer_id or f"p-{uuid.uuid4().hex}"
        validate_producer_id(self.producer_id)
        self.idempotent = idempotent
        self._timeout_s = send_timeout_ms / 1000
        # One attempt's deadline (Kafka's request.timeout.ms): a leader cut off by a silent
        # partition never answers, and waiting the whole send timeout on it would stall the
        # queue for that long; after this the attempt is retried (same sequence) elsewhere.
        self._request_timeout_s = min(request_timeout_ms, send_timeout_ms) / 1000
        self._retries = retries
        self._backoff_s = retry_backoff_ms / 1000
        self._linger_s = linger_ms / 1000
        self._max_block_s = max_block_ms / 1000
        self._max_message_bytes = max_message_bytes
        self._acc: Accumulator[_Pending] = Accumulator(
            linger_ms=math.ceil(linger_ms),  # the accumulator counts whole ms
            batch_max_messages=batch_max_messages,
            batch_max_bytes=batch_max_bytes,
            max_buffered_messages=max_buffered_messages,
            max_buffered_bytes=max_buffered_bytes,
        )
        self._pool = ChannelPool()
        self.routes = RouteCache(
            _split(namesrv_addresses), self._pool, refresh_interval_ms=route_refresh_ms
        )
        self._scheduler = Scheduler("raftmq-producer-timer")
        # One blocking call per busy queue at a time; more threads than that only wait.
        self._io = ThreadPoolExecutor(max_io_threads, thread_name_prefix="raftmq-producer-io")
        self._lock = threading.Condition()  # guards _acc, _faults and _sticky
        self._counter = itertools.count()
        self._faults = FaultTable()
        self._leaders: dict[str, str] = {}  # broker group -> leader address (hints win)
        self._nodes: dict[str, tuple[str, ...]] = {}  # broker group -> every node, leader first
        self._sticky: dict[str, tuple[QueueRef, int]] = {}  # topic -> (queue, sends left)
        self._sticky_messages = sticky_messages
        self._host = socket.gethostname()
        self._closed = False

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
    ) -> SendResult:
        """Send and wait for the result (stored on a majority of the group)."""
        fut = self.send_async(
            topic,
            body,
            tags=tags,
            keys=keys,
            properties=properties,
            sharding_key=sharding_key,
            queue_selector=queue_selector,
            queue=queue,
        )
        return self._wait(fut)

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
    ) -> Future[SendResult]:
        """A future of the result; `callback(result, error)` runs when it is known. Messages
        with the same `sharding_key` go to the same queue, in order; `queue_selector` picks the
        queue itself; `queue` names it."""
        msg = self._message(body, tags, keys, properties)
        target = self._choose_queue(topic, sharding_key, queue_selector, queue)
        fut: Future[SendResult] = Future()
        if callback is not None:
            fut.add_done_callback(_callback_adapter(callback))
        movable = sharding_key is None and queue_selector is None and queue is None
        self._enqueue(target, [_Pending(msg, fut, len(msg.body), movable)])
        return fut

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
    ) -> None:
        """Send without waiting for (or reporting) the outcome; failures are only logged."""
        fut = self.send_async(
            topic,
            body,
            tags=tags,
            keys=keys,
            properties=properties,
            sharding_key=sharding_key,
            queue_selector=queue_selector,
            queue=queue,
        )
        fut.add_done_callback(_log_oneway_failure)

    def send_batch(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes],
        *,
        sharding_key: str | None = None,
        queue_selector: QueueSelector | None = None,
        queue: QueueRef | None = None,
    ) -> list[SendResult]:
        """Store `messages` together in one queue, in order (RocketMQ's batch send)."""
        futures = self.send_batch_async(
            topic, messages, sharding_key=sharding_key, queue_selector=queue_selector, queue=queue
        )
        return [self._wait(f) for f in futures]

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
        pendings = []
        for m in messages:
            om = m if isinstance(m, OutgoingMessage) else OutgoingMessage(m)
            pb = self._message(om.body, om.tags, om.keys, om.properties)
            pendings.append(_Pending(pb, Future(), len(pb.body), False))
        target = self._choose_queue(topic, sharding_key, queue_selector, queue)
        self._enqueue(target, pendings)
        return [it.future for it in pendings]

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

    def close(self, timeout_s: float = 30.0) -> None:
        """Send what is buffered (waiting up to timeout_s for outcomes), then release it all."""
        if self._closed:
            return
        self.flush(timeout_s)
        self._closed = True
        self._scheduler.close()
        self._io.shutdown(wait=True, cancel_futures=True)
        self._pool.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wait(self, fut: Future[SendResult]) -> SendResult:
        # Bounded: the request's own deadline settles it long before this one.
        limit_s = self._max_block_s + self._linger_s + 2 * self._timeout_s + 5
        try:
            return fut.result(timeout=limit_s)
        except FutureTimeout:
            raise OutcomeUnknownError(
                f"no outcome within {limit_s:.0f} s; the message may or may not be stored"
            ) from None

    # ---- choosing a queue ---------------------------------------------------------------------

    def _message(
        self,
        body: bytes,
        tags: str | None,
        keys: Sequence[str],
        properties: Mapping[str, str] | None,
    ) -> common_pb2.Message:
        if self._closed:
            raise InvalidArgumentError("the producer is closed")
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"a message body must be bytes, not {type(body).__name__}")
        if len(body) > self._max_message_bytes:
            raise MessageTooLargeError.for_size(len(body), self._max_message_bytes)
        if isinstance(keys, str):
            raise InvalidArgumentError("keys must be a sequence of strings, not one string")
        return to_pb(
            bytes(body), tags, tuple(keys), properties, time.time_ns() // 1_000_000, self._host
        )

    def _choose_queue(
        self,
        topic: str,
        sharding_key: str | None,
        queue_selector: QueueSelector | None,
        queue: QueueRef | None,
    ) -> QueueRef:
        validate_topic(topic)
        if sum(x is not None for x in (sharding_key, queue_selector, queue)) > 1:
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
        with self._lock:
            current = self._sticky.get(topic)
            if (
                current is not None
                and current[0] in queues.queues
                and self._faults.is_available(current[0].broker_group, now)
            ):
                q, left = current
                if left > 1:
                    self._sticky[topic] = (q, left - 1)
                    return q
            chosen = select_queue(queues, next(self._counter), self._faults, now)
            self._sticky[topic] = (chosen, self._sticky_messages)
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
        group, address = leaders[next(self._counter) % len(leaders)]
        self._leaders[group] = address
        return QueueRef(topic, group, 0)

    # ---- accumulating and sending -------------------------------------------------------------

    def _enqueue(self, target: QueueRef, items: Sequence[_Pending]) -> None:
        """Buffer `items` for `target`, waiting up to max_block_ms for room (then QueueFull)."""
        size = sum(it.size for it in items)
        deadline = time.monotonic() + self._max_block_s
        with self._lock:
            while not self._acc.has_room(len(items), size):
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise QueueFullError(
                        f"{self._acc.buffered_messages} messages "
                        f"({self._acc.buffered_bytes} bytes) already wait to be sent "
                        f"(max_buffered_messages={self._acc.max_buffered_messages}, "
                        f"max_buffered_bytes={self._acc.max_buffered_bytes}); slow down or "
                        "raise them"
                    )
                self._lock.wait(left)
            due = time.monotonic() + self._timeout_s
            for it in items:
                it.deadline = due
            appended = self._acc.append(target, [(it, it.size) for it in items], monotonic_ms())
        if appended.wake_at_ms is not None:
            self._scheduler.call_later(self._linger_s, lambda: self._linger_due(target))
        if appended.batch is not None:
            self._issue(self._request(appended.batch))

    def _request(self, batch: Batch[_Pending]) -> _Request:
        # The send timeout is per message: a batch is due when its oldest message is.
        return _Request(batch, min(it.deadline for it in batch.items))

    def _linger_due(self, target: QueueRef) -> None:
        with self._lock:
            batch = self._acc.due(target, monotonic_ms())
        if batch is not None:
            self._issue(self._request(batch))

    def _leader_of(self, topic: str, group: str, *, refresh: bool = False) -> str:
        if not refresh:
            hint = self._leaders.get(group)
            if hint:
                return hint
        leader = self.routes.leader(topic, group, refresh=refresh)
        self._leaders[group] = leader
        return leader

    def _issue(self, req: _Request) -> None:
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
            self._failed(req, exc)
            return
        wire = broker_pb2.SendMessageRequest(
            topic=req.queue.topic,
            queue_id=req.queue.queue_id,
            messages=[it.msg for it in req.items],
            producer_id=self.producer_id if self.idempotent else "",
            first_sequence=req.batch.first_sequence if self.idempotent else 0,
            timeout_ms=int(self._request_timeout_s * 1000),
        )
        try:
            self._io.submit(self._call, req, wire)
        except RuntimeError:  # closed meanwhile; an earlier attempt may have stored it
            err = BrokerUnavailableError("the producer was closed before the send completed")
            self._finish(
                req,
                final_error(
                    err,
                    maybe_stored=req.maybe_stored,
                    attempts=req.attempts,
                    group=req.queue.broker_group,
                ),
            )

    def _expire(self, req: _Request) -> _Request | None:
        """`req` if its messages still have time; otherwise they fail without being sent (they
        waited out the send timeout behind an unanswered request on their queue), and so does
        every next batch of the queue that is also overdue. Never sent, so surely not stored:
        the sequences are handed out again and the error says so."""
        while req.deadline <= time.monotonic():
            err = RequestTimeoutError(
                f"{len(req.items)} message(s) for {req.queue} waited the whole send timeout "
                f"({self._timeout_s:.1f} s) in the producer behind an unanswered request and "
                "were not sent (not stored); the broker group may be unreachable from here: "
                "check `raftmq cluster status`, or raise send_timeout_ms"
            )
            nxt = self._settle(req, err, sent=False)
            if nxt is None:
                return None
            req = self._request(nxt)
        return req

    def _call(self, req: _Request, wire: broker_pb2.SendMessageRequest) -> None:
        # A blocking call on an I/O thread: grpc's .future() starts a channel polling thread
        # whenever none is running, which cost ~3 ms per send here (measured with cProfile).
        left = max(0.05, min(req.deadline - time.monotonic(), self._request_timeout_s))
        try:
            resp = self._pool.broker(req.address).SendMessage(wire, timeout=left)
        except grpc.RpcError as exc:
            self._failed(req, from_rpc_error(exc), rpc=exc)
            return
        except Exception as exc:
            req.maybe_stored = True  # we cannot tell how far it got
            self._failed(req, BrokerUnavailableError(f"send to {req.address} failed: {exc}"))
            return
        latency_ms = int((time.monotonic() - req.started) * 1000)
        with self._lock:
            self._faults = self._faults.record(req.queue.broker_group, latency_ms, monotonic_ms())
        results = resp.results
        if len(results) != len(req.items):
            self._finish(
                req,
                OutcomeUnknownError(
                    f"broker answered {len(results)} results for {len(req.items)} messages"
                ),
            )
            return
        for it, r in zip(req.items, results, strict=True):
            if not it.future.done():
                it.future.set_result(
                    SendResult(
                        r.msg_id,
                        req.queue.topic,
                        resp.broker_group or req.queue.broker_group,
                        r.queue_id,
                        r.queue_offset,
                        r.duplicate,
                    )
                )
        self._finish(req, None)

    def _failed(self, req: _Request, err: RaftMQError, rpc: grpc.RpcError | None = None) -> None:
        group = req.queue.broker_group
        if may_have_stored(err, rpc):
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
            max_attempts=self._retries + 1,
            time_left_s=req.deadline - time.monotonic(),
            maybe_stored=req.maybe_stored,
            movable=all(it.movable for it in req.items),
        )
        if decision is Next.MOVE and self._move(req):
            return
        if decision is not Next.FAIL:
            delay = retry_delay_s(err, req.attempts, self._backoff_s)
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

    def _move(self, req: _Request) -> bool:
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
        log.info("producer.moved queue=%s to=%s messages=%d", req.queue, other, len(req.items))
        if nxt is not None:
            self._issue(self._request(nxt))
        if appended.wake_at_ms is not None:
            self._scheduler.call_later(self._linger_s, lambda: self._linger_due(other))
        if appended.batch is not None:
            self._issue(self._request(appended.batch))  # the messages keep their deadlines
        return True

    def _settle(
        self, req: _Request, err: RaftMQError | None, *, sent: bool
    ) -> Batch[_Pending] | None:
        """Give `req`'s messages their outcome (`err`, unless results were set) and release its
        batch: if it may have reached a broker its sequences stay used, if it never left they
        are handed out again. Returns the queue's next batch, to be issued."""
        if err is not None:
            for it in req.items:
                if not it.future.done():
                    it.future.set_exception(err)
        with self._lock:
            if sent:
                nxt = self._acc.complete(req.batch, monotonic_ms())
            else:
                nxt = self._acc.abandon(req.batch, monotonic_ms())
            self._lock.notify_all()
        return nxt

    def _finish(self, req: _Request, err: RaftMQError | None) -> None:
        nxt = self._settle(req, err, sent=True)
        if nxt is not None:
            self._issue(self._request(nxt))


def may_have_stored(err: RaftMQError, rpc: grpc.RpcError | None) -> bool:
    """False only when the attempt surely stored nothing: it failed before a request left
    (no route, no leader known: `rpc` is None), a node refused it as not the leader (raftlog
    fails a submission with NOT_LEADER only when it is surely not in the log), or the
    connection could not be made. Anything else may have reached the log."""
    if rpc is None or isinstance(err, NotLeaderError):
        return False
    if isinstance(err, BrokerUnavailableError):
        try:
            text = (rpc.details() or "").lower()
        except Exception:
            return True
        return not ("failed to connect" in text or "connection refused" in text)
    return True


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
