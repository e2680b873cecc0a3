"""apache.rocketmq.v2.MessagingService on raftmq: the handlers of the RocketMQ 5 gRPC API.

A thin shell on the event loop: requests are checked and mapped by the pure modules (convert,
routing, receipt, codes), POP receives are planned on a mirror of the broker group's
replicated POP state (`common.pop.QueuePop`; the broker's apply decides: broker/pop_apply.py),
and the broker groups are reached through the raftmq SDK (`broker_io`, a Producer). Every
answer carries a v2 status; a failure never sends a traceback (the proxy's log has it).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration

from raftmq.client.messages import ReceivedMessage, SendResult
from raftmq.client.producer import Producer
from raftmq.client.producer.transaction import TransactionCheck
from raftmq.client.retry_back import SendBack
from raftmq.client.routes import TopicRoute
from raftmq.common.acl_sync import admin_credentials, auth_config_of
from raftmq.common.auth_guard import CALLER
from raftmq.common.backoff import KeyedBackoff
from raftmq.common.delay import DEFAULT_DELAY_LEVELS_MS
from raftmq.common.errors import (
    InvalidFilterError,
    InvalidNameError,
    NoRouteError,
    RaftMQError,
    TopicNotFoundError,
)
from raftmq.common.filter.subscription import check_subscription
from raftmq.common.filter.tag import parse_tag_expression
from raftmq.common.group_config import MAX_RETRY_TIMES, USE_CONSUMER_LIMIT, max_delivery_attempts
from raftmq.common.message import validate_group
from raftmq.common.pb import broker_pb2, pop_pb2
from raftmq.common.pb.apache.rocketmq.v2 import definition_pb2 as v2
from raftmq.common.pb.apache.rocketmq.v2 import service_pb2 as svc
from raftmq.common.pop import AckOutcome, Delivery, Plan, QueuePop
from raftmq.common.quota import Flow
from raftmq.common.quota_gate import THROTTLE_KEY, QuotaGate
from raftmq.common.retry import DEAD_LETTER_NOW
from raftmq.common.types import QueueRef
from raftmq.proxy import convert, receipt, routing, transactions
from raftmq.proxy.broker_io import BrokerIO, Pulled
from raftmq.proxy.codes import ApiError, ok, status_of
from raftmq.proxy.settings import ProxySettings

log = logging.getLogger("proxy")

CLIENT_ID_KEY = "x-mq-client-id"
# A send may be held half its deadline; without one, half the official clients' default 3 s.
DEFAULT_SEND_HOLD_MS = 1_500
DEFAULT_INVISIBLE_MS = 30_000  # a receive that gives none (a push consumer's auto renew)
MIN_WAIT_S = 0.05  # a failed held pull is not retried sooner than this
MAX_HELD_PULL_MS = 5_000
# Held pulls a receive leaves behind when it returns stay on the broker until their wait ends;
# past this many such pulls (their connection to a leader allows 256 in flight) a waiting receive
# polls every POLL_S instead of holding more.
MAX_HELD_PULLS = 128
POLL_S = 0.2
MAX_CLIENTS = 100_000
# A dead letter the broker would not store is tried again after this back-off (doubling up to
# the cap): a long-polling receive re-plans every POLL_S and would otherwise resend it each time.
DEAD_LETTER_RETRY_S = 1.0
DEAD_LETTER_RETRY_MAX_S = 30.0
TXN_SWEEP_S = 10.0  # how often idle transaction producers are looked for
MAX_TELEMETRY_BACKLOG = 256  # commands queued to one client's stream; past it checks are dropped
# (the broker checks again after its check interval)


_ACK_OUTCOMES = {
    pop_pb2.POP_ACK_DONE: AckOutcome.DONE,
    pop_pb2.POP_ACK_ALREADY: AckOutcome.ALREADY,
    pop_pb2.POP_ACK_STALE: AckOutcome.STALE,
    pop_pb2.POP_ACK_UNKNOWN: AckOutcome.UNKNOWN,
}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class PopKey:
    group: str
    queue: QueueRef


@dataclass(slots=True)
class ClientInfo:
    client_type: int
    group: str
    seen_ms: int
    settings: v2.Settings | None = None


@dataclass(slots=True)
class Stream:
    """One client's Telemetry stream: where the proxy sends it commands."""

    queue: asyncio.Queue[svc.TelemetryCommand | None]
    topics: frozenset[str] = frozenset()  # what it publishes (its transaction checks)


@dataclass(slots=True)
class Filter:
    tags: str = "*"
    sql: str = ""
    _tag_filter: Any = field(default=None, repr=False)

    def matches(self, m: ReceivedMessage) -> bool:
        if self.sql or self.tags == "*":
            return True
        if self._tag_filter is None:
            self._tag_filter = parse_tag_expression(self.tags)
        return bool(self._tag_filter.matches(m.tags))


def _check_group(resource: v2.Resource) -> str:
    try:
        validate_group(resource.name)
    except InvalidNameError as exc:
        raise ApiError(v2.ILLEGAL_CONSUMER_GROUP, exc.message) from None
    return resource.name


def _filter(expr: v2.FilterExpression) -> Filter:
    text = expr.expression
    try:
        if expr.type == v2.SQL:
            check_subscription(None, text)
            return Filter(sql=text)
        check_subscription(text or "*", None)
        return Filter(tags=text or "*")
    except InvalidFilterError as exc:
        raise ApiError(v2.ILLEGAL_FILTER_EXPRESSION, exc.message) from None


def _stored(m: ReceivedMessage) -> convert.Stored:
    return convert.Stored(
        m.topic,
        m.body,
        m.tags,
        m.keys,
        m.properties,
        m.broker_group,
        m.queue_id,
        m.queue_offset,
        m.msg_id,
        m.store_timestamp_ms,
        m.born_timestamp_ms,
        m.born_host,
    )


class MessagingService:
    """The handlers; one instance per proxy process, all state on its event loop."""

    def __init__(self, settings: ProxySettings) -> None:
        self.s = settings
        self.me = settings.advertised
        self.proxies = settings.proxy_list
        self.epoch = secrets.token_hex(4)  # receipt handles name the process that issued them
        # issue 19: the proxy checks each client's own signature and policy itself (proxy/
        # handlers.py), then acts for it with the cluster's admin identity
        creds = admin_credentials(auth_config_of(settings))
        self.io = BrokerIO(settings.namesrv_addresses, settings.blocking_threads, creds)
        self.producer = Producer(
            settings.namesrv_addresses,
            credentials=creds,
            producer_id=f"proxy-{socket.gethostname()}-{self.epoch}",
            max_message_bytes=settings.max_message_bytes,
        )
        self._pops: OrderedDict[PopKey, QueuePop] = OrderedDict()
        self._loading: dict[PopKey, asyncio.Future[QueuePop]] = {}
        self._clients: OrderedDict[str, ClientInfo] = OrderedDict()
        self._rotation = 0
        self._commit_task: asyncio.Task[None] | None = None
        # When each held pull ends (ms; near ascending: over-counts a little at worst).
        self._held_until: collections.deque[int] = collections.deque()
        self.txns = transactions.ProxyTransactions(
            settings.namesrv_addresses,
            f"proxy-{socket.gethostname()}-{self.epoch}",
            settings.max_transaction_topics,
            creds,
        )
        self._streams: dict[str, Stream] = {}
        # A consumer group's max delivery attempts, from its clients' settings (bounded LRU).
        self._max_attempts: OrderedDict[str, int] = OrderedDict()
        # (consumer group, broker group) -> the group's configured retry limit there, as that
        # broker group's last POP answer said (bounded LRU): it wins over the above.
        self._retry_limits: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._send_backs: OrderedDict[str, SendBack] = OrderedDict()
        # Deliveries whose send-back to the DLQ is under way: a concurrent receive or forward
        # must not send them again (at most the in-flight messages).
        self._dead_lettering: set[tuple[str, str, int, int]] = set()
        # Deliveries whose send-back failed wait before the next try (bounded).
        self._dead_letter_retry = KeyedBackoff(
            DEAD_LETTER_RETRY_S, DEAD_LETTER_RETRY_MAX_S, MAX_CLIENTS
        )
        # issue 27: produce and consume bytes per user, held before serving as on the brokers
        self.quota = QuotaGate(settings.quota_tables())

    # ---- what /metrics reads (proxy/metrics.py), from the scrape's thread ----------------------

    @property
    def client_count(self) -> int:
        return len(self._clients)

    @property
    def pop_queue_count(self) -> int:
        return len(self._pops)

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._commit_task = loop.create_task(self._commit_loop())

        def on_check(topic: str, check: TransactionCheck) -> None:
            if loop.is_closed():
                return  # shutting down: the broker asks again, another member or later
            loop.call_soon_threadsafe(self._forward_check, topic, check)

        self.txns.on_check = on_check

    async def close(self) -> None:
        if self._commit_task is not None:
            self._commit_task.cancel()
        self.txns.on_check = None
        await asyncio.get_running_loop().run_in_executor(None, self.producer.close, 5.0)
        await asyncio.get_running_loop().run_in_executor(None, self.txns.close)
        self.io.close()

    # ---- clients ------------------------------------------------------------------------------

    def _client_id(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        for key, value in context.invocation_metadata() or ():
            if key == CLIENT_ID_KEY:
                return str(value)
        return ""

    def _touch(self, client_id: str, client_type: int, group: str) -> None:
        if not client_id:
            return
        info = self._clients.pop(client_id, None)
        if info is None:
            info = ClientInfo(client_type, group, now_ms())
        info.seen_ms = now_ms()
        if client_type:
            info.client_type = client_type
        if group:
            info.group = group
        self._clients[client_id] = info
        expiry = now_ms() - self.s.client_expiry_ms
        while self._clients and (
            len(self._clients) > MAX_CLIENTS or next(iter(self._clients.values())).seen_ms < expiry
        ):
            self._clients.popitem(last=False)

    # ---- routes -------------------------------------------------------------------------------

    async def QueryRoute(
        self, request: svc.QueryRouteRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.QueryRouteResponse:
        topic = convert.check_topic(request.topic)
        try:
            route = await self.io.route(topic)
        except (TopicNotFoundError, NoRouteError):
            # Our SDK's producer creates such a topic with its first send (when the brokers'
            # auto_create_topic is on); a v2 producer asks for the route first.
            groups = await self.io.auto_create_groups()
            if not groups:
                raise
            return svc.QueryRouteResponse(
                status=ok(),
                message_queues=routing.provisional_queues(topic, groups, self.proxies),
            )
        return svc.QueryRouteResponse(
            status=ok(), message_queues=routing.message_queues(route, self.proxies)
        )

    async def QueryAssignment(
        self, request: svc.QueryAssignmentRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.QueryAssignmentResponse:
        topic = convert.check_topic(request.topic)
        _check_group(request.group)
        route = await self.io.route(topic)
        # One assignment per broker group: a receive pops every queue of its group.
        out = []
        seen = set()
        for mq in routing.message_queues(route, self.proxies):
            if mq.broker.name in seen or mq.permission not in (v2.READ, v2.READ_WRITE):
                continue
            seen.add(mq.broker.name)
            mq.id = -1
            out.append(v2.Assignment(message_queue=mq))
        return svc.QueryAssignmentResponse(status=ok(), assignments=out)

    async def Heartbeat(
        self, request: svc.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.HeartbeatResponse:
        group = _check_group(request.group) if request.group.name else ""
        self._touch(self._client_id(context), request.client_type, group)
        return svc.HeartbeatResponse(status=ok())

    async def NotifyClientTermination(
        self,
        request: svc.NotifyClientTerminationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> svc.NotifyClientTerminationResponse:
        self._clients.pop(self._client_id(context), None)
        return svc.NotifyClientTerminationResponse(status=ok())

    # ---- send ---------------------------------------------------------------------------------

    async def SendMessage(
        self, request: svc.SendMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.SendMessageResponse:
        if not request.messages:
            raise ApiError(v2.BAD_REQUEST, "the request holds no message")
        if len(request.messages) > 1024:
            raise ApiError(v2.BAD_REQUEST, "at most 1024 messages per request")
        user = CALLER.get()
        held, _ = await self.quota.turn(Flow.PRODUCE, user, _hold_budget_ms(context, 0))
        entries = await asyncio.gather(*(self._send_one(m) for m in request.messages))
        self.quota.charge(Flow.PRODUCE, user, request.ByteSize())
        _tell_throttle(context, held)
        first_bad = next((e.status for e in entries if e.status.code != v2.OK), None)
        return svc.SendMessageResponse(status=first_bad or ok(), entries=entries)

    async def _send_one(self, msg: v2.Message) -> svc.SendResultEntry:
        try:
            out = convert.to_outgoing(msg, self.s.max_message_bytes)
            try:
                route = await self.io.route(out.topic)
                queue = routing.send_queue(route, out.message_group)
            except (TopicNotFoundError, NoRouteError):
                queue = None  # a new topic: the SDK's send creates it if the brokers allow
            if out.message_type == v2.TRANSACTION:
                return await self._send_half(out, queue)
            fut = self.producer.send_async(
                out.topic,
                out.body,
                tags=out.tag,
                keys=out.keys,
                properties=out.properties,
                queue=queue,
                deliver_at_ms=out.deliver_at_ms,
            )
            res: SendResult = await asyncio.wrap_future(fut)
        except Exception as exc:  # each message's failure in its own entry
            if not isinstance(exc, (ApiError, RaftMQError)):
                log.exception("proxy.send_failed")
            return svc.SendResultEntry(status=status_of(exc))
        return svc.SendResultEntry(
            status=ok(),
            message_id=out.message_id or res.msg_id,
            offset=res.queue_offset,
        )

    async def _send_half(
        self, out: convert.Outgoing, queue: QueueRef | None
    ) -> svc.SendResultEntry:
        loop = asyncio.get_running_loop()
        res = await loop.run_in_executor(None, self.txns.send_half, out, queue)
        half = res.half
        return svc.SendResultEntry(
            status=ok(),
            message_id=out.message_id or half.msg_id,
            transaction_id=transactions.transaction_id(half.broker_group, half.transaction_id),
        )

    # ---- transactions -------------------------------------------------------------------------

    async def EndTransaction(
        self, request: svc.EndTransactionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.EndTransactionResponse:
        topic = convert.check_topic(request.topic)
        state = transactions.resolution(request.resolution)
        transactions.parse_transaction_id(request.transaction_id)  # a bad one: no producer made
        from_check = request.source == v2.SOURCE_SERVER_CHECK
        await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: self.txns.end(topic, request.transaction_id, state, from_check=from_check),
        )
        log.info(
            "proxy.transaction_ended topic=%s txn=%s state=%s from_check=%s",
            topic,
            request.transaction_id,
            state.name,
            from_check,
        )
        return svc.EndTransactionResponse(status=ok())

    def _forward_check(self, topic: str, check: TransactionCheck) -> None:
        """A broker's check-back of a half message of `topic`: to one connected client that
        publishes the topic (none: the broker asks again after its check interval)."""
        m = check.message
        txn = transactions.transaction_id(m.broker_group, check.transaction_id)
        streams = [st for st in self._streams.values() if topic in st.topics]
        if not streams:
            log.info("proxy.check_unanswered topic=%s txn=%s: no client publishes it", topic, txn)
            return
        self._rotation += 1
        target = streams[self._rotation % len(streams)]
        cmd = svc.TelemetryCommand(
            recover_orphaned_transaction_command=svc.RecoverOrphanedTransactionCommand(
                message=convert.to_v2(
                    _stored(m),
                    receipt_handle="",
                    delivery_attempt=check.check_times or 1,
                    invisible_ms=0,
                    store_host=self.me,
                ),
                transaction_id=txn,
            )
        )
        if target.queue.full():
            log.warning(
                "proxy.check_dropped topic=%s txn=%s: the client's stream is full", topic, txn
            )
            return
        target.queue.put_nowait(cmd)
        log.info("proxy.check_forwarded topic=%s txn=%s", topic, txn)

    # ---- receive ------------------------------------------------------------------------------

    async def ReceiveMessage(
        self, request: svc.ReceiveMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[svc.ReceiveMessageResponse]:
        try:
            got, held = await self._receive(request, context)
            _tell_throttle(context, held)
        except Exception as exc:
            if not isinstance(exc, (ApiError, RaftMQError)):
                log.exception("proxy.receive_failed")
            yield svc.ReceiveMessageResponse(status=status_of(exc))
            return
        if not got:
            yield svc.ReceiveMessageResponse(
                status=v2.Status(
                    code=v2.MESSAGE_NOT_FOUND,
                    message="no message arrived within the long polling time",
                )
            )
            return
        yield svc.ReceiveMessageResponse(status=ok())
        ts = svc.ReceiveMessageResponse()
        ts.delivery_timestamp.FromMilliseconds(now_ms())
        yield ts
        for m in got:
            yield svc.ReceiveMessageResponse(message=m)

    async def _receive(
        self, request: svc.ReceiveMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[list[v2.Message], int]:
        """The messages of one receive (POP) and how long it was held for its user's quota."""
        group = _check_group(request.group)
        topic = convert.check_topic(request.message_queue.topic)
        self._touch(self._client_id(context), 0, group)
        batch = request.batch_size
        if not 1 <= batch <= self.s.max_receive_batch:
            raise ApiError(
                v2.BAD_REQUEST,
                f"batch_size {batch} is outside 1..{self.s.max_receive_batch}",
            )
        invisible_ms = (
            convert.duration_ms(request.invisible_duration)
            if request.HasField("invisible_duration")
            else DEFAULT_INVISIBLE_MS
        )
        self._check_invisible(invisible_ms)
        poll_ms = (
            convert.duration_ms(request.long_polling_timeout)
            if request.HasField("long_polling_timeout")
            else 0
        )
        if not 0 <= poll_ms <= self.s.max_long_polling_ms:
            raise ApiError(
                v2.ILLEGAL_POLLING_TIME,
                f"long polling timeout of {poll_ms} ms is outside 0..{self.s.max_long_polling_ms}"
                " ms (max_long_polling_ms)",
            )
        flt = _filter(request.filter_expression)
        route = await self.io.route(topic)
        queues = routing.read_queues(route, self.me, self.proxies)
        if not queues:
            raise ApiError(
                v2.FORBIDDEN if route.queues else v2.TOPIC_NOT_FOUND,
                f"topic {topic!r} has no readable queue served by this proxy ({self.me})",
            )
        fifo = routing.is_ordered(route)
        # Held before anything is popped, at most its long poll: a receive whose user still
        # owes then pops nothing (MESSAGE_NOT_FOUND, the client receives again), never fails.
        user = CALLER.get()
        held, turn = await self.quota.turn(Flow.CONSUME, user, _hold_budget_ms(context, poll_ms))
        if not turn:
            return [], held
        deadline = now_ms() + max(0, poll_ms - held)
        while True:
            got = await self._pop_once(group, queues, fifo, batch, invisible_ms, flt)
            if got or now_ms() >= deadline or context.done():
                self.quota.charge(Flow.CONSUME, user, sum(m.ByteSize() for m in got))
                return got, held
            await self._wait(group, queues, fifo, flt, deadline)

    def _check_invisible(self, invisible_ms: int) -> None:
        if not self.s.min_invisible_ms <= invisible_ms <= self.s.max_invisible_ms:
            raise ApiError(
                v2.ILLEGAL_INVISIBLE_TIME,
                f"invisible duration of {invisible_ms} ms is outside "
                f"{self.s.min_invisible_ms}..{self.s.max_invisible_ms} ms",
            )

    async def _state(self, group: str, q: QueueRef, fifo: bool | None) -> QueuePop:
        """The mirror of the queue's replicated POP state (loaded from the broker group's
        leader the first time; `fifo` None keeps what it is)."""
        key = PopKey(group, q)
        st = self._pops.get(key)
        if st is not None:
            self._pops.move_to_end(key)
            if fifo is not None:
                st.fifo = fifo
            return st
        loading = self._loading.get(key)
        if loading is not None:
            return await asyncio.shield(loading)
        fut: asyncio.Future[QueuePop] = asyncio.get_running_loop().create_future()
        self._loading[key] = fut
        try:
            st = await self._load(group, q, fifo)
            self._pops[key] = st
            self._evict()
            fut.set_result(st)
            return st
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(exc)
                fut.exception()  # retrieved: waiters (if any) get it from their await
            raise
        finally:
            del self._loading[key]

    async def _load(self, group: str, q: QueueRef, fifo: bool | None) -> QueuePop:
        resp = await self.io.pop_state(group, q.topic, q.broker_group, [q.queue_id])
        self._learn_retry_limit(group, q.broker_group, resp)
        found = next((s for s in resp.queues if s.queue_id == q.queue_id), None)
        if found is not None and found.exists:
            st = QueuePop(
                found.cursor,
                fifo=found.fifo if fifo is None else fifo,
                max_inflight=self.s.max_inflight_per_queue,
            )
            for d in found.inflight:
                st.inflight[d.offset] = Delivery(d.offset, d.attempt, d.token, d.visible_at_ms)
            return st
        # Never popped by the group: from its committed offset (a PushConsumer's, say), else
        # where `consume_from` says. The first receive's record carries this as init_offset.
        start = await self.io.committed(group, q)
        if start is None:
            low, high = await self.io.bounds(group, q)
            start = low if self.s.consume_from == "earliest" else high
        return QueuePop(start, fifo=bool(fifo), max_inflight=self.s.max_inflight_per_queue)

    def _forget(self, key: PopKey) -> None:
        """The mirror may differ from the broker's state (a call failed, or the broker refused
        what the mirror allowed): load it again at next use."""
        self._pops.pop(key, None)

    def _evict(self) -> None:
        """Past max_pop_queues, forget the least recently used mirrors (the state is the broker
        group's; a forgotten one is loaded again), idle ones first."""
        if len(self._pops) <= self.s.max_pop_queues:
            return
        for key in list(self._pops):
            if len(self._pops) <= self.s.max_pop_queues:
                return
            if not self._pops[key].inflight:
                del self._pops[key]
        while len(self._pops) > self.s.max_pop_queues:
            self._pops.popitem(last=False)

    async def _pop_once(
        self,
        group: str,
        queues: list[QueueRef],
        fifo: bool,
        batch: int,
        invisible_ms: int,
        flt: Filter,
    ) -> list[v2.Message]:
        out: list[v2.Message] = []
        self._rotation += 1
        start = self._rotation % len(queues)
        by_group: dict[str, list[QueueRef]] = {}
        for q in queues[start:] + queues[:start]:
            by_group.setdefault(q.broker_group, []).append(q)
        for broker_group, qs in by_group.items():
            if len(out) >= batch:
                break
            out += await self._pop_group(
                group, broker_group, qs, fifo, batch - len(out), invisible_ms, flt
            )
        return out

    async def _pop_group(
        self,
        group: str,
        broker_group: str,
        queues: list[QueueRef],
        fifo: bool,
        room: int,
        invisible_ms: int,
        flt: Filter,
    ) -> list[v2.Message]:
        """One receive on one broker group: plan each queue on the mirror, read what to hand
        out, then one POP_RECEIVE (one Raft entry) decides; only what it handed out goes back."""
        topic = queues[0].topic
        parts: list[pop_pb2.PopQueuePart] = []
        msgs: dict[tuple[int, int], ReceivedMessage] = {}
        planned = 0
        for q in queues:
            if planned >= room:
                break
            key = PopKey(group, q)
            st = await self._state(group, q, fifo)
            plan = st.plan(now_ms(), room - planned)
            part = pop_pb2.PopQueuePart(queue_id=q.queue_id, init_offset=st.cursor, fifo=fifo)
            for offset in plan.redeliver:
                try:
                    m = await self._fetch_at(group, q, offset)
                except (ApiError, RaftMQError):
                    break  # later ones wait too: a FIFO queue keeps its order
                if m is None:
                    part.drops.append(offset)  # gone from the queue (retention)
                    continue
                if st.exhausted(offset, self.max_attempts(group, broker_group)):
                    if not await self._dead_letter(group, st, m, "attempts"):
                        break  # kept: tried again at the next receive
                    part.drops.append(offset)
                    continue
                part.redeliver.append(offset)
                msgs[q.queue_id, offset] = m
                planned += 1
            if plan.new_from is not None and plan.new_max > 0 and planned < room:
                pulled = await self._pull_new(group, q, plan, flt)
                planned += self._plan_new(q, part, plan.new_from, room - planned, msgs, pulled, flt)
            if part.redeliver or part.drops or part.pulled:
                parts.append(part)
        if not parts:
            return []
        req = pop_pb2.PopReceiveRequest(
            consumer_group=group,
            topic=topic,
            invisible_ms=invisible_ms,
            max_inflight=self.s.max_inflight_per_queue,
            parts=parts,
        )
        try:
            resp = await self.io.pop_receive(topic, broker_group, req)
        except RaftMQError as exc:
            # It may still have been applied: those messages come back after their invisible
            # duration (at least once). The mirrors are loaded again.
            log.info("proxy.pop_receive_failed group=%s error=%s", group, exc.message)
            for part in parts:
                self._forget(PopKey(group, QueueRef(topic, broker_group, part.queue_id)))
            return []
        self._learn_retry_limit(group, broker_group, resp)
        asked = {p.queue_id: p for p in parts}
        out: list[v2.Message] = []
        for r in resp.parts:
            key = PopKey(group, QueueRef(topic, broker_group, r.queue_id))
            part = asked[r.queue_id]
            self._mirror_receive(key, part, r)
            for d in r.handed:
                m = msgs.get((r.queue_id, d.offset))
                if m is None:
                    continue  # not read by this receive (cannot happen: the record names it)
                out.append(
                    self._v2(
                        m, Delivery(d.offset, d.attempt, d.token, d.visible_at_ms), invisible_ms
                    )
                )
        return out

    async def _pull_new(self, group: str, q: QueueRef, plan: Plan, flt: Filter) -> Pulled | None:
        assert plan.new_from is not None
        try:
            return await self.io.pull(
                group, q, plan.new_from, plan.new_max, sql=flt.sql, tags=flt.tags
            )
        except RaftMQError as exc:
            log.info("proxy.pull_failed queue=%s error=%s", q, exc.message)
            return None

    @staticmethod
    def _plan_new(
        q: QueueRef,
        part: pop_pb2.PopQueuePart,
        pulled_from: int,
        room: int,
        msgs: dict[tuple[int, int], ReceivedMessage],
        pulled: Pulled | None,
        flt: Filter,
    ) -> int:
        """Fill the part's claim from a pull at the cursor; how many it may hand out."""
        if pulled is None:
            return 0
        if pulled.status == broker_pb2.OFFSET_ILLEGAL:
            part.pulled, part.pulled_from, part.reset = True, pulled_from, True
            part.reset_to = (
                pulled.min_offset if pulled_from < pulled.min_offset else pulled.max_offset
            )
            return 0
        if pulled.next_offset <= pulled_from:
            return 0  # nothing new: no entry for it
        matching = [m for m in pulled.messages if flt.matches(m)]  # tag hash collisions
        part.pulled, part.pulled_from, part.next_offset = True, pulled_from, pulled.next_offset
        part.take = room
        part.new_offsets.extend(m.queue_offset for m in matching)
        for m in matching:
            msgs[q.queue_id, m.queue_offset] = m
        return min(room, len(matching))

    def _mirror_receive(
        self, key: PopKey, part: pop_pb2.PopQueuePart, r: pop_pb2.PopPartResult
    ) -> None:
        """Apply the broker's answer to the mirror; when it refused a redelivery the mirror
        allowed (another receive took it, clocks differ), load the mirror again."""
        st = self._pops.get(key)
        if st is None:
            return
        if part.reset:
            self._forget(key)
            return
        for o in part.drops:
            st.drop(o)
        handed = {d.offset for d in r.handed}
        for d in r.handed:
            mine = st.inflight.get(d.offset)
            if mine is None or mine.token < d.token:  # tokens grow with the raft index
                st.inflight[d.offset] = Delivery(d.offset, d.attempt, d.token, d.visible_at_ms)
        st.cursor = max(st.cursor, r.cursor)
        refused_new = (
            part.pulled and part.take > 0 and part.new_offsets and not handed - set(part.redeliver)
        )
        if refused_new or any(o not in handed for o in part.redeliver):
            self._forget(key)  # e.g. an offset reset moved the cursor, or another receive did

    async def _fetch_at(self, group: str, q: QueueRef, offset: int) -> ReceivedMessage | None:
        """The message at `offset` again (a redelivery); None if the queue no longer holds it."""
        try:
            pulled = await self.io.pull(group, q, offset, 1)
        except RaftMQError as exc:
            log.info("proxy.refetch_failed queue=%s offset=%d error=%s", q, offset, exc.message)
            raise
        for m in pulled.messages:
            if m.queue_offset == offset:
                return m
        if pulled.status == broker_pb2.OFFSET_ILLEGAL and offset < pulled.min_offset:
            return None
        raise ApiError(
            v2.INTERNAL_SERVER_ERROR, f"message at offset {offset} of {q} could not be read"
        )

    def _v2(self, m: ReceivedMessage, d: Delivery, invisible_ms: int) -> v2.Message:
        handle = receipt.ReceiptHandle(
            self.epoch, m.broker_group, m.queue_id, d.offset, d.token, d.visible_at_ms
        ).encode()
        return convert.to_v2(
            _stored(m),
            receipt_handle=handle,
            delivery_attempt=d.attempt,
            invisible_ms=invisible_ms,
            store_host=self.me,
        )

    async def _wait(
        self, group: str, queues: list[QueueRef], fifo: bool, flt: Filter, deadline: int
    ) -> None:
        """Until a message may be there: a held pull on every queue that may give something
        new, or the time the earliest invisible message comes back, or the deadline."""
        now = now_ms()
        wake = deadline
        targets: list[tuple[QueueRef, int]] = []
        for q in queues:
            st = await self._state(group, q, fifo)
            visible = st.next_visible_ms()
            if visible is not None:
                wake = min(wake, visible)
            plan = st.plan(now, 1)
            if plan.new_from is not None:
                targets.append((q, plan.new_from))
        timeout_s = max(0.0, (wake - now) / 1000)
        while self._held_until and self._held_until[0] <= now:
            self._held_until.popleft()
        if targets and len(self._held_until) + len(targets) > MAX_HELD_PULLS:
            await asyncio.sleep(min(timeout_s, POLL_S))  # too many held: poll instead
            return
        hold_ms = max(0, min(wake - now, MAX_HELD_PULL_MS))
        pulls = [
            asyncio.ensure_future(
                self.io.pull(group, q, offset, 1, sql=flt.sql, tags=flt.tags, max_wait_ms=hold_ms)
            )
            for q, offset in targets
        ]
        self._held_until.extend([now + hold_ms] * len(pulls))
        if not pulls:
            await asyncio.sleep(max(timeout_s, MIN_WAIT_S) if wake < deadline else timeout_s)
            return
        done, pending = await asyncio.wait(
            pulls, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        for p in pending:
            p.cancel()
        failed = False
        for p in done:
            if p.exception() is not None:
                failed = True
        if failed:
            await asyncio.sleep(MIN_WAIT_S)

    # ---- ack / invisible duration -------------------------------------------------------------

    async def _lookup(
        self, group: str, topic: str, handle: receipt.ReceiptHandle
    ) -> tuple[PopKey, QueuePop]:
        """The handle's queue and its mirror. The state is the broker group's, so a handle
        issued before a proxy restart (or by another proxy) is as good as a new one."""
        q = QueueRef(topic, handle.broker_group, handle.queue_id)
        return PopKey(group, q), await self._state(group, q, None)

    @staticmethod
    def _precheck(st: QueuePop, handle: receipt.ReceiptHandle) -> AckOutcome | None:
        """What the mirror knows for sure without a Raft entry: done before (below the cursor,
        not in flight), or superseded (a newer token in flight; tokens grow with the log). None:
        the broker decides (a mirror loaded just before a receive applied may lag it)."""
        d = st.inflight.get(handle.offset)
        if d is None:
            return AckOutcome.ALREADY if handle.offset < st.cursor else None
        return AckOutcome.STALE if handle.token < d.token else None

    async def _ack_batch(
        self,
        group: str,
        topic: str,
        broker_group: str,
        items: list[tuple[PopKey, receipt.ReceiptHandle]],
        invisible_ms: int = 0,
    ) -> list[tuple[AckOutcome, pop_pb2.PopDelivery | None]]:
        """One POP_ACK (one Raft entry) for handles of one broker group; the mirrors follow."""
        req = pop_pb2.PopAckRequest(
            consumer_group=group,
            topic=topic,
            invisible_ms=invisible_ms,
            entries=[
                pop_pb2.PopAckEntry(queue_id=h.queue_id, offset=h.offset, token=h.token)
                for _, h in items
            ],
        )
        try:
            resp = await self.io.pop_ack(topic, broker_group, req)
        except RaftMQError:
            for key, _ in items:
                self._forget(key)
            raise
        out: list[tuple[AckOutcome, pop_pb2.PopDelivery | None]] = []
        for (key, h), r in zip(items, resp.results, strict=True):
            outcome = _ACK_OUTCOMES.get(r.outcome, AckOutcome.UNKNOWN)
            st = self._pops.get(key)
            d = r.delivery if r.HasField("delivery") else None
            if st is not None:
                mine = st.inflight.get(h.offset)
                if outcome is AckOutcome.DONE and d is None:
                    if mine is not None and mine.token <= h.token:
                        del st.inflight[h.offset]
                elif outcome is AckOutcome.DONE and d is not None:
                    if mine is None or mine.token <= d.token:
                        st.inflight[h.offset] = Delivery(
                            d.offset, d.attempt, d.token, d.visible_at_ms
                        )
                else:
                    self._forget(key)  # the mirror thought otherwise
            out.append((outcome, d))
        return out

    async def AckMessage(
        self, request: svc.AckMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.AckMessageResponse:
        group = _check_group(request.group)
        topic = convert.check_topic(request.topic)
        statuses: list[v2.Status | None] = [None] * len(request.entries)
        # Handles to acknowledge, by broker group: one Raft entry per broker group.
        todo: dict[str, list[tuple[int, PopKey, receipt.ReceiptHandle]]] = {}
        for i, e in enumerate(request.entries):
            try:
                handle = receipt.decode(e.receipt_handle)
                key, st = await self._lookup(group, topic, handle)
                known = self._precheck(st, handle)
                if known is AckOutcome.ALREADY:
                    statuses[i] = ok()
                elif known is not None:
                    raise ApiError(v2.INVALID_RECEIPT_HANDLE, _stale(known, handle))
                else:
                    todo.setdefault(handle.broker_group, []).append((i, key, handle))
            except (ApiError, RaftMQError) as exc:
                statuses[i] = status_of(exc)
        for broker_group, items in todo.items():
            try:
                results = await self._ack_batch(
                    group, topic, broker_group, [(k, h) for _, k, h in items]
                )
            except RaftMQError as exc:
                for i, _, _ in items:
                    statuses[i] = status_of(exc)
                continue
            for (i, _, handle), (outcome, _) in zip(items, results, strict=True):
                statuses[i] = (
                    ok()
                    if outcome in (AckOutcome.DONE, AckOutcome.ALREADY)
                    else status_of(ApiError(v2.INVALID_RECEIPT_HANDLE, _stale(outcome, handle)))
                )
        entries = [
            svc.AckMessageResultEntry(
                message_id=e.message_id, receipt_handle=e.receipt_handle, status=s
            )
            for e, s in zip(request.entries, statuses, strict=True)
        ]
        codes = {x.status.code for x in entries}
        overall = (
            ok()
            if codes <= {v2.OK}
            else entries[0].status
            if len(codes) == 1
            else v2.Status(code=v2.MULTIPLE_RESULTS, message="entries have different results")
        )
        return svc.AckMessageResponse(status=overall, entries=entries)

    async def ChangeInvisibleDuration(
        self,
        request: svc.ChangeInvisibleDurationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> svc.ChangeInvisibleDurationResponse:
        group = _check_group(request.group)
        topic = convert.check_topic(request.topic)
        invisible_ms = convert.duration_ms(request.invisible_duration)
        self._check_invisible(invisible_ms)
        handle = receipt.decode(request.receipt_handle)
        key, st = await self._lookup(group, topic, handle)
        known = self._precheck(st, handle)
        if known is not None:
            raise ApiError(v2.INVALID_RECEIPT_HANDLE, _stale(known, handle))
        [(outcome, d)] = await self._ack_batch(
            group, topic, handle.broker_group, [(key, handle)], invisible_ms
        )
        if outcome is not AckOutcome.DONE or d is None:
            raise ApiError(v2.INVALID_RECEIPT_HANDLE, _stale(outcome, handle))
        new = receipt.ReceiptHandle(
            self.epoch, handle.broker_group, handle.queue_id, d.offset, d.token, d.visible_at_ms
        )
        return svc.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=new.encode())

    # ---- dead letters -------------------------------------------------------------------------

    async def ForwardMessageToDeadLetterQueue(
        self,
        request: svc.ForwardMessageToDeadLetterQueueRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> svc.ForwardMessageToDeadLetterQueueResponse:
        """The client gives up on a message (a push consumer past its attempts): to %DLQ%group
        through the broker's send-back, then it is acknowledged (replicated)."""
        group = _check_group(request.group)
        topic = convert.check_topic(request.topic)
        handle = receipt.decode(request.receipt_handle)
        key, st = await self._lookup(group, topic, handle)
        known = self._precheck(st, handle)
        if known is AckOutcome.ALREADY:
            return svc.ForwardMessageToDeadLetterQueueResponse(status=ok("already done"))
        if known is not None:
            raise ApiError(v2.INVALID_RECEIPT_HANDLE, _stale(known, handle))
        m = await self._fetch_at(group, key.queue, handle.offset)
        if m is not None and not await self._dead_letter(group, st, m, "client", raise_errors=True):
            raise ApiError(v2.INTERNAL_SERVER_ERROR, "the message could not be dead-lettered")
        [(outcome, _)] = await self._ack_batch(group, topic, handle.broker_group, [(key, handle)])
        if outcome not in (AckOutcome.DONE, AckOutcome.ALREADY):
            raise ApiError(v2.INVALID_RECEIPT_HANDLE, _stale(outcome, handle))
        if m is None:
            return svc.ForwardMessageToDeadLetterQueueResponse(
                status=ok("the message is no longer in its queue")
            )
        return svc.ForwardMessageToDeadLetterQueueResponse(status=ok())

    async def _dead_letter(
        self,
        group: str,
        st: QueuePop,
        m: ReceivedMessage,
        reason: str,
        *,
        raise_errors: bool = False,
    ) -> bool:
        """Store `m` in %DLQ%<group> (the broker's send-back with no retries left); the caller
        then stops its delivery through the log. False (or the error) if the broker could not:
        the message stays unacknowledged and comes again."""
        busy = (group, m.broker_group, m.queue_id, m.queue_offset)
        if busy in self._dead_lettering:
            return False  # another call is storing it right now; it drops it
        if not raise_errors and not self._dead_letter_retry.ready(busy, time.monotonic()):
            return False  # failed a moment ago: kept until its back-off ends (a client's
            # explicit forward still tries at once and gets the error)
        sb = self._send_backs.pop(group, None) or SendBack(group, self.io.routes, self.io.pool)
        self._send_backs[group] = sb
        while len(self._send_backs) > MAX_CLIENTS:
            self._send_backs.popitem(last=False)
        attempts = st.inflight[m.queue_offset].attempt if m.queue_offset in st.inflight else 0
        # The dead letter carries the failed deliveries as its reconsume count, as a push
        # consumer's does; DEAD_LETTER_NOW: the broker must not weigh the group's limit again
        # (the message's own count is 0: it would send it to %RETRY% instead).
        counted = min(max(attempts - 1, 0), MAX_RETRY_TIMES)
        self._dead_lettering.add(busy)
        try:
            back = await asyncio.get_running_loop().run_in_executor(
                None, sb.send, m, 0, DEAD_LETTER_NOW, counted
            )
        except RaftMQError as exc:
            backoff_s = self._dead_letter_retry.failed(busy, time.monotonic())
            log.warning(
                "proxy.dead_letter_failed group=%s msg_id=%s error=%s retry_in_s=%.0f",
                group,
                m.msg_id,
                exc.message,
                backoff_s,
            )
            if raise_errors:
                raise
            return False
        finally:
            self._dead_lettering.discard(busy)
        self._dead_letter_retry.succeeded(busy)
        log.info(
            "proxy.dead_lettered group=%s by=%s topic=%s msg_id=%s attempts=%d dlq_id=%s",
            group,
            reason,
            m.topic,
            m.msg_id,
            attempts,
            back.msg_id,
        )
        return True

    # ---- housekeeping -------------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        """Idle transaction producers are closed here. (POP progress needs no commit from the
        proxy: the broker group's apply commits each queue's low watermark.)"""
        interval_s = self.s.offset_commit_interval_ms / 1000
        sweep_s = min(TXN_SWEEP_S, self.s.client_expiry_ms / 2000)
        next_sweep = time.monotonic() + sweep_s
        while True:
            await asyncio.sleep(max(interval_s, sweep_s))
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + sweep_s
                await self._close_idle_transactions()

    async def _close_idle_transactions(self) -> None:
        connected = {t for st in self._streams.values() for t in st.topics}
        idle = self.txns.idle_topics(connected, self.s.client_expiry_ms / 1000)
        if idle:
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.txns.close_topics, idle)
            except Exception:
                log.exception("proxy.transaction_close_failed")

    # ---- telemetry ----------------------------------------------------------------------------

    async def Telemetry(
        self,
        request_iterator: AsyncIterator[svc.TelemetryCommand],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[svc.TelemetryCommand]:
        """The settings exchange, and the way the proxy reaches the client: transaction
        check-backs (RecoverOrphanedTransactionCommand) are queued on the client's stream."""
        client_id = self._client_id(context)
        stream = Stream(asyncio.Queue(MAX_TELEMETRY_BACKLOG))
        reader = asyncio.ensure_future(self._telemetry_reader(client_id, stream, request_iterator))
        try:
            while True:
                cmd = await stream.queue.get()
                if cmd is None:
                    return
                yield cmd
        finally:
            reader.cancel()
            if client_id and self._streams.get(client_id) is stream:
                del self._streams[client_id]

    async def _telemetry_reader(
        self,
        client_id: str,
        stream: Stream,
        request_iterator: AsyncIterator[svc.TelemetryCommand],
    ) -> None:
        try:
            async for cmd in request_iterator:
                if cmd.WhichOneof("command") != "settings":
                    continue  # stack traces and verification results: nothing asked them yet
                await stream.queue.put(await self._telemetry_settings(client_id, stream, cmd))
        except Exception as exc:  # the client went away mid-read
            log.debug("proxy.telemetry_ended client=%s error=%s", client_id, exc)
        await stream.queue.put(None)  # the stream ends once what is queued has gone out

    async def _telemetry_settings(
        self, client_id: str, stream: Stream, cmd: svc.TelemetryCommand
    ) -> svc.TelemetryCommand:
        try:
            answer = await self._settings(cmd.settings)
        except Exception as exc:
            if not isinstance(exc, (ApiError, RaftMQError)):
                log.exception("proxy.settings_failed")
            return svc.TelemetryCommand(status=status_of(exc))
        group = (
            cmd.settings.subscription.group.name if cmd.settings.HasField("subscription") else ""
        )
        self._touch(client_id, cmd.settings.client_type, group)
        info = self._clients.get(client_id)
        if info is not None:
            info.settings = cmd.settings
        if cmd.settings.HasField("publishing") and client_id:
            stream.topics = frozenset(t.name for t in cmd.settings.publishing.topics)
            self._streams[client_id] = stream
        return svc.TelemetryCommand(status=ok(), settings=answer)

    def _remember_attempts(self, group: str, attempts: int) -> None:
        self._max_attempts.pop(group, None)
        self._max_attempts[group] = attempts
        while len(self._max_attempts) > MAX_CLIENTS:
            self._max_attempts.popitem(last=False)

    def _learn_retry_limit(
        self,
        group: str,
        broker_group: str,
        resp: pop_pb2.PopStateResponse | pop_pb2.PopReceiveResponse,
    ) -> None:
        if not resp.HasField("group_retry_max_times"):
            return
        key = (group, broker_group)
        self._retry_limits.pop(key, None)
        self._retry_limits[key] = resp.group_retry_max_times
        while len(self._retry_limits) > MAX_CLIENTS:
            self._retry_limits.popitem(last=False)

    def max_attempts(self, group: str, broker_group: str) -> int:
        """Deliveries of a POP message of `group` on `broker_group` before its dead letter: the
        group's retry limit there when configured, else the consumer's own, else the default."""
        return max_delivery_attempts(
            self._retry_limits.get((group, broker_group), USE_CONSUMER_LIMIT),
            self._max_attempts.get(group) or self.s.max_delivery_attempts,
        )

    async def _subscription_attempts(self, group: str, topics: list[TopicRoute]) -> int:
        """max_attempts for a consumer's settings: asked of the first broker group of its
        topics (one POP_STATE naming no queue) when no receive told it yet; the configs of a
        group are set on every broker group at once (`raftmq group config`)."""
        for route in topics if group else ():
            for broker_group in sorted({q.broker_group for q in route.queues}):
                if (group, broker_group) not in self._retry_limits:
                    try:
                        resp = await self.io.pop_state(group, route.topic, broker_group, [])
                    except RaftMQError:
                        continue  # unreachable now: the next one, or the default
                    self._learn_retry_limit(group, broker_group, resp)
                return self.max_attempts(group, broker_group)
        return self._max_attempts.get(group) or self.s.max_delivery_attempts

    async def _settings(self, mine: v2.Settings) -> v2.Settings:
        """The server's side of the settings exchange: limits and policies the client follows."""
        out = v2.Settings()
        out.CopyFrom(mine)
        if mine.HasField("publishing"):
            out.publishing.max_body_size = self.s.max_message_bytes
            out.publishing.validate_message_type = False
            out.backoff_policy.max_attempts = mine.backoff_policy.max_attempts or 3
            eb = out.backoff_policy.exponential_backoff
            eb.initial.FromMilliseconds(10)
            eb.max.FromMilliseconds(1_000)
            eb.multiplier = 2.0
        elif mine.HasField("subscription"):
            sub = out.subscription
            routes = []
            for entry in mine.subscription.subscriptions:
                try:
                    routes.append(await self.io.route(convert.check_topic(entry.topic)))
                except (ApiError, RaftMQError):
                    continue  # the topic appears later; receive says so then
            sub.fifo = any(routing.is_ordered(r) for r in routes)
            sub.receive_batch_size = self.s.max_receive_batch
            if not mine.subscription.HasField("long_polling_timeout"):
                sub.long_polling_timeout.FromMilliseconds(min(30_000, self.s.max_long_polling_ms))
            # RocketMQ's default retry policy of a consumer group: customized, the delay levels'
            # durations (1s 5s 10s 30s 1m ...); the official push consumers follow only a
            # customized one (their local FIFO retries, their nack's invisible duration). Its
            # max attempts are the group's retry limit + 1 when one is configured, the number
            # the proxy dead-letters at (max_attempts).
            group = mine.subscription.group.name
            if group and mine.backoff_policy.max_attempts:
                self._remember_attempts(group, mine.backoff_policy.max_attempts)
            out.backoff_policy.max_attempts = await self._subscription_attempts(group, routes)
            out.backoff_policy.customized_backoff.next.extend(
                Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)
                for ms in DEFAULT_DELAY_LEVELS_MS
            )
        return out


def _hold_budget_ms(context: grpc.aio.ServicerContext[Any, Any], poll_ms: int) -> int:
    """How long a call may be held for its user's quota: a receive its long poll (the client
    waits that long anyway), else half the call's deadline (the rest is for serving it)."""
    if poll_ms > 0:
        return poll_ms
    remaining = context.time_remaining()
    if remaining is None:
        return DEFAULT_SEND_HOLD_MS
    return max(0, int(remaining * 1000) // 2)


def _tell_throttle(context: grpc.aio.ServicerContext[Any, Any], held_ms: int) -> None:
    if held_ms:
        context.set_trailing_metadata(((THROTTLE_KEY, str(held_ms)),))


def _stale(outcome: AckOutcome, handle: receipt.ReceiptHandle) -> str:
    if outcome is AckOutcome.STALE:
        return (
            "the receipt handle has expired: the message became visible again and was received "
            "again (or its invisible duration was changed); use the newest handle"
        )
    return (
        f"offset {handle.offset} of queue {handle.broker_group}/{handle.queue_id} was never "
        "received with this handle"
    )
