"""The SDK's asyncio face: `await producer.send(...)` and `async for msg in consumer`, over the
same core as the threaded API (routes, accumulator, sender and retry policy); the producer's
connections run on the caller's own loop.

A thin layer: no coroutine here blocks its event loop (sends await the sender's future, polls
wait on a wake-up the fetchers raise), and nothing here has its own retry or outcome rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.messages import OutgoingMessage, ReceivedMessage, SendResult
from raftmq.client.producer import PLAIN_SEND, Producer, QueueSelector, SendOptions
from raftmq.client.producer.outcome import LoopPart, LoopSlot
from raftmq.client.producer.sender import Bodies
from raftmq.common.errors import QueueFullError, RaftMQError
from raftmq.common.types import QueueRef
from raftmq.common.wakeups import LoopWaker

MAX_QUEUE_OPTIONS = 1024  # queue objects whose plain-send options are kept (cleared when full)

__all__ = ["AsyncProducer", "AsyncPullConsumer"]


class AsyncProducer:
    """`async with AsyncProducer(namesrv) as p: result = await p.send(topic, body)`. The
    arguments are Producer's; a failure raises the same typed errors (OutcomeUnknownError only
    when the message may be stored).

    It runs on the caller's own event loop (the loop it is made in, else that of its first
    send; one loop per producer, so make it inside the loop that uses it): frames are written
    and answers read there, and results complete their futures there, with no thread between.
    Only retries, linger deadlines and route look-ups of failures use the producer's timer
    thread. Close it (`async with`) before its loop ends.

    A plain send (bytes, no tag, keys, properties, key or selector) costs per message a few
    checks, one future and two appends: the plain sends of one loop turn to one queue are
    handed to the sender as one item at the turn's end (issue 24), encoded with the batch
    call's one codec call. Every other call of this producer hands them over first, so the
    order of its sends to a queue is the order of its calls."""

    def __init__(self, namesrv_addresses: str | Sequence[str], **kwargs: Any) -> None:
        self.producer = Producer(namesrv_addresses, **kwargs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waker: LoopWaker | None = None
        self._room = asyncio.Event()
        self._room_waiters = 0  # send() calls waiting for buffer room
        # id(queue) -> (queue, its options): a send that names only its queue reuses one
        # SendOptions (a frozen object with checks, ~1 us to build) instead of one per message
        self._queue_options: dict[int, tuple[QueueRef, SendOptions]] = {}
        # this loop turn's plain sends, one open chunk per (queue, movable), in arrival order
        self._chunks: list[_Chunk] = []
        self._open: dict[tuple[QueueRef, bool], _Chunk] = {}
        self._gathered_messages = self._gathered_bytes = 0
        self._hand_over_due = False
        producer = self.producer
        self._max_body = producer._max_message_bytes
        self._chunk_messages = producer._batch_max_messages
        self._chunk_bytes = producer._batch_max_bytes
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None  # made outside any loop: bound by the first send
        if loop is not None:
            # Made inside its loop (the usual case): bound now, so that even the threaded API
            # of `self.producer`, if used first (a preload), runs on that loop.
            self._bind(loop)

    def _bind(self, loop: asyncio.AbstractEventLoop) -> LoopWaker:
        """The waker of `loop`, the running one; the first call moves the producer's
        connections onto it (InvalidArgumentError from a second loop)."""
        waker = self._waker
        if waker is not None and self._loop is loop:
            return waker
        self.producer._data.use_loop(loop)
        self._loop, self._waker = loop, LoopWaker(loop)
        self.producer._sender.on_room = self._room_freed
        return self._waker

    def _room_freed(self) -> None:
        """The sender freed buffer room (any thread): wake the send() calls waiting for it."""
        loop = self._loop
        if not self._room_waiters or loop is None:
            return
        if self.producer._data.on_loop_thread():
            self._room.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(self._room.set)

    async def send(
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
        """Send and await the result. A full buffer is awaited (up to max_block_ms, then
        QueueFullError), never blocking the loop: the loop is what empties it."""
        deadline: float | None = None
        while True:
            self._room.clear()  # before trying: room freed after the try sets it again
            self._room_waiters += 1
            try:
                fut = self.send_future(
                    topic,
                    body,
                    tags=tags,
                    keys=keys,
                    properties=properties,
                    sharding_key=sharding_key,
                    queue_selector=queue_selector,
                    queue=queue,
                )
                break
            except QueueFullError:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.producer._max_block_s
                if now >= deadline:
                    raise
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), deadline - now)
            finally:
                self._room_waiters -= 1
        return await fut

    def send_future(
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
    ) -> asyncio.Future[SendResult]:
        """`send` without a coroutine: an asyncio future of the result, for a caller that keeps
        many sends in flight (aiokafka's `send()` returns one too). Never blocks the loop: a
        full buffer is QueueFullError at once (`send` awaits room instead)."""
        waker = self._waker
        loop = asyncio.get_running_loop()
        if waker is None or self._loop is not loop:
            waker = self._bind(loop)
        if (
            tags is None
            and keys == ()
            and properties is None
            and sharding_key is None
            and queue_selector is None
        ):
            if type(body) is bytes and 0 < len(body) <= self._max_body:
                gathered = self._gather(topic, body, queue, loop)
                if gathered is not None:
                    return gathered
            # a plain body the fast path does not take (its error, a full buffer, closed)
            options = PLAIN_SEND if queue is None else self._options_of(queue)
        else:
            options = SendOptions(tags, keys, properties, sharding_key, queue_selector, queue)
        self._hand_over()  # this turn's plain sends first: the calls' order is kept
        out: asyncio.Future[SendResult] = loop.create_future()
        # The outcome goes straight to `out`, on this loop (no Future per message).
        self.producer._send_into(topic, body, options, LoopSlot(waker, out))
        return out

    def _gather(
        self, topic: str, body: bytes, queue: QueueRef | None, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[SendResult] | None:
        """Buffer a plain send for this turn's hand-over; None when the usual path must take it
        (a closed producer, a full buffer, a wrong topic or queue: errors said there)."""
        if type(topic) is not str:
            return None
        producer = self.producer
        size = len(body)
        sender = producer._sender
        if sender.closed or not sender.has_room(
            self._gathered_messages + 1, self._gathered_bytes + size
        ):
            return None
        if queue is None:
            target = producer._choose_queue(topic, PLAIN_SEND)
        elif queue.topic == topic:
            target = queue
            producer._topics_ok.check(topic)
        else:
            return None
        movable = queue is None
        chunk = self._open.get((target, movable))
        if (
            chunk is None
            or len(chunk.bodies) >= self._chunk_messages
            or chunk.size + size > self._chunk_bytes
        ):
            chunk = _Chunk(target, movable, time.time_ns() // 1_000_000)
            self._open[(target, movable)] = chunk
            self._chunks.append(chunk)
            if not self._hand_over_due:
                self._hand_over_due = True
                loop.call_soon(self._hand_over)
        out: asyncio.Future[SendResult] = loop.create_future()
        chunk.bodies.append(body)
        chunk.outs.append(out)
        chunk.size += size
        self._gathered_messages += 1
        self._gathered_bytes += size
        return out

    def _hand_over(self) -> None:
        """The turn's plain sends to the sender, one item per chunk; an item the sender refuses
        (its buffer filled meanwhile from another thread, or it closed) fails its messages."""
        self._hand_over_due = False
        chunks = self._chunks
        if not chunks:
            return
        self._chunks, self._open = [], {}
        self._gathered_messages = self._gathered_bytes = 0
        waker = self._waker
        assert waker is not None  # bound by the send that gathered
        producer = self.producer
        host = producer._host
        for c in chunks:
            item = Bodies(
                c.target.topic,
                c.bodies,
                c.born_ms,
                host,
                LoopPart(waker, c.outs),
                c.size,
                len(c.bodies),
                movable=c.movable,
            )
            try:
                producer._sender.enqueue(c.target, [item])
            except RaftMQError as exc:
                item.future.set_exception(exc)

    def _options_of(self, queue: QueueRef) -> SendOptions:
        """The options of a plain send to `queue`, made (and checked) once per queue object."""
        known = self._queue_options.get(id(queue))
        if known is not None and known[0] is queue:  # the same object, not a reused id
            return known[1]
        options = SendOptions(queue=queue)
        if len(self._queue_options) >= MAX_QUEUE_OPTIONS:
            self._queue_options.clear()
        self._queue_options[id(queue)] = (queue, options)
        return options

    def send_batch_future(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes],
        *,
        sharding_key: str | None = None,
        queue_selector: QueueSelector | None = None,
        queue: QueueRef | None = None,
    ) -> asyncio.Future[Sequence[SendResult]]:
        """Producer.send_batch_future on this loop: one asyncio future for the whole batch (a
        sequence of results in order)."""
        waker = self._bind(asyncio.get_running_loop())
        out: asyncio.Future[Sequence[SendResult]] = waker.loop.create_future()
        self._hand_over()  # this turn's plain sends first: the calls' order is kept
        fut = self.producer.send_batch_future(
            topic, messages, sharding_key=sharding_key, queue_selector=queue_selector, queue=queue
        )

        def done(f: Future[Sequence[SendResult]]) -> None:
            exc = f.exception()
            if exc is not None:
                waker.set_exception(out, exc)
            else:
                waker.set_result(out, f.result())

        fut.add_done_callback(done)
        return out

    async def flush(self, timeout_s: float | None = None) -> bool:
        self._hand_over()
        # A worker thread waits; this loop stays free to read the answers that end the wait.
        return await asyncio.to_thread(self.producer.flush, timeout_s)

    async def close(self) -> None:
        self._hand_over()  # sent, not dropped: close() lets what is buffered go out first
        await asyncio.to_thread(self.producer.close)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@dataclass(slots=True)
class _Chunk:
    """Plain sends of one loop turn to one queue, in order, at most one batch's worth."""

    target: QueueRef
    movable: bool  # none of them chose its queue
    born_ms: int
    bodies: list[bytes] = field(default_factory=list)
    outs: list[asyncio.Future[SendResult]] = field(default_factory=list)
    size: int = 0


class AsyncPullConsumer:
    """`async for msg in consumer` over a PullConsumer (same arguments); `subscribe`, `assign`,
    `commit` as there. Iteration never blocks the loop: it waits for the fetchers' wake-up."""

    def __init__(self, namesrv_addresses: str | Sequence[str], group: str, **kwargs: Any) -> None:
        self.consumer = PullConsumer(namesrv_addresses, group, **kwargs)
        self._ready = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.consumer._on_data = self._wake

    def _wake(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._ready.set)

    async def subscribe(self, topic: str) -> list[QueueRef]:
        return await asyncio.to_thread(self.consumer.subscribe, topic)

    async def assign(self, queues: Iterable[QueueRef]) -> None:
        await asyncio.to_thread(self.consumer.assign, list(queues))

    async def commit(self) -> None:
        await asyncio.to_thread(self.consumer.commit)

    def __aiter__(self) -> AsyncPullConsumer:
        self._loop = asyncio.get_running_loop()
        return self

    async def __anext__(self) -> ReceivedMessage:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        while True:
            self._ready.clear()  # before polling: a delivery after the poll sets it again
            # One message at a time, so the position (what commit() commits) never passes a
            # message the caller has not had; poll(0) never waits.
            got = self.consumer.poll(timeout_ms=0, max_messages=1)
            if got:
                return got[0]
            if self.consumer._closed:
                raise StopAsyncIteration
            await self._ready.wait()

    async def close(self) -> None:
        await asyncio.to_thread(self.consumer.close)
        self._ready.set()

    async def __aenter__(self) -> AsyncPullConsumer:
        self._loop = asyncio.get_running_loop()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
