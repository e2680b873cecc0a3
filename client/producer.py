"""Producer: sync, async, oneway and batch sends with Kafka-style auto-batching, an idempotent
sequence per queue, retries on the new leader and avoidance of broker groups that just failed.

At most one request per queue is in flight: messages that arrive meanwhile wait and go in the
next request (that is the batching), and a retried request keeps its sequence numbers, so the
broker stores it once whatever happened to the first attempt.
"""

from __future__ import annotations

import collections
import itertools
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from client.errors import (
    BrokerUnavailableError,
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
from client.messages import OutgoingMessage, SendResult, to_pb
from client.pb import broker_pb2, common_pb2
from client.queue_selector import FaultTable, PublishQueues, select_by_key, select_queue
from client.rebalance import QueueRef
from client.routes import ChannelPool, RouteCache, monotonic_ms
from client.scheduler import Scheduler

log = logging.getLogger("raftmq.producer")

MIB = 1 << 20
SendCallback = Callable[[SendResult | None, RaftMQError | None], None]


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


@dataclass(slots=True)
class _Request:
    queue: QueueRef
    items: list[_Pending]
    first_sequence: int
    deadline: float
    attempts: int = 0
    started: float = 0.0
    address: str = ""


@dataclass(slots=True)
class _QueueState:
    pending: collections.deque[_Pending] = field(default_factory=collections.deque)
    inflight: bool = False
    next_sequence: int = 0
    linger_armed: bool = False


class Producer:
    """A context manager; thread-safe. `send()` blocks for the result, `send_async()` returns a
    Future, `send_oneway()` returns at once and only logs failures."""

    def __init__(
        self,
        namesrv_addresses: str | Sequence[str],
        *,
        producer_id: str | None = None,
        idempotent: bool = True,
        send_timeout_ms: int = 10_000,
        retries: int = 8,
        retry_backoff_ms: int = 50,
        linger_ms: float = 0.0,
        batch_max_messages: int = 1024,
        batch_max_bytes: int = 1 * MIB,
        max_buffered_messages: int = 100_000,
        max_block_ms: int = 10_000,
        max_message_bytes: int = 4 * MIB,
        route_refresh_ms: int = 30_000,
        max_io_threads: int = 32,
        sticky_messages: int = 32,
    ) -> None:
        if not 1 <= batch_max_messages <= 4096:
            raise ValueError("batch_max_messages must be within 1..4096")
        if retries < 0 or send_timeout_ms <= 0 or linger_ms < 0 or batch_max_bytes <= 0:
            raise ValueError("retries, send_timeout_ms, linger_ms and batch_max_bytes are invalid")
        self.producer_id = producer_id or f"p-{uuid.uuid4().hex}"
        self.idempotent = idempotent
        self._timeout_s = send_timeout_ms / 1000
        self._retries = retries
        self._backoff_s = retry_backoff_ms / 1000
        self._linger_s = linger_ms / 1000
        self._batch_max = batch_max_messages
        self._batch_bytes = batch_max_bytes
        self._max_buffered = max_buffered_messages
        self._max_block_s = max_block_ms / 1000
        self._max_message_bytes = max_message_bytes
        self._pool = ChannelPool()
        self.routes = RouteCache(
            _split(namesrv_addresses), self._pool, refresh_interval_ms=route_refresh_ms
        )
        self._scheduler = Scheduler("raftmq-producer-timer")
        # One blocking call per busy queue at a time; more threads than that only wait.
        self._io = ThreadPoolExecutor(max_io_threads, thread_name_prefix="raftmq-producer-io")
        self._lock = threading.Condition()
        self._queues: dict[QueueRef, _QueueState] = {}
        self._buffered = 0
        self._counter = itertools.count()
        self._faults = FaultTable()
        self._leaders: dict[str, str] = {}  # broker group -> leader address (hints win)
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
        queue: QueueRef | None = None,
    ) -> SendResult:
        fut = self.send_async(
            topic,
            body,
            tags=tags,
            keys=keys,
            properties=properties,
            sharding_key=sharding_key,
            queue=queue,
        )
        return fut.result()

    def send_async(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        queue: QueueRef | None = None,
        callback: SendCallback | None = None,
    ) -> Future[SendResult]:
        msg = self._message(body, tags, keys, properties)
        target = self._choose_queue(topic, sharding_key, queue)
        fut: Future[SendResult] = Future()
        if callback is not None:
            fut.add_done_callback(_callback_adapter(callback))
        self._enqueue(
            target, [_Pending(msg, fut, len(body), sharding_key is None and queue is None)]
        )
        return fut

    def send_oneway(self, topic: str, body: bytes, **kwargs: object) -> None:
        fut = self.send_async(topic, body, **kwargs)  # type: ignore[arg-type]
        fut.add_done_callback(_log_oneway_failure)

    def send_batch(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes],
        *,
        sharding_key: str | None = None,
        queue: QueueRef | None = None,
    ) -> list[SendResult]:
        """Store `messages` together in one queue, in order (RocketMQ's batch send)."""
        return [
            f.result()
            for f in self.send_batch_async(topic, messages, sharding_key=sharding_key, queue=queue)
        ]

    def send_batch_async(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes],
        *,
        sharding_key: str | None = None,
        queue: QueueRef | None = None,
    ) -> list[Future[SendResult]]:
        if not messages:
            return []
        target = self._choose_queue(topic, sharding_key, queue)
        items = []
        for m in messages:
            om = m if isinstance(m, OutgoingMessage) else OutgoingMessage(m)
            pb = self._message(om.body, om.tags, om.keys, om.properties)
            items.append(_Pending(pb, Future(), len(om.body), False))
        self._enqueue(target, items)
        return [it.future for it in items]

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every buffered message has an outcome; False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while self._buffered > 0:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._lock.wait(left if left is not None else 1.0)
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        if self._closed:
            return
        self.flush(timeout_s)
        self._closed = True
        self._scheduler.close()
        self._io.shutdown(wait=True)
        self._pool.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- choosing a queue ---------------------------------------------------------------------

    def _message(
        self,
        body: bytes,
        tags: str | None,
        keys: Sequence[str],
        properties: Mapping[str, str] | None,
    ) -> common_pb2.Message:
        if self._closed:
            raise BrokerUnavailableError("the producer is closed")
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"a message body must be bytes, not {type(body).__name__}")
        if len(body) > self._max_message_bytes:
            raise MessageTooLargeError.for_size(len(body), self._max_message_bytes)
        return to_pb(
            bytes(body), tags, tuple(keys), properties, time.time_ns() // 1_000_000, self._host
        )

    def _choose_queue(
        self, topic: str, sharding_key: str | None, queue: QueueRef | None
    ) -> QueueRef:
        if queue is not None:
            if queue.topic != topic:
                raise InvalidArgumentError(f"queue {queue} is not a queue of topic {topic!r}")
            return queue
        try:
            route = self.routes.route(topic)
        except NoRouteError:
            return self._first_send_queue(topic)
        queues = route.publish_queues()
        if sharding_key is not None:
            return select_by_key(queues, sharding_key)
        return self._sticky_queue(topic, queues)

    def _sticky_queue(self, topic: str, queues: PublishQueues) -> QueueRef:
        """Kafka's uniform sticky partitioning (KIP-794): unkeyed sends stay on one queue for
        `sticky_messages` sends, so concurrent sends share requests instead of spreading one
        message per request over every queue; then the next queue, round robin, avoiding groups
        that just failed. Over time every queue gets the same share."""
        now = monotonic_ms()
        with self._lock:
            current = self._sticky.get(topic)
            if current is not None and self._faults.is_available(current[0].broker_group, now):
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

    def _enqueue(self, target: QueueRef, items: list[_Pending]) -> None:
        deadline = time.monotonic() + self._max_block_s
        with self._lock:
            while self._buffered + len(items) > self._max_buffered:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise QueueFullError(
                        f"{self._buffered} messages already wait to be sent "
                        f"(max_buffered_messages={self._max_buffered}); slow down or raise it"
                    )
                self._lock.wait(left)
            self._buffered += len(items)
            st = self._queues.get(target)
            if st is None:
                st = self._queues[target] = _QueueState()
            st.pending.extend(items)
            req = self._next_request_locked(target, st, linger_ok=True)
        if req is not None:
            self._issue(req)

    def _next_request_locked(
        self, target: QueueRef, st: _QueueState, *, linger_ok: bool
    ) -> _Request | None:
        if st.inflight or not st.pending:
            return None
        if linger_ok and self._linger_s > 0 and len(st.pending) < self._batch_max:
            if not st.linger_armed:
                st.linger_armed = True
                self._scheduler.call_later(self._linger_s, lambda: self._linger_due(target))
            return None
        st.linger_armed = False
        items: list[_Pending] = []
        size = 0
        while st.pending and len(items) < self._batch_max:
            nxt = st.pending[0]
            if items and size + nxt.size > self._batch_bytes:
                break
            items.append(st.pending.popleft())
            size += nxt.size
        st.inflight = True
        first = st.next_sequence
        st.next_sequence += len(items)
        return _Request(target, items, first, time.monotonic() + self._timeout_s)

    def _linger_due(self, target: QueueRef) -> None:
        with self._lock:
            st = self._queues.get(target)
            if st is None:
                return
            st.linger_armed = False
            req = self._next_request_locked(target, st, linger_ok=False)
        if req is not None:
            self._issue(req)

    def _leader_of(self, topic: str, group: str, *, refresh: bool = False) -> str:
        if not refresh:
            hint = self._leaders.get(group)
            if hint:
                return hint
        leader = self.routes.leader(topic, group, refresh=refresh)
        self._leaders[group] = leader
        return leader

    def _issue(self, req: _Request) -> None:
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
            first_sequence=req.first_sequence if self.idempotent else 0,
            timeout_ms=int(self._timeout_s * 1000),
        )
        try:
            self._io.submit(self._call, req, wire)
        except RuntimeError:  # closed meanwhile
            self._finish(req, BrokerUnavailableError("the producer is closed"))

    def _call(self, req: _Request, wire: broker_pb2.SendMessageRequest) -> None:
        # A blocking call on an I/O thread: grpc's .future() starts a channel polling thread
        # whenever none is running, which cost ~3 ms per send here (measured with cProfile).
        left = max(0.05, req.deadline - time.monotonic())
        try:
            resp = self._pool.broker(req.address).SendMessage(wire, timeout=left)
        except grpc.RpcError as exc:
            self._failed(req, from_rpc_error(exc), rpc=exc)
            return
        except Exception as exc:
            self._failed(req, BrokerUnavailableError(f"send to {req.address} failed: {exc}"))
            return
        latency_ms = int((time.monotonic() - req.started) * 1000)
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
            self._leaders.pop(group, None)
            self.routes.invalidate(req.queue.topic)
        retryable = err.retryable or isinstance(err, OutcomeUnknownError)
        if retryable and req.attempts <= self._retries and time.monotonic() < req.deadline:
            movable = all(it.movable for it in req.items)
            if movable and _never_reached(err, rpc) and self._move(req):
                return
            delay = (
                0.0
                if (isinstance(err, NotLeaderError) and err.leader_hint)
                else self._backoff_s * req.attempts
            )
            self._scheduler.call_later(min(delay, 1.0), lambda: self._issue(req))
            return
        if (
            retryable
            and isinstance(err, (BrokerUnavailableError, RequestTimeoutError))
            and req.attempts > 1
        ):
            err = OutcomeUnknownError(
                f"send to broker group {group} did not complete after {req.attempts} attempts "
                f"({err.message}); it may or may not be stored"
            )
        self._finish(req, err)

    def _move(self, req: _Request) -> bool:
        """A request that never reached its broker goes to another group's queue (new sequences
        there), as RocketMQ retries on another broker. False if no other group is available."""
        try:
            queues = self.routes.route(req.queue.topic).publish_queues()
        except RaftMQError:
            return False
        other = select_queue(
            queues,
            next(self._counter),
            self._faults,
            monotonic_ms(),
            avoid_broker=req.queue.broker_group,
        )
        if other.broker_group == req.queue.broker_group:
            return False
        log.info("producer.moved queue=%s to=%s messages=%d", req.queue, other, len(req.items))
        with self._lock:
            st = self._queues[req.queue]
            st.inflight = False
            self._buffered -= len(req.items)
            nxt = self._next_request_locked(req.queue, st, linger_ok=False)
        if nxt is not None:
            self._issue(nxt)
        self._enqueue(other, req.items)
        return True

    def _finish(self, req: _Request, err: RaftMQError | None) -> None:
        if err is not None:
            for it in req.items:
                if not it.future.done():
                    it.future.set_exception(err)
        with self._lock:
            self._buffered -= len(req.items)
            st = self._queues[req.queue]
            st.inflight = False
            nxt = self._next_request_locked(req.queue, st, linger_ok=False)
            self._lock.notify_all()
        if nxt is not None:
            self._issue(nxt)


def _never_reached(err: RaftMQError, rpc: grpc.RpcError | None) -> bool:
    """True only when the broker surely did not store the request: a node that refused it as
    not the leader (and knows no leader), or a connection that could not be made."""
    if isinstance(err, NotLeaderError):
        return not err.leader_hint
    if rpc is not None and isinstance(err, BrokerUnavailableError):
        try:
            text = (rpc.details() or "").lower()
        except Exception:
            return False
        return "failed to connect" in text or "connection refused" in text
    return False


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
