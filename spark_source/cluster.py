"""The raftmq Spark source talking to a cluster through the SDK's lowest layers: routes and
channels (client.routes), queue bounds and offsets by time (client.offsets), and its own pull of
an exact offset range [begin, end) without a consumer group (the SDK's fetchers pull open-ended
for a group).

Thin I/O shell; decisions live in planning.py. Connections live in SDK objects held by the
driver's view or in a small process-wide table on executors, never on an object Spark pickles.
Every wait and retry loop here has a deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from google.protobuf.message import Message

from raftmq.client.data_pool import DataPool, no_data_address
from raftmq.client.offsets import BrokerOffsets
from raftmq.client.routes import ChannelPool, RouteCache, TopicRoute
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import (
    Fault,
    NoRouteError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RaftMQError,
    RequestTimeoutError,
    TopicNotFoundError,
)
from raftmq.common.pb import broker_pb2
from raftmq.common.types import QueueRef
from raftmq.spark_source.planning import DataLossError, QueueBounds, QueueRange, check_start

_log = logging.getLogger("spark_source")

MIB = 1 << 20
RPC_TIMEOUT_S = 10.0
ANSWER_MARGIN_S = 5.0  # a pull's answer is waited for this much past its own timeout
PULL_WAIT_MS = 1000  # long poll of one pull while a node catches up to the planned end
PULL_MAX_BYTES = 8 * MIB
SOURCE_GROUP = "spark-raftmq-source"  # pulls must name a group; nothing is committed under it
RETRY_SLEEP_S = (0.05, 0.1, 0.2, 0.5, 1.0)
EXECUTOR_ROUTE_REFRESH_MS = 30_000
MAX_CLIENTS = 8  # NameServer lists one executor process keeps clients for


@dataclass(frozen=True, slots=True)
class ExecutorClient:
    """An executor process's SDK parts for one NameServer list: routes over gRPC, pulls over the
    framed data path (the SDK's consumers' path: the broker answers on its event loop, no thread
    per request, and the answer is not copied by gRPC)."""

    pool: ChannelPool
    routes: RouteCache
    data: DataPool

    def close(self) -> None:
        self.data.close()
        self.pool.close()


_clients: dict[tuple[str, ...], ExecutorClient] = {}
_clients_lock = threading.Lock()


def executor_client(namesrv: Sequence[str]) -> ExecutorClient:
    """This process's client for a NameServer list: Spark reuses Python workers across tasks,
    so connections outlive one task (and are never pickled)."""
    key = tuple(namesrv)
    with _clients_lock:
        found = _clients.get(key)
        if found is None:
            while len(_clients) >= MAX_CLIENTS:
                _, old = _clients.popitem()
                old.close()
            pool = ChannelPool()
            found = _clients[key] = ExecutorClient(
                pool,
                RouteCache(key, pool, refresh_interval_ms=EXECUTOR_ROUTE_REFRESH_MS),
                DataPool(name="raftmq-spark-data"),
            )
        return found


def _sleep_for(attempt: int) -> float:
    return RETRY_SLEEP_S[min(attempt, len(RETRY_SLEEP_S) - 1)]


def route_or_unknown(routes: RouteCache, topic: str, *, refresh: bool = False) -> TopicRoute:
    """The topic's route; TopicNotFoundError (with what to do) when no broker group serves it."""
    try:
        return routes.route(topic, refresh=refresh)
    except NoRouteError:
        raise TopicNotFoundError(
            f"topic {topic!r} is unknown to the NameServers at "
            f"{', '.join(routes.namesrv_addresses)}: no broker group serves it; create it with "
            f"`raftmq topic create {topic}` or check the nameServer option",
            details={"topic": topic},
        ) from None


def group_addresses(route: TopicRoute, broker_group: str) -> tuple[str, ...]:
    g = route.group(broker_group)
    return g.addresses if g is not None else ()


# ---- driver side: bounds and offsets by time ----------------------------------------------------


def queue_bounds(
    routes: RouteCache, pool: ChannelPool, queues: Sequence[QueueRef]
) -> dict[QueueRef, QueueBounds]:
    """Bounds of each queue from its group's leader; a queue whose group does not answer is left
    out (the caller keeps its offset until the group is back)."""
    offsets = BrokerOffsets(SOURCE_GROUP, routes, pool)
    out: dict[QueueRef, QueueBounds] = {}
    for q in queues:
        try:
            low, high = offsets.bounds(q)
        except RaftMQError as exc:
            _log.warning("spark_source.bounds_unavailable queue=%s error=%s", q, exc.message)
            continue
        out[q] = QueueBounds(low, high)
    return out


def offsets_for_times(
    routes: RouteCache, pool: ChannelPool, lookups: Mapping[QueueRef, int]
) -> dict[QueueRef, int]:
    """Queue -> first offset stored at or after its time (the queue's end when none is)."""
    offsets = BrokerOffsets(SOURCE_GROUP, routes, pool)
    return {q: offsets.for_timestamp(q, lookups[q]) for q in sorted(lookups)}


# ---- executor side: pull an exact range ---------------------------------------------------------


def _failed(exc: BaseException) -> Future[Message]:
    out: Future[Message] = Future()
    out.set_exception(exc)
    return out


def pull_range(
    client: ExecutorClient,
    rng: QueueRange,
    addresses: Sequence[str],
    *,
    tag_expression: str,
    batch_size: int,
    poll_timeout_ms: int,
    fail_on_data_loss: bool,
) -> Iterator[Sequence[broker_pb2.RawBatch]]:
    """The raw record batches holding `rng`, pull answer by pull answer, in offset order; they
    may hold offsets at or past `rng.end` and messages the tag filter refuses (the caller drops
    both: schema.to_record_batch).

    Pulls ask for raw record batches (the broker sends stored chunks untouched; we decode) over
    the framed data path, and the next pull is in flight while the caller converts the current
    one. Any node of the group may answer (committed data is the same on every replica); a node
    that lags behind the planned end, fails or is gone is skipped for the next. Gives up after
    `poll_timeout_ms` without progress."""
    q = rng.queue
    where = f"{q.topic}/{q.broker_group}/{q.queue_id}"
    nodes = list(addresses)
    node = 0
    misses = 0  # failed tries since the last progress; a full round refreshes the route
    rounds = 0
    offset = rng.begin
    shorter_at: int | None = None  # a node said the queue ends before `offset`
    last_error = ""
    prefetch: tuple[int, str, Future[Message]] | None = None
    deadline = time.monotonic() + poll_timeout_ms / 1000
    routes = client.routes

    def start(addr: str, at: int, wait_ms: int) -> Future[Message]:
        req = broker_pb2.PullMessageRequest(
            consumer_group=SOURCE_GROUP,
            topic=q.topic,
            queue_id=q.queue_id,
            offset=at,
            max_count=min(batch_size, rng.end - at),
            filter_type=broker_pb2.TAG,
            filter_expression=tag_expression,
            max_wait_ms=wait_ms,
            allow_follower_read=True,
            max_bytes=PULL_MAX_BYTES,
            raw_batches=True,
        )
        data_address = routes.data_address(addr)
        if not data_address:
            try:
                routes.route(q.topic)  # a route not fetched yet in this process names none
            except RaftMQError as exc:
                return _failed(exc)
            data_address = routes.data_address(addr)
        if not data_address:
            return _failed(no_data_address(addr))
        return client.data.submit(
            data_address, DataMethod.PULL_MESSAGE, req, wait_ms / 1000 + RPC_TIMEOUT_S
        )

    try:
        while offset < rng.end:
            if time.monotonic() > deadline:
                if shorter_at is not None:
                    if fail_on_data_loss:
                        raise DataLossError(
                            f"{where} ends at {shorter_at} but the plan reads up to {rng.end} "
                            "(was the topic deleted and created again?); set "
                            "failOnDataLoss=false to skip the missing offsets"
                        )
                    return
                raise TimeoutError(
                    f"reading {where} offsets {offset}..{rng.end - 1}: no progress for "
                    f"{poll_timeout_ms} ms (pollTimeoutMs); last error: {last_error}"
                )
            if not nodes or misses >= len(nodes):
                # Every known node failed once: the route may have changed (restart, leader).
                time.sleep(_sleep_for(rounds))
                rounds += 1
                misses = 0
                try:
                    fresh = routes.route(q.topic, refresh=True)
                    nodes = list(group_addresses(fresh, q.broker_group)) or nodes
                except RaftMQError as exc:
                    last_error = str(exc)
                if not nodes:
                    continue
            addr = nodes[node % len(nodes)]
            if prefetch is not None and prefetch[:2] == (offset, addr):
                fut = prefetch[2]
            else:
                if prefetch is not None:
                    prefetch[2].cancel()
                # Wait on the broker only after a node came up short: a filtered scan that
                # reaches the queue's end would otherwise be held for nothing.
                fut = start(addr, offset, PULL_WAIT_MS if misses else 0)
            prefetch = None
            try:
                try:
                    resp = fut.result(PULL_WAIT_MS / 1000 + RPC_TIMEOUT_S + ANSWER_MARGIN_S)
                except FutureTimeout:  # (the pool's own timer fails the call first)
                    raise RequestTimeoutError(f"no answer from {addr} to a pull") from None
                assert isinstance(resp, broker_pb2.PullMessageResponse)
            except OffsetOutOfRangeError as exc:
                low, high = exc.min_offset, exc.max_offset
                if low is not None and high is not None and offset < low:
                    # Retention deleted what the plan names; that is the same on every node.
                    bounds = QueueBounds(low, max(low, high))
                    ok = check_start(q, offset, bounds, fail_on_data_loss=fail_on_data_loss)
                    offset = min(ok, rng.end)
                    deadline = time.monotonic() + poll_timeout_ms / 1000
                    continue
                # This node has not applied up to `offset` yet, or the queue shrank.
                shorter_at = high
                last_error = str(exc)
                node += 1
                misses += 1
                continue
            except RaftMQError as exc:
                if exc.fault is Fault.CALLER:
                    raise
                last_error = str(exc)
                hint = exc.leader_hint if isinstance(exc, NotLeaderError) else ""
                if hint and hint not in nodes:
                    nodes.insert(0, hint)
                    node = 0
                else:
                    node += 1
                misses += 1
                continue
            if resp.status == broker_pb2.NO_NEW_MSG and resp.next_offset <= offset:
                # Nothing at `offset` on this node: it is behind the planned end.
                last_error = f"node {addr} has nothing at offset {offset} yet"
                node += 1
                misses += 1
                continue
            # FOUND, NO_MATCHED_MSG, or NO_NEW_MSG after the filter skipped to the node's end.
            nxt = max(offset + 1, resp.next_offset)
            if nxt < rng.end:
                prefetch = (nxt, addr, start(addr, nxt, 0))
            offset = nxt
            misses = rounds = 0
            shorter_at = None
            deadline = time.monotonic() + poll_timeout_ms / 1000
            if resp.batches:
                yield resp.batches
    finally:
        if prefetch is not None:
            prefetch[2].cancel()
