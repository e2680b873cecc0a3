"""The proxy's way to the broker groups, through the raftmq SDK's routes, framed data path and
offset calls, as awaitables for the proxy's event loop. Thin: no decisions here.

A pull held by a broker (long polling) is a future on the data pool's loop, never a thread; route
look-ups and offset calls, which may block, run on a bounded pool of `blocking_threads`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from raftmq.client.data_pool import DataPool, no_data_address
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offsets import BrokerOffsets
from raftmq.client.raw_batch import decode_batches
from raftmq.client.routes import ChannelPool, RouteCache, TopicRoute
from raftmq.common.auth import Credentials
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import (
    BrokerUnavailableError,
    NotLeaderError,
    RaftMQError,
)
from raftmq.common.pb import broker_pb2, pop_pb2
from raftmq.common.types import QueueRef

T = TypeVar("T")
PULL_MARGIN_S = 5.0  # past a held pull's wait before the call counts as lost
POP_TIMEOUT_S = 10.0  # a POP state read or write (a Raft entry) on the group's leader
# A POP call that failed over (not the leader, unreachable) is tried again on the new route
# within this window: a failover takes a few seconds. Trying a write again is safe: the apply
# refuses what the first try already did (a moved cursor, an invisible message, a done ack).
POP_RETRY_WINDOW_S = 8.0
POP_RETRY_PAUSE_S = (0.1, 0.25, 0.5, 1.0)
MAX_PULL_MESSAGES = 256
AUTO_CREATE_TTL_S = 10.0  # how long the brokers' auto_create_topic answer is reused


@dataclass(frozen=True, slots=True)
class Pulled:
    status: int  # broker_pb2.PullStatus
    messages: list[ReceivedMessage]
    next_offset: int
    min_offset: int
    max_offset: int


class BrokerIO:
    def __init__(
        self,
        namesrv_addresses: str,
        blocking_threads: int,
        credentials: Credentials | None = None,
    ) -> None:
        self.pool = ChannelPool(credentials=credentials)
        self.data = DataPool(name="raftmq-proxy-data", credentials=credentials)
        self.routes = RouteCache(namesrv_addresses, self.pool)
        self._executor = ThreadPoolExecutor(blocking_threads, thread_name_prefix="proxy-blocking")
        self._offsets: dict[str, BrokerOffsets] = {}
        self._auto_create: tuple[float, list[str]] | None = None  # (asked at, groups)

    async def _blocking(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def route(self, topic: str) -> TopicRoute:
        return await self._blocking(lambda: self.routes.route(topic))

    async def auto_create_groups(self) -> list[str]:
        """The broker groups (with a leader) that create a topic on its first send: all of them
        when a leader's settings say auto_create_topic is on, else none. Asked at most once per
        AUTO_CREATE_TTL_S."""
        now = time.monotonic()
        if self._auto_create is not None and now - self._auto_create[0] < AUTO_CREATE_TTL_S:
            return self._auto_create[1]

        def ask() -> list[str]:
            leaders = sorted(
                (g.broker_group, g.leader_address)
                for c in self.routes.cluster_info().clusters
                for g in c.groups
                if g.leader_address
            )
            if not leaders:
                return []
            status = self.pool.broker(leaders[0][1]).GetBrokerStatus(
                broker_pb2.GetBrokerStatusRequest(), timeout=POP_TIMEOUT_S
            )
            on = status.config.get("auto_create_topic", "").lower() == "true"
            return [g for g, _ in leaders] if on else []

        try:
            groups = await self._blocking(ask)
        except (grpc.RpcError, RaftMQError):
            groups = []  # unknown: no provisional route (the topic is "not found", as before)
        self._auto_create = (now, groups)
        return groups

    def _offsets_of(self, group: str) -> BrokerOffsets:
        bo = self._offsets.get(group)
        if bo is None:
            bo = self._offsets[group] = BrokerOffsets(group, self.routes, self.pool, self.data)
        return bo

    async def committed(self, group: str, q: QueueRef) -> int | None:
        return await self._blocking(lambda: self._offsets_of(group).committed(q))

    async def bounds(self, group: str, q: QueueRef) -> tuple[int, int]:
        return await self._blocking(lambda: self._offsets_of(group).bounds(q))

    async def commit(self, group: str, offsets: Mapping[QueueRef, int]) -> None:
        await self._blocking(lambda: self._offsets_of(group).commit(offsets))

    async def pull(
        self,
        group: str,
        q: QueueRef,
        offset: int,
        max_count: int,
        *,
        sql: str = "",
        tags: str = "*",
        max_wait_ms: int = 0,
    ) -> Pulled:
        """One pull from the group's leader; RaftMQError on failure (routes refreshed)."""
        req = broker_pb2.PullMessageRequest(
            consumer_group=group,
            topic=q.topic,
            queue_id=q.queue_id,
            offset=offset,
            max_count=min(max_count, MAX_PULL_MESSAGES),
            filter_type=broker_pb2.SQL92 if sql else broker_pb2.TAG,
            filter_expression=sql or tags,
            max_wait_ms=max_wait_ms,
            raw_batches=True,
        )
        timeout_s = max_wait_ms / 1000 + PULL_MARGIN_S
        try:
            address = await self._blocking(lambda: self.routes.leader(q.topic, q.broker_group))
            data_address = self.routes.data_address(address)
            if not data_address:  # frames only, as the SDK's consumers (issue 24)
                raise no_data_address(address)
            fut = self.data.submit(data_address, DataMethod.PULL_MESSAGE, req, timeout_s)
            resp = await asyncio.wrap_future(fut)
        except RaftMQError as exc:
            if isinstance(exc, NotLeaderError) or exc.retryable:
                self.routes.invalidate(q.topic)
            raise
        assert isinstance(resp, broker_pb2.PullMessageResponse)
        stored = decode_batches(
            resp.batches, q.broker_group, q.queue_id, offsets=(offset, resp.next_offset)
        )
        return Pulled(
            resp.status,
            [ReceivedMessage.from_stored(m) for m in stored],
            resp.next_offset,
            resp.min_offset,
            resp.max_offset,
        )

    async def pop_state(
        self, group: str, topic: str, broker_group: str, queue_ids: list[int]
    ) -> pop_pb2.PopStateResponse:
        req = pop_pb2.PopStateRequest(consumer_group=group, topic=topic, queue_ids=queue_ids)
        resp = await self._pop_call(topic, broker_group, DataMethod.POP_STATE, req)
        assert isinstance(resp, pop_pb2.PopStateResponse)
        return resp

    async def pop_receive(
        self, topic: str, broker_group: str, req: pop_pb2.PopReceiveRequest
    ) -> pop_pb2.PopReceiveResponse:
        resp = await self._pop_call(topic, broker_group, DataMethod.POP_RECEIVE, req)
        assert isinstance(resp, pop_pb2.PopReceiveResponse)
        return resp

    async def pop_ack(
        self, topic: str, broker_group: str, req: pop_pb2.PopAckRequest
    ) -> pop_pb2.PopAckResponse:
        resp = await self._pop_call(topic, broker_group, DataMethod.POP_ACK, req)
        assert isinstance(resp, pop_pb2.PopAckResponse)
        return resp

    async def _pop_call(self, topic: str, broker_group: str, method: DataMethod, req: Any) -> Any:
        """One POP method on the broker group's leader over the framed data path (POP has no
        gRPC twin), tried again across a failover; RaftMQError on failure."""
        deadline = time.monotonic() + POP_RETRY_WINDOW_S
        attempt = 0
        while True:
            try:
                address = await self._blocking(lambda: self.routes.leader(topic, broker_group))
                data_address = self.routes.data_address(address)
                if not data_address:
                    raise BrokerUnavailableError(
                        f"the leader of broker group {broker_group!r} ({address}) offers no "
                        "framed data path; POP consumption needs it (data_listen must not be off)"
                    )
                return await asyncio.wrap_future(
                    self.data.submit(data_address, method, req, POP_TIMEOUT_S)
                )
            except RaftMQError as exc:
                if not (isinstance(exc, NotLeaderError) or exc.retryable):
                    raise
                self.routes.invalidate(topic)
                pause = POP_RETRY_PAUSE_S[min(attempt, len(POP_RETRY_PAUSE_S) - 1)]
                if time.monotonic() + pause >= deadline:
                    raise
                attempt += 1
                await asyncio.sleep(pause)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.data.close()
        self.pool.close()
