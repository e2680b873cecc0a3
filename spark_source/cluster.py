"""The raftmq Spark source and sink talking to a cluster: routes from the NameServers, queue
bounds, offsets by time, pulls of an exact offset range, idempotent chunk sends.

Thin I/O shell over the gRPC stubs in client/pb; decisions live in planning.py and sink_plan.py.
Channels live in a bounded process-wide pool, never on an object Spark pickles. Every wait and
retry loop here has a deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from client.errors import (
    Fault,
    NoRouteError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RaftMQError,
    TopicNotFoundError,
    from_rpc_error,
)
from client.pb import broker_pb2, broker_pb2_grpc, common_pb2, namesrv_pb2, namesrv_pb2_grpc
from client.rebalance import QueueRef
from spark_source.planning import DataLossError, QueueBounds, QueueRange, check_start
from spark_source.sink_plan import Chunk

_log = logging.getLogger("spark_source")

MIB = 1 << 20
GRPC_OPTIONS = [
    # A pull answers up to the broker's pull_max_bytes (8 MiB by default) plus framing.
    ("grpc.max_receive_message_length", 64 * MIB),
    ("grpc.max_send_message_length", 64 * MIB),
]
MAX_CHANNELS = 64
RPC_TIMEOUT_S = 10.0
PULL_WAIT_MS = 1000  # long poll of one pull while a node catches up to the planned end
PULL_MAX_BYTES = 8 * MIB
SOURCE_GROUP = "spark-raftmq-source"  # pulls must name a group; nothing is committed under it
RETRY_SLEEP_S = (0.05, 0.1, 0.2, 0.5, 1.0)
MAX_INFLIGHT_CHUNKS = 16

_pool: OrderedDict[str, grpc.Channel] = OrderedDict()
_pool_lock = threading.Lock()


def channel(address: str) -> grpc.Channel:
    """A shared channel to `address` (LRU, at most MAX_CHANNELS; evicted ones are closed)."""
    with _pool_lock:
        ch = _pool.get(address)
        if ch is not None:
            _pool.move_to_end(address)
            return ch
        ch = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        _pool[address] = ch
        while len(_pool) > MAX_CHANNELS:
            _, old = _pool.popitem(last=False)
            old.close()
        return ch


def _call(fn: object, request: object, timeout_s: float) -> object:
    try:
        return fn(request, timeout=timeout_s)  # type: ignore[operator]
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


def _sleep_for(attempt: int) -> float:
    return RETRY_SLEEP_S[min(attempt, len(RETRY_SLEEP_S) - 1)]


# ---- routes -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupRoute:
    broker_group: str
    addresses: tuple[str, ...]  # the leader first (when known), then the other nodes


@dataclass(frozen=True, slots=True)
class TopicRoute:
    topic: str
    read_queues: tuple[QueueRef, ...]
    write_queues: tuple[QueueRef, ...]
    groups: tuple[GroupRoute, ...]

    def addresses(self, broker_group: str) -> tuple[str, ...]:
        for g in self.groups:
            if g.broker_group == broker_group:
                return g.addresses
        return ()


_READABLE = (common_pb2.PERM_UNSPECIFIED, common_pb2.PERM_READ_WRITE, common_pb2.PERM_READ_ONLY)
_WRITABLE = (common_pb2.PERM_UNSPECIFIED, common_pb2.PERM_READ_WRITE, common_pb2.PERM_WRITE_ONLY)


def route_from_pb(data: namesrv_pb2.TopicRouteData) -> TopicRoute:
    groups = []
    for g in sorted(data.groups, key=lambda g: g.broker_group):
        others = sorted(n.address for n in g.nodes if n.address != g.leader_address)
        addresses = ([g.leader_address] if g.leader_address else []) + others
        groups.append(GroupRoute(g.broker_group, tuple(addresses)))
    reads: list[QueueRef] = []
    writes: list[QueueRef] = []
    for qd in data.queues:
        if qd.perm in _READABLE:
            reads.extend(
                QueueRef(data.topic, qd.broker_group, i) for i in range(qd.read_queue_nums)
            )
        if qd.perm in _WRITABLE:
            writes.extend(
                QueueRef(data.topic, qd.broker_group, i) for i in range(qd.write_queue_nums)
            )
    return TopicRoute(
        data.topic, tuple(sorted(set(reads))), tuple(sorted(set(writes))), tuple(groups)
    )


class NameServers:
    """Route look-ups over a list of NameServers (each is soft state; any one will do)."""

    def __init__(self, addresses: Sequence[str], timeout_s: float = RPC_TIMEOUT_S) -> None:
        self.addresses = tuple(addresses)
        self.timeout_s = timeout_s

    def _ask(self, method: str, request: object) -> object:
        last: RaftMQError | None = None
        for addr in self.addresses:
            stub = namesrv_pb2_grpc.NameServerStub(channel(addr))
            try:
                return _call(getattr(stub, method), request, self.timeout_s)
            except NoRouteError:
                raise
            except RaftMQError as exc:
                last = exc
        assert last is not None
        raise last

    def route(self, topic: str) -> TopicRoute:
        """The topic's route; TopicNotFoundError when no broker group serves it."""
        try:
            data = self._ask(
                "GetRouteInfoByTopic", namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic)
            )
        except NoRouteError:
            raise TopicNotFoundError(
                f"topic {topic!r} is unknown to the NameServers at {', '.join(self.addresses)}: "
                f"no broker group serves it; create it with `raftmq topic create {topic}` "
                "or check the nameServer option",
                details={"topic": topic},
            ) from None
        assert isinstance(data, namesrv_pb2.TopicRouteData)
        return route_from_pb(data)

    def all_topics(self) -> list[str]:
        out = self._ask("GetAllTopics", namesrv_pb2.GetAllTopicsRequest())
        assert isinstance(out, namesrv_pb2.GetAllTopicsResponse)
        return list(out.topics)


# ---- driver side: bounds and offsets by time ----------------------------------------------------


def _per_queue(
    routes: Mapping[str, TopicRoute],
    queues: Sequence[QueueRef],
    make_call: str,
    make_request: object,
    timeout_s: float,
) -> dict[QueueRef, object]:
    """Ask each queue's group (leader first, then followers) concurrently; queues whose every
    node failed are left out of the answer (their group is down or unknown)."""
    answers: dict[QueueRef, object] = {}
    pending = list(queues)
    attempt = 0
    while pending:
        futures = []
        for q in pending:
            route = routes.get(q.topic)
            addrs = route.addresses(q.broker_group) if route else ()
            if attempt >= len(addrs):
                continue
            stub = broker_pb2_grpc.BrokerStub(channel(addrs[attempt]))
            req = make_request(q)  # type: ignore[operator]
            futures.append((q, getattr(stub, make_call).future(req, timeout=timeout_s)))
        if not futures:
            break
        pending = []
        for q, fut in futures:
            try:
                answers[q] = fut.result()
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                if err.fault is Fault.CALLER:
                    raise err from None
                pending.append(q)
        attempt += 1
    return answers


def queue_bounds(
    routes: Mapping[str, TopicRoute], queues: Sequence[QueueRef], timeout_s: float = RPC_TIMEOUT_S
) -> dict[QueueRef, QueueBounds]:
    out = _per_queue(
        routes,
        queues,
        "GetQueueBounds",
        lambda q: broker_pb2.GetQueueBoundsRequest(topic=q.topic, queue_id=q.queue_id),
        timeout_s,
    )
    result = {}
    for q, r in out.items():
        assert isinstance(r, broker_pb2.GetQueueBoundsResponse)
        result[q] = QueueBounds(r.min_offset, r.max_offset)
    return result


def offsets_for_times(
    routes: Mapping[str, TopicRoute],
    lookups: Mapping[QueueRef, int],
    timeout_s: float = RPC_TIMEOUT_S,
) -> dict[QueueRef, int]:
    """Queue -> first offset stored at or after its time (the queue's end when none is)."""
    out = _per_queue(
        routes,
        sorted(lookups),
        "SearchOffsetByTimestamp",
        lambda q: broker_pb2.SearchOffsetByTimestampRequest(
            topic=q.topic, queue_id=q.queue_id, timestamp_ms=lookups[q]
        ),
        timeout_s,
    )
    missing = sorted(set(lookups) - set(out))
    if missing:
        q = missing[0]
        raise RuntimeError(
            f"no node of broker group {q.broker_group} answered the offset-by-time look-up "
            f"for {q.topic}/{q.queue_id}; is the group running?"
        )
    return {q: r.offset for q, r in out.items()}  # type: ignore[attr-defined]


# ---- executor side: pull an exact range ---------------------------------------------------------


def pull_range(
    namesrv: NameServers,
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

    Pulls ask for raw record batches (the broker sends stored chunks untouched; we decode), and
    the next pull is in flight while the caller converts the current one. Any node of the group
    may answer (committed data is the same on every replica); a node that lags behind the
    planned end, fails or is gone is skipped for the next. Gives up after `poll_timeout_ms`
    without progress."""
    q = rng.queue
    where = f"{q.topic}/{q.broker_group}/{q.queue_id}"
    nodes = list(addresses)
    node = 0
    misses = 0  # failed tries since the last progress; a full round refreshes the route
    rounds = 0
    offset = rng.begin
    shorter_at: int | None = None  # a node said the queue ends before `offset`
    last_error = ""
    prefetch: tuple[int, str, grpc.Future[Any]] | None = None
    deadline = time.monotonic() + poll_timeout_ms / 1000

    def start(addr: str, at: int, wait_ms: int) -> grpc.Future[Any]:
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
        stub = broker_pb2_grpc.BrokerStub(channel(addr))
        return stub.PullMessage.future(req, timeout=wait_ms / 1000 + RPC_TIMEOUT_S)

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
                    nodes = list(namesrv.route(q.topic).addresses(q.broker_group)) or nodes
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
                    resp = fut.result()
                except grpc.RpcError as rpc_exc:
                    raise from_rpc_error(rpc_exc) from None
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


# ---- executor side: idempotent sends ------------------------------------------------------------


@dataclass(slots=True)
class SendTotals:
    stored: int = 0
    duplicates: int = 0
    chunks: int = 0


_InFlight = tuple["grpc.Future[Any]", Chunk[common_pb2.Message]]


class ChunkSender:
    """Sends a task's chunks with the idempotent producer: one chunk in flight per queue (a later
    sequence must never overtake an earlier one), several queues at once; a failed chunk is
    retried with the same sequences until `timeout_s` passes."""

    def __init__(self, namesrv: NameServers, producer_id: str, timeout_s: float) -> None:
        self.namesrv = namesrv
        self.producer_id = producer_id
        self.timeout_s = timeout_s
        self.totals = SendTotals()
        self._routes: dict[str, TopicRoute] = {}
        self._leaders: dict[tuple[str, str], str] = {}
        self._inflight: OrderedDict[QueueRef, _InFlight] = OrderedDict()

    def route(self, topic: str) -> TopicRoute:
        r = self._routes.get(topic)
        if r is None:
            r = self._routes[topic] = self.namesrv.route(topic)
        return r

    def _address(self, q: QueueRef, refresh: bool) -> str:
        if refresh:
            self._routes.pop(q.topic, None)
            self._leaders.pop((q.topic, q.broker_group), None)
        hint = self._leaders.get((q.topic, q.broker_group))
        if hint:
            return hint
        addrs = self.route(q.topic).addresses(q.broker_group)
        if not addrs:
            raise NoRouteError(f"broker group {q.broker_group} of topic {q.topic!r} has no node")
        return addrs[0]

    def _request(self, chunk: Chunk[common_pb2.Message]) -> broker_pb2.SendMessageRequest:
        return broker_pb2.SendMessageRequest(
            topic=chunk.queue.topic,
            queue_id=chunk.queue.queue_id,
            messages=chunk.items,
            producer_id=self.producer_id,
            first_sequence=chunk.first_sequence,
        )

    def submit(self, chunk: Chunk[common_pb2.Message]) -> None:
        if chunk.queue in self._inflight:
            self._resolve(chunk.queue)
        while len(self._inflight) >= MAX_INFLIGHT_CHUNKS:
            self._resolve(next(iter(self._inflight)))
        stub = broker_pb2_grpc.BrokerStub(channel(self._address(chunk.queue, False)))
        fut = stub.SendMessage.future(self._request(chunk), timeout=RPC_TIMEOUT_S)
        self._inflight[chunk.queue] = (fut, chunk)

    def drain(self) -> SendTotals:
        while self._inflight:
            self._resolve(next(iter(self._inflight)))
        return self.totals

    def _count(self, resp: broker_pb2.SendMessageResponse) -> None:
        self.totals.chunks += 1
        for r in resp.results:
            if r.duplicate:
                self.totals.duplicates += 1
            else:
                self.totals.stored += 1

    def _resolve(self, queue: QueueRef) -> None:
        fut, chunk = self._inflight.pop(queue)
        try:
            resp = fut.result()
        except grpc.RpcError as exc:
            resp = self._retry(chunk, from_rpc_error(exc))
        self._count(resp)

    def _retry(
        self, chunk: Chunk[common_pb2.Message], first: RaftMQError
    ) -> broker_pb2.SendMessageResponse:
        """Resend the same sequences until the broker answers; an earlier attempt that did land
        is answered as duplicate, so this never stores a message twice."""
        q = chunk.queue
        deadline = time.monotonic() + self.timeout_s
        err = first
        attempt = 0
        while True:
            if err.fault is Fault.CALLER:
                raise err
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"sending sequences {chunk.first_sequence}.."
                    f"{chunk.first_sequence + len(chunk.items) - 1} of producer "
                    f"{self.producer_id} to {q}: no success within {self.timeout_s} s "
                    f"(sendTimeoutMs); last error: {err}"
                )
            if isinstance(err, NotLeaderError) and err.leader_hint:
                self._leaders[q.topic, q.broker_group] = err.leader_hint
            else:
                self._leaders.pop((q.topic, q.broker_group), None)
                time.sleep(_sleep_for(attempt))
            attempt += 1
            try:
                refresh = not (isinstance(err, NotLeaderError) and err.leader_hint)
                addr = self._address(q, refresh)
                stub = broker_pb2_grpc.BrokerStub(channel(addr))
                out = _call(stub.SendMessage, self._request(chunk), RPC_TIMEOUT_S)
            except RaftMQError as exc:
                err = exc
                continue
            assert isinstance(out, broker_pb2.SendMessageResponse)
            return out
