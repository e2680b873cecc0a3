"""The SDK's asyncio face: `await producer.send(...)` and `async for msg in consumer`, over the
same core as the threaded API (its DataPool loop, routes, accumulator and retry policy).

A thin layer: no coroutine here blocks its event loop (sends await the sender's future, polls
wait on a wake-up the fetchers raise), and nothing here has its own retry or outcome rules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.messages import OutgoingMessage, ReceivedMessage, SendResult
from raftmq.client.producer import Producer, QueueSelector, SendOptions
from raftmq.client.producer.outcome import LoopSlot
from raftmq.common.types import QueueRef
from raftmq.common.wakeups import LoopWaker

__all__ = ["AsyncProducer", "AsyncPullConsumer"]


class AsyncProducer:
    """`async with AsyncProducer(namesrv) as p: result = await p.send(topic, body)`. The
    arguments are Producer's; a failure raises the same typed errors (OutcomeUnknownError only
    when the message may be stored)."""

    def __init__(self, namesrv_addresses: str | Sequence[str], **kwargs: Any) -> None:
        self.producer = Producer(namesrv_addresses, **kwargs)
        self._waker: LoopWaker | None = None

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
        return await self.send_future(
            topic,
            body,
            tags=tags,
            keys=keys,
            properties=properties,
            sharding_key=sharding_key,
            queue_selector=queue_selector,
            queue=queue,
        )

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
        many sends in flight (aiokafka's `send()` returns one too). Results of one answer from
        the broker complete their futures with one wake-up of the loop, not one per message
        (`asyncio.wrap_future` costs a self-pipe write per future)."""
        loop = asyncio.get_running_loop()
        waker = self._waker
        if waker is None or waker.loop is not loop:
            waker = self._waker = LoopWaker(loop)
        out: asyncio.Future[SendResult] = loop.create_future()
        # May wait up to max_block_ms for buffer room, like Kafka's send(): only when the
        # producer is saturated. The outcome goes straight to `out` (no Future per message).
        options = SendOptions(tags, keys, properties, sharding_key, queue_selector, queue)
        self.producer._send_into(topic, body, options, LoopSlot(waker, out))
        return out

    def send_batch_future(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes],
        *,
        sharding_key: str | None = None,
        queue_selector: QueueSelector | None = None,
        queue: QueueRef | None = None,
    ) -> asyncio.Future[list[SendResult]]:
        """Producer.send_batch_future on this loop: one asyncio future for the whole batch (a
        list of results in order), completed with one wake-up of the loop."""
        loop = asyncio.get_running_loop()
        waker = self._waker
        if waker is None or waker.loop is not loop:
            waker = self._waker = LoopWaker(loop)
        out: asyncio.Future[list[SendResult]] = loop.create_future()
        fut = self.producer.send_batch_future(
            topic, messages, sharding_key=sharding_key, queue_selector=queue_selector, queue=queue
        )

        def done(f: Future[list[SendResult]]) -> None:
            exc = f.exception()
            if exc is not None:
                waker.set_exception(out, exc)
            else:
                waker.set_result(out, f.result())

        fut.add_done_callback(done)
        return out

    async def flush(self, timeout_s: float | None = None) -> bool:
        return await asyncio.to_thread(self.producer.flush, timeout_s)

    async def close(self) -> None:
        await asyncio.to_thread(self.producer.close)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


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
