"""DataServer: the broker's data path (send, pull, offsets, heartbeats) over the framed protocol
(common/transport.py) on one event loop thread: the same requests as the gRPC Broker service,
converted by the same functions (broker/requests.py), answered without a thread per request.

Sends wait for their commit and outcome as loop futures the Raft and dispatcher threads
complete; held pulls are loop futures the dispatcher wakes. Only a step that may block for long
(a new leader's gate, a topic auto-created through the log) runs on a small thread pool.
Nothing here decides: errors are the processors' typed RaftMQErrors, mapped by the transport.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from google.protobuf.message import Message

from raftmq.broker import requests
from raftmq.broker.errors import DispatcherStoppedError
from raftmq.broker.held_pulls import HeldPulls, HoldTimers
from raftmq.broker.node import BrokerNode
from raftmq.broker.pop import pop_handlers
from raftmq.broker.produce import BatchStored, PreparedSend
from raftmq.broker.pull import INDEX_CATCHUP_MS, PullResult, PullSteps, PullWait, WaitDispatched
from raftmq.broker.settings import BrokerSettings
from raftmq.broker.transactions_data import TXN_METHODS, transaction_handlers
from raftmq.broker.transactions_shell import TransactionShell
from raftmq.broker.wakeups import LoopWaker
from raftmq.common import stored_batch, stored_send, tls
from raftmq.common.acl import Action
from raftmq.common.auth_guard import Guard
from raftmq.common.data_api import PAYLOADS, DataMethod, parse
from raftmq.common.errors import InvalidArgumentError, RaftMQError
from raftmq.common.frame import Parts
from raftmq.common.pb import broker_pb2
from raftmq.common.quota import Flow
from raftmq.common.raw_pull import answer_parts
from raftmq.common.record_batch import MalformedBatchError
from raftmq.common.transport import FrameServer, Handler, LoopThread, RequestContext

_log = logging.getLogger("broker.data_server")

_M = TypeVar("_M", bound=Message)
_T = TypeVar("_T")

MAX_BATCHES_PER_REQUEST = 4096  # queue batches in one SEND_BATCHES frame (bounded work per task)
BLOCKING_THREADS = 4  # leader gates of a new term and topic auto-creation (rare, each bounded)
_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


class DataServer:
    """Build it beside the gRPC server; `start()` binds and returns the address to advertise,
    `stop()` answers held pulls, refuses new requests and lets in-flight ones finish."""

    def __init__(
        self,
        node: BrokerNode,
        settings: BrokerSettings,
        transactions: TransactionShell | None = None,
        guard: Guard | None = None,
    ) -> None:
        self.guard = guard  # issue 19: None = auth off
        self.node = node
        self.settings = settings
        self.transactions = transactions
        self._io: LoopThread | None = None
        self._server: FrameServer | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._waker: LoopWaker | None = None
        self._held: HeldPulls | None = None
        self._timers: HoldTimers | None = None
        self._closing = False
        self.address = ""
        self.quota = node.quota  # issue 27: the node's one book of bytes per user and flow

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self, host: str, port: int) -> str:
        io = self._io = LoopThread(name=f"broker-data-{self.node.me.node_id}")
        self._waker = LoopWaker(io.loop)
        self._timers = HoldTimers(io.loop)
        s = self.settings
        self._held = held = HeldPulls(
            self.node.store,
            self._waker,
            max_waiters=s.data_max_connections * s.data_max_inflight_per_conn,
            on_park=self.node.dispatcher.hurry,
        )
        self.node.dispatcher.add_listener(held.on_progress)
        self.node.dispatcher.add_readers(lambda: held.held)
        self.node.metrics.held_pulls = lambda: held.held
        self._pool = ThreadPoolExecutor(BLOCKING_THREADS, thread_name_prefix="broker-data-block")
        self._server = FrameServer(
            self._handlers(),
            max_frame_bytes=s.data_max_frame_bytes,
            max_inflight_per_conn=s.data_max_inflight_per_conn,
            max_connections=s.data_max_connections,
            max_connections_per_address=s.data_max_connections_per_address,
            max_connections_per_user=s.data_max_connections_per_user,
            hello_timeout_s=s.data_hello_timeout_ms / 1000,
            idle_timeout_s=s.data_idle_timeout_ms / 1000,
            ssl=tls.server_ssl(),
            authenticate=self.guard.authenticate_hello if self.guard is not None else None,
            batch_version=self.node.batch_version,  # what the SDK encodes in (issue 24 bar 4)
        )
        io.run(self._server.start(host, port), timeout_s=10)
        advertised = self.node.me.address.rpartition(":")[0] if host in _WILDCARD_HOSTS else host
        self.address = f"{advertised}:{self._server.port}"
        _log.info("broker.data_server_started address=%s bind=%s:%d", self.address, host, port)
        return self.address

    def stop(self, grace_s: float) -> None:
        io, server = self._io, self._server
        if io is None or server is None:
            return
        try:
            io.run(self._close(server, grace_s), timeout_s=grace_s + 5)
        except Exception:
            _log.exception("broker.data_server_close_failed")
        io.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._io = None

    async def _close(self, server: FrameServer, grace_s: float) -> None:
        self._closing = True
        assert self._held is not None
        self._held.wake_all()  # held pulls answer NO_NEW_MSG now instead of after the grace
        await server.close(grace_s)

    @property
    def held_pulls(self) -> int:
        return self._held.held if self._held is not None else 0

    @property
    def loop_wakeups(self) -> int:
        return self._waker.wakeups if self._waker is not None else 0

    def _send_budget_ms(self, timeout_ms: int) -> int:
        """A send may be held half its time limit; the rest is for storing it."""
        return (timeout_ms or self.settings.send_timeout_ms) // 2

    # ---- handlers -----------------------------------------------------------------------------

    def _handlers(self) -> Mapping[int, Handler]:
        handlers: dict[DataMethod, Handler] = {
            DataMethod.SEND_MESSAGE: self._send,
            DataMethod.PULL_MESSAGE: self._pull,
            DataMethod.COMMIT_OFFSET: self._commit_offset,
            DataMethod.QUERY_OFFSET: self._inline(
                broker_pb2.QueryOffsetRequest, requests.query_offset
            ),
            DataMethod.GET_QUEUE_BOUNDS: self._inline(
                broker_pb2.GetQueueBoundsRequest, requests.queue_bounds, indexed=True
            ),
            DataMethod.SEARCH_OFFSET_BY_TIMESTAMP: self._inline(
                broker_pb2.SearchOffsetByTimestampRequest, requests.search_offset, indexed=True
            ),
            DataMethod.HEARTBEAT: self._inline(broker_pb2.HeartbeatRequest, requests.heartbeat),
            DataMethod.SEND_BATCHES: self._send_batches,
            DataMethod.SEND_STORED: self._send_stored,
        }
        assert self._waker is not None
        handlers.update(pop_handlers(self.node, self._blocking, self._waker, self._check))
        if self.transactions is not None:
            handlers.update(
                transaction_handlers(self.transactions, self._blocking, self._waker, self._check)
            )
        missing = set(PAYLOADS) - set(handlers) - (TXN_METHODS if not self.transactions else set())
        assert not missing, f"no handler for {sorted(m.name for m in missing)}"
        timed = self.node.metrics.frame_handler
        return {int(m): timed(m.name, h) for m, h in handlers.items()}

    def _inline(
        self, cls: type[_M], fn: Callable[[BrokerNode, _M], Message], *, indexed: bool = False
    ) -> Callable[[memoryview, RequestContext], Awaitable[bytes]]:
        """A request answered on the loop: reads of this node's store, the consumer table.
        `indexed`: a read of queue bounds or times, which first waits (as a loop future) for
        the index to hold every committed send (requests.index_catch_up)."""
        node = self.node

        async def handle(payload: memoryview, ctx: RequestContext) -> bytes:
            req = parse(cls, payload)
            self._check(ctx, req)
            if indexed:
                index = requests.index_catch_up(node)
                if index is not None:
                    await self._wait(WaitDispatched(index, INDEX_CATCHUP_MS))
            return fn(node, req).SerializeToString()

        handle.__qualname__ = f"DataServer.{fn.__name__}"
        return handle

    def _check(self, ctx: RequestContext, req: Message) -> None:
        """Authorize a parsed request for the connection's principal (issue 19): once per
        request or batch, never per message; decisions are cached in the guard."""
        if self.guard is not None:
            self.guard.check_frame(ctx.principal, ctx.method, req)

    async def _blocking(self, fn: Callable[..., _T], *args: object) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _send(self, payload: memoryview, ctx: RequestContext) -> bytes:
        node = self.node
        req = parse(broker_pb2.SendMessageRequest, payload)
        self._check(ctx, req)
        held, _ = await self.quota.turn(Flow.PRODUCE, ctx.principal, self._send_budget_ms(0))
        term = node.term()
        if requests.send_needs_thread(node, req):
            prepared = await self._blocking(requests.prepare_send, node, req)
        else:
            prepared = requests.prepare_send(node, req)
        if node.settings.debug_ack_before_commit:
            queue_id, outcomes = node.sends.ack_before_commit(prepared)
        else:
            assert self._waker is not None
            [chunk] = await node.replicate_async(
                [prepared.payload], prepared.timeout_s, self._waker
            )
            queue_id, outcomes = prepared.queue_id, node.sends.outcomes(prepared, chunk)
        node.metrics.on_send(req.topic, prepared.count, len(payload))
        node.stats.on_send(req.topic, prepared.count)
        self.quota.charge(Flow.PRODUCE, ctx.principal, len(payload))
        answer = requests.send_answer(node, queue_id, outcomes, term)
        answer.throttle_ms = held
        return answer.SerializeToString()

    async def _send_batches(self, payload: memoryview, ctx: RequestContext) -> bytes:
        """The ready batches of all this leader's queues from one producer (issue 14): each is
        prepared as a SEND_MESSAGE is, all are submitted back to back (so they share a Raft
        entry, one chunk each) and each is answered on its own, with a base offset and count.
        A batch's failure (refused, not leader, unknown outcome) is its own answer; the request
        fails as a whole only for a malformed frame or a bug."""
        node = self.node
        req = parse(broker_pb2.SendBatchesRequest, payload)
        if not req.batches:
            raise InvalidArgumentError("a SEND_BATCHES request must carry at least one batch")
        if len(req.batches) > MAX_BATCHES_PER_REQUEST:
            raise InvalidArgumentError(
                f"{len(req.batches)} batches in one SEND_BATCHES request; the limit is "
                f"{MAX_BATCHES_PER_REQUEST}"
            )
        budget = self._send_budget_ms(req.timeout_ms)
        held, _ = await self.quota.turn(Flow.PRODUCE, ctx.principal, budget)
        term = node.term()
        prepared: list[PreparedSend | RaftMQError] = []
        inline: dict[str, bool] = {}  # topic -> prepare may run on the loop (asked once)
        guard = self.guard
        for batch in req.batches:
            try:
                if guard is not None:  # per batch: a denied topic fails its batches only
                    guard.check_topic(ctx.principal, Action.PUB, batch.topic)
                ok = inline.get(batch.topic)
                if ok is None:
                    ok = inline[batch.topic] = not requests.send_needs_thread(node, batch)
                if ok:
                    prepared.append(requests.prepare_send(node, batch))
                else:
                    # In order, one at a time: a batch prepared on a thread is submitted only
                    # with the others below, so the queue's batches keep their order.
                    prepared.append(await self._blocking(requests.prepare_send, node, batch))
                    inline.pop(batch.topic, None)
            except RaftMQError as exc:
                prepared.append(exc)
        topics = [b.topic for b in req.batches]
        answers = await self._store_all(prepared, topics, req.timeout_ms)
        self.quota.charge(Flow.PRODUCE, ctx.principal, len(payload))
        return broker_pb2.SendBatchesResponse(
            results=[requests.batch_result(a) for a in answers],
            broker_group=node.group,
            term=term,
            throttle_ms=held,
        ).SerializeToString()

    async def _send_stored(self, payload: memoryview, ctx: RequestContext) -> bytes:
        """SEND_STORED (issue 24): v2 stored batches as the producer encoded them. Each is
        checked whole (lengths, one CRC, the offsets table: stored_batch.check_batch) and from
        its header (permission, topic, queue, sizes), stamped with the store time and appended
        as the bytes received; answered as SEND_BATCHES is, in fixed-size records. A refused
        batch is its own answer and stores nothing; a frame that does not parse fails whole."""
        node = self.node
        timeout_ms, batches = stored_send.decode_request(payload, MAX_BATCHES_PER_REQUEST)
        budget = self._send_budget_ms(timeout_ms)
        held, _ = await self.quota.turn(Flow.PRODUCE, ctx.principal, budget)
        term = node.term()
        limits = node.sends.batch_limits()
        prepared: list[PreparedSend | RaftMQError] = []
        topics: list[str] = []
        inline: dict[str, bool] = {}  # topic -> prepare may run on the loop (asked once)
        guard = self.guard
        for batch in batches:
            topic = ""
            try:
                try:
                    header = stored_batch.check_batch(batch, limits)
                except MalformedBatchError as exc:
                    raise InvalidArgumentError(f"a stored batch was refused: {exc}") from None
                topic = header.topic
                if guard is not None:  # per batch: a denied topic fails its batches only
                    guard.check_topic(ctx.principal, Action.PUB, topic)
                ok = inline.get(topic)
                if ok is None:
                    ok = inline[topic] = not node.sends.needs_thread(topic)
                if ok:
                    prepared.append(node.sends.prepare_stored(header, batch, timeout_ms))
                else:  # in order, one at a time (see _send_batches)
                    prepared.append(
                        await self._blocking(node.sends.prepare_stored, header, batch, timeout_ms)
                    )
                    inline.pop(topic, None)
            except RaftMQError as exc:
                prepared.append(exc)
            topics.append(topic)
        answers = await self._store_all(prepared, topics, timeout_ms)
        self.quota.charge(Flow.PRODUCE, ctx.principal, len(payload))
        return stored_send.encode_answer(
            node.group,
            term,
            [a if isinstance(a, RaftMQError) else _batch_answer(a) for a in answers],
            held,
        )

    async def _store_all(
        self, prepared: list[PreparedSend | RaftMQError], topics: list[str], timeout_ms: int
    ) -> list[BatchStored | RaftMQError]:
        """Submit the prepared batches back to back (one Raft entry, one chunk each) and wait
        for each one's outcome; the answers in `prepared`'s order, refusals kept in place."""
        node = self.node
        ready = [p for p in prepared if isinstance(p, PreparedSend)]
        answers: list[BatchStored | RaftMQError] = []
        if ready:
            if node.settings.debug_ack_before_commit:
                for p in ready:
                    node.sends.ack_before_commit(p)
                answers = [BatchStored(p.queue_id, -1, p.count, 0, 0, 0, False) for p in ready]
            else:
                assert self._waker is not None
                timeout_s = min(p.timeout_s for p in ready)
                if timeout_ms > 0:
                    timeout_s = min(timeout_s, timeout_ms / 1000)
                chunks = await node.replicate_each_async(
                    [p.payload for p in ready], timeout_s, self._waker
                )
                for p, chunk in zip(ready, chunks, strict=True):
                    if isinstance(chunk, RaftMQError):
                        answers.append(chunk)
                        continue
                    try:
                        answers.append(node.sends.stored(p, chunk))
                    except RaftMQError as exc:
                        answers.append(exc)
        ready_topics = [
            t for t, p in zip(topics, prepared, strict=True) if isinstance(p, PreparedSend)
        ]
        for topic, p, answer in zip(ready_topics, ready, answers, strict=True):  # per batch
            if isinstance(answer, BatchStored):
                node.metrics.on_send(topic, p.count, len(p.payload))
                node.stats.on_send(topic, p.count)
        done = iter(answers)
        return [p if isinstance(p, RaftMQError) else next(done) for p in prepared]

    async def _commit_offset(self, payload: memoryview, ctx: RequestContext) -> bytes:
        node = self.node
        req = parse(broker_pb2.CommitOffsetRequest, payload)
        self._check(ctx, req)
        if node.leader_gate_open():
            entries = requests.commit_payloads(node, req)
        else:
            entries = await self._blocking(requests.commit_payloads, node, req)
        if entries:
            assert self._waker is not None
            outcomes = await node.replicate_async(
                entries, node.offsets.commit_timeout_s, self._waker
            )
            node.offsets.check_commit(outcomes)
        return broker_pb2.CommitOffsetResponse().SerializeToString()

    async def _pull(self, payload: memoryview, ctx: RequestContext) -> bytes | Parts:
        """The pull generator driven with loop futures: a held pull holds no thread. The frame
        carries no deadline, so the hold is the request's max_wait_ms, capped by the broker's
        long_poll_max_ms (the generator applies both)."""
        node = self.node
        req = parse(broker_pb2.PullMessageRequest, payload)
        self._check(ctx, req)
        hold_ms = min(max(req.max_wait_ms, 0), self.settings.long_poll_max_ms)
        held, turn = await self.quota.turn(Flow.CONSUME, ctx.principal, hold_ms)
        if not turn:  # held as long as a long poll may be: nothing read, pull again from here
            return requests.held_pull_answer(node, req, held).SerializeToString()
        deadline = time.monotonic() + (self.settings.long_poll_max_ms - held) / 1000
        steps = requests.pull_steps(node, req, deadline)
        result = await self._drive(steps)
        # The stored batches go out as they were read, parts of the frame around protobuf's
        # fields: never copied into a message and out of it again (common/raw_pull.py).
        answer = answer_parts(requests.pull_head(node, result, held), result.raw_parts)
        self.quota.charge(Flow.CONSUME, ctx.principal, len(answer))
        node.metrics.on_pull(req.consumer_group, req.topic, result.count, len(answer))
        node.stats.on_pull(req.consumer_group, req.topic, result.count)
        return answer

    async def _drive(self, steps: PullSteps) -> PullResult:
        try:
            wait = next(steps)
            while True:
                await self._wait(wait)
                wait = steps.send(self._closing)
        except StopIteration as done:
            result: PullResult = done.value
            return result

    async def _wait(self, wait: PullWait) -> None:
        node, held = self.node, self._held
        assert held is not None
        dispatcher = node.dispatcher
        if dispatcher.failure is not None or not dispatcher.running:
            raise node.dispatcher_down(DispatcherStoppedError("the dispatcher is not running"))
        if self._closing:
            return  # re-plan at once: the generator answers instead of holding
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        if isinstance(wait, WaitDispatched):
            held.wait_dispatched(wait.index, dispatcher.dispatched_index, fut)
            topic, queue_id = "", -1
        else:
            topic, queue_id = wait.topic, wait.queue_id
            held.wait_message(topic, queue_id, wait.offset, fut, wait.tag_hashes, wait.checked)
        if fut.done():
            return
        assert self._timers is not None
        self._timers.add(wait.wait_ms / 1000, fut)
        try:
            await fut
        finally:
            held.forget(fut, topic, queue_id)


def _batch_answer(s: BatchStored) -> stored_send.BatchAnswer:
    return stored_send.BatchAnswer(
        s.count, s.first_offset, s.raft_index, s.slot, s.first_position, s.duplicate
    )
