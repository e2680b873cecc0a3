"""TransactionProducer: RocketMQ's TransactionMQProducer. A producer group and a checker.

`send_in_transaction` stores a half message (invisible to consumers), runs the local
transaction, then commits or rolls back (or leaves it unknown: the broker checks back). The
checker answers check-backs: each instance keeps one long poll (PollTransactionChecks) open on
the leader of every broker group of the cluster, so the broker never connects to a client, and
any live member of the group may be asked, whichever instance sent the half message.

Ends and half sends are idempotent (a retried end of an ended transaction is a success; a half
retried under the same transaction id is stored once), so both are retried across leader
changes until `end_timeout_ms` / `send_timeout_ms`.

Over the framed data path, the half sends (and the ends) that the producer's threads make while
one is in flight to the same leader go together in the next request (client/coalescer.py): a
transaction still waits for both answers, but a busy producer pays one request per batch. A
batch's item that fails in a way worth retrying is retried alone, as a single call.
"""

from __future__ import annotations

import enum
import itertools
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from raftmq.client.coalescer import Coalescer
from raftmq.client.data_pool import BLOCKING_MARGIN_S, DataPool, no_data_address
from raftmq.client.messages import ReceivedMessage, to_pb
from raftmq.client.routes import ChannelPool, RouteCache
from raftmq.common import tls
from raftmq.common.arguments import checked
from raftmq.common.auth import Credentials
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    NoRouteError,
    NotLeaderError,
    OutcomeUnknownError,
    RaftMQError,
    RequestTimeoutError,
    UnsupportedError,
    from_rpc_error,
)
from raftmq.common.frame import error_from_detail
from raftmq.common.message import validate_group, validate_topic
from raftmq.common.pb import transaction_pb2, transaction_pb2_grpc
from raftmq.common.types import QueueRef

__all__ = [
    "HalfMessage",
    "LocalTransactionState",
    "TransactionCheck",
    "TransactionProducer",
    "TransactionSendResult",
]

log = logging.getLogger("raftmq.producer.transaction")
T = TypeVar("T", bound=Message)
U = TypeVar("U", bound=Message)
# The batched requests' responses: `results`, each a `response` or an `error`.
_Batched = transaction_pb2.SendHalfMessagesResponse | transaction_pb2.EndTransactionsResponse

RETRY_BACKOFF_S = 0.1
MAX_BACKOFF_S = 1.0
HINT_PAUSE_S = 0.02  # after following a NOT_LEADER hint


class LocalTransactionState(enum.Enum):
    """RocketMQ's LocalTransactionState: what the local transaction (or the checker) says."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"  # not decided yet: the broker checks back later


_TO_PB = {
    LocalTransactionState.COMMIT: transaction_pb2.COMMIT,
    LocalTransactionState.ROLLBACK: transaction_pb2.ROLLBACK,
    LocalTransactionState.UNKNOWN: transaction_pb2.UNKNOWN,
}


@dataclass(frozen=True, slots=True)
class HalfMessage:
    """The stored half message, as the local transaction sees it."""

    transaction_id: str
    msg_id: str
    topic: str
    broker_group: str
    queue_id: int
    body: bytes


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """The half message and how its transaction ends. `end`: the end's answer to come (the
    transaction's state after it), or None when the state is UNKNOWN (nothing is sent; the
    broker checks back). As in RocketMQ, `send_in_transaction` does not wait for the end: an end
    that cannot be delivered leaves the transaction to a check-back, which the checker decides.
    `end_error()` waits for it, for callers who want to know."""

    half: HalfMessage
    state: LocalTransactionState
    end: Future[str] | None = None

    @property
    def transaction_id(self) -> str:
        return self.half.transaction_id

    def end_error(self, timeout_s: float = 60.0) -> RaftMQError | None:
        """Wait up to `timeout_s` for the end: None when it was applied (or nothing was sent),
        else the typed error that refused it or kept it from arriving."""
        if self.end is None:
            return None
        try:
            self.end.result(timeout_s)
        except FutureTimeout:
            return RequestTimeoutError(
                f"the end of transaction {self.transaction_id} was not answered within "
                f"{timeout_s:g}s; the broker checks it back"
            )
        except RaftMQError as exc:
            return exc
        return None


@dataclass(frozen=True, slots=True)
class TransactionCheck:
    """A check-back: the half message as stored and how many times it was checked so far."""

    transaction_id: str
    producer_group: str
    message: ReceivedMessage
    check_times: int


LocalTransaction = Callable[[HalfMessage], LocalTransactionState]
TransactionChecker = Callable[[TransactionCheck], LocalTransactionState]


def _retryable(err: RaftMQError) -> bool:
    # Both calls are idempotent, so an unknown outcome is retried like an unavailable leader.
    return isinstance(
        err, (NotLeaderError, BrokerUnavailableError, RequestTimeoutError, OutcomeUnknownError)
    )


class TransactionProducer:
    """A context manager; thread-safe. `checker` runs on this producer's check threads (one per
    broker group), one check at a time per group: keep it short."""

    @checked
    def __init__(
        self,
        namesrv_addresses: str | Sequence[str],
        producer_group: str,
        checker: TransactionChecker,
        *,
        client_id: str | None = None,
        request_timeout_ms: int = 3_000,
        send_timeout_ms: int = 15_000,
        end_timeout_ms: int = 15_000,
        check_poll_ms: int = 2_000,
        group_refresh_ms: int = 5_000,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        validate_group(producer_group)
        if not callable(checker):
            raise InvalidArgumentError("checker must be a callable(TransactionCheck) -> state")
        for name, value in (
            ("request_timeout_ms", request_timeout_ms),
            ("send_timeout_ms", send_timeout_ms),
            ("end_timeout_ms", end_timeout_ms),
            ("check_poll_ms", check_poll_ms),
            ("group_refresh_ms", group_refresh_ms),
        ):
            if value <= 0:
                raise InvalidArgumentError(f"{name} must be > 0, got {value}")
        self.producer_group = producer_group
        self.client_id = client_id or f"{socket.gethostname()}@txn-{uuid.uuid4().hex[:12]}"
        self._checker = checker
        self._request_s = request_timeout_ms / 1000
        self._send_s = send_timeout_ms / 1000
        self._end_s = end_timeout_ms / 1000
        self._poll_ms = check_poll_ms
        self._refresh_s = group_refresh_ms / 1000
        self._tls = tls.client_tls(tls_ca, tls_cert, tls_key)  # RAFTMQ_TLS_* if none
        self._pool = ChannelPool(tls_config=self._tls, credentials=credentials)
        self._data = DataPool(
            tls_config=self._tls, name="raftmq-txn-data", credentials=credentials
        )  # half sends and ends, where offered
        self.routes = RouteCache(namesrv_addresses, self._pool)
        self._halves: Coalescer[
            transaction_pb2.SendHalfMessageRequest, transaction_pb2.SendHalfMessageResponse
        ] = Coalescer(self._send_halves)
        self._ends: Coalescer[
            transaction_pb2.EndTransactionRequest, transaction_pb2.EndTransactionResponse
        ] = Coalescer(self._send_ends)
        self._pending_ends: set[Future[str]] = set()
        # Ends that could not go batched: single calls with retries, off the callers' threads
        # and never on the data pool's loop (bounded by the coalescer's waiting limit).
        self._end_pool = ThreadPoolExecutor(2, thread_name_prefix="raftmq-txn-end")
        self._host = socket.gethostname()
        self._lock = threading.Lock()
        self._leaders: dict[str, str] = {}  # broker group -> leader gRPC address
        # gRPC stubs for the check-back long poll only; halves and ends go over frames
        self._stubs: dict[str, transaction_pb2_grpc.BrokerTransactionStub] = {}
        self._rr = itertools.count()
        self._closed = threading.Event()
        self._pollers: dict[str, threading.Thread] = {}
        self._watcher = threading.Thread(
            target=self._watch_groups, name="raftmq-txn-groups", daemon=True
        )
        self._watcher.start()

    # ---- public API ---------------------------------------------------------------------------

    def send_in_transaction(
        self,
        topic: str,
        body: bytes,
        local_transaction: LocalTransaction,
        *,
        tags: str | None = None,
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        queue: QueueRef | None = None,
        check_immunity_ms: int = 0,
    ) -> TransactionSendResult:
        """Store a half message, run `local_transaction(half)` and send the end its answer
        calls for (an exception counts as UNKNOWN, as in RocketMQ), without waiting for the end:
        `result.end_error()` waits, `flush()` waits for all. Raises if the half message could
        not be stored (then the local transaction did not run)."""
        if self._closed.is_set():
            raise InvalidArgumentError("the transaction producer is closed")
        validate_topic(topic)
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"a message body must be bytes, not {type(body).__name__}")
        if not callable(local_transaction):
            raise InvalidArgumentError("local_transaction must be a callable(HalfMessage)")
        if isinstance(keys, str):
            raise InvalidArgumentError("keys must be a sequence of strings, not one string")
        if check_immunity_ms < 0:
            raise InvalidArgumentError("check_immunity_ms must be >= 0")
        group, queue_id = self._choose(topic, queue)
        txn_id = uuid.uuid4().hex
        born_ms = time.time_ns() // 1_000_000
        msg = to_pb(bytes(body), tags, tuple(keys), properties, born_ms, self._host)
        req = transaction_pb2.SendHalfMessageRequest(
            topic=topic,
            queue_id=queue_id,
            message=msg,
            producer_group=self.producer_group,
            client_id=self.client_id,
            transaction_id=txn_id,
            check_immunity_ms=check_immunity_ms,
        )
        resp = self._batched(group, self._halves, req)
        if resp is None:
            alone = self._on_leader(group, DataMethod.SEND_HALF_MESSAGE, req, self._send_s)
            assert isinstance(alone, transaction_pb2.SendHalfMessageResponse)  # PAYLOADS' type
            resp = alone
        half = HalfMessage(txn_id, resp.msg_id, topic, group, resp.queue_id, bytes(body))
        try:
            state = local_transaction(half)
            if not isinstance(state, LocalTransactionState):
                log.warning(
                    "producer.local_transaction_bad_answer txn=%s answer=%r: taken as UNKNOWN",
                    txn_id,
                    state,
                )
                state = LocalTransactionState.UNKNOWN
        except Exception:
            log.exception("producer.local_transaction_failed txn=%s: taken as UNKNOWN", txn_id)
            state = LocalTransactionState.UNKNOWN
        if state is LocalTransactionState.UNKNOWN:
            return TransactionSendResult(half, state)
        return TransactionSendResult(half, state, self._end_later(group, txn_id, state))

    def end_transaction(
        self,
        broker_group: str,
        transaction_id: str,
        state: LocalTransactionState,
        *,
        from_check: bool = False,
    ) -> str:
        """Commit or roll back (UNKNOWN: report it) a transaction of this producer group on
        `broker_group`; returns its state after the end. Repeating an end is a success;
        TransactionNotFoundError / TransactionConflictError say why an end cannot be done."""
        req = self._end_request(transaction_id, state, from_check)
        resp = self._batched(broker_group, self._ends, req)
        return resp.state if resp is not None else self._end_alone(broker_group, req)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every end `send_in_transaction` sent has been answered (at most
        `timeout_s`, default end_timeout_ms); True if none is left."""
        with self._lock:
            pending = list(self._pending_ends)
        _, left = wait(pending, self._end_s if timeout_s is None else timeout_s)
        return not left

    def _end_request(
        self, transaction_id: str, state: LocalTransactionState, from_check: bool
    ) -> transaction_pb2.EndTransactionRequest:
        if not isinstance(state, LocalTransactionState):
            raise InvalidArgumentError("state must be a LocalTransactionState")
        return transaction_pb2.EndTransactionRequest(
            transaction_id=transaction_id,
            producer_group=self.producer_group,
            resolution=_TO_PB[state],
            from_check=from_check,
            client_id=self.client_id,
        )

    def _end_alone(self, broker_group: str, req: transaction_pb2.EndTransactionRequest) -> str:
        """One end as a single call, retried across leader changes within end_timeout_ms."""
        resp = self._on_leader(broker_group, DataMethod.END_TRANSACTION, req, self._end_s)
        assert isinstance(resp, transaction_pb2.EndTransactionResponse)  # PAYLOADS' type
        return resp.state

    def _end_later(self, group: str, txn_id: str, state: LocalTransactionState) -> Future[str]:
        """Send the end without waiting for it (RocketMQ's endTransactionOneway, answered):
        in the next batched request to the leader, or, where that cannot take it or failed in
        a way worth retrying, as a single call with retries on the end thread."""
        req = self._end_request(txn_id, state, False)
        out: Future[str] = Future()
        with self._lock:
            self._pending_ends.add(out)

        def finished(f: Future[str]) -> None:
            with self._lock:
                self._pending_ends.discard(f)
            exc = f.exception()
            if exc is not None:
                log.warning("producer.end_transaction_failed txn=%s error=%s", txn_id, exc)

        out.add_done_callback(finished)

        def alone() -> None:
            try:
                out.set_result(self._end_alone(group, req))
            except RaftMQError as exc:
                out.set_exception(exc)
            except Exception as exc:  # a bug: end_error() and flush() must not wait for ever
                out.set_exception(exc)
                raise

        def answered(f: Future[transaction_pb2.EndTransactionResponse]) -> None:
            exc = f.exception()
            if exc is None:
                out.set_result(f.result().state)
            elif isinstance(exc, UnsupportedError) or (
                isinstance(exc, RaftMQError) and _retryable(exc)
            ):
                retry_alone()  # never block the data pool's loop
            else:
                out.set_exception(exc)

        def retry_alone() -> None:
            try:
                self._end_pool.submit(alone)
            except RuntimeError:  # closed meanwhile
                out.set_exception(BrokerUnavailableError("the transaction producer was closed"))

        data_address = self._data_address(group)
        try:
            if not data_address:
                raise UnsupportedError("no framed data path")
            self._ends.submit(data_address, req).add_done_callback(answered)
        except RaftMQError:  # no data path, or too many ends waiting: one call, on the end thread
            retry_alone()
        return out

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if not self.flush():
            log.warning("producer.close_ends_unanswered: the broker checks them back")
        self._end_pool.shutdown(wait=False, cancel_futures=True)
        self._watcher.join(5)
        self._pool.close()  # cancels the held check polls: their threads end at once
        for t in list(self._pollers.values()):
            t.join(self._poll_ms / 1000 + 5)
        self._data.close()
        self._pool.close()  # a channel a poller opened meanwhile

    def __enter__(self) -> TransactionProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- routing ------------------------------------------------------------------------------

    def _choose(self, topic: str, queue: QueueRef | None) -> tuple[str, int]:
        if queue is not None:
            if queue.topic != topic:
                raise InvalidArgumentError(f"queue {queue} is not a queue of topic {topic!r}")
            return queue.broker_group, queue.queue_id
        try:
            queues = self.routes.route(topic).publish_queues().queues
        except NoRouteError:
            queues = ()
        if queues:
            q = queues[next(self._rr) % len(queues)]
            return q.broker_group, q.queue_id
        groups = self._groups()  # unknown topic: a group's leader auto-creates it (or refuses)
        if not groups:
            raise NoRouteError.for_topic(topic, self.routes.namesrv_addresses)
        return groups[next(self._rr) % len(groups)], -1

    def _groups(self) -> list[str]:
        info = self.routes.cluster_info()
        found: dict[str, str] = {}
        for c in info.clusters:
            for g in c.groups:
                found[g.broker_group] = g.leader_address
        with self._lock:
            for group, leader in found.items():
                if leader:
                    self._leaders[group] = leader
        return sorted(found)

    def _leader(self, group: str, refresh: bool) -> str:
        with self._lock:
            address = self._leaders.get(group)
        if address and not refresh:
            return address
        self._groups()
        with self._lock:
            address = self._leaders.get(group)
        if not address:
            raise NotLeaderError.for_node("-", group, "")
        return address

    def _stub(self, address: str) -> transaction_pb2_grpc.BrokerTransactionStub:
        """The gRPC stub of `address`, for the check-back long poll (no framed method)."""
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                stub = self._stubs[address] = transaction_pb2_grpc.BrokerTransactionStub(
                    self._pool.channel(address)
                )
            return stub

    def _batched(self, group: str, coalescer: Coalescer[T, U], request: T) -> U | None:
        """`request` in the next batched request to the group's leader when its address is
        known and it offers a data path; None when it cannot go that way or failed in a way
        worth retrying (the caller then makes the single call, with its retries)."""
        data_address = self._data_address(group)
        if not data_address:
            return None
        try:
            return coalescer.submit(data_address, request).result(
                self._request_s + BLOCKING_MARGIN_S
            )
        except FutureTimeout:
            return None
        except RaftMQError as exc:
            if isinstance(exc, UnsupportedError) or _retryable(exc):
                return None  # an older broker, or a leader change: the single call retries
            raise

    def _data_address(self, group: str) -> str:
        """The known leader's framed data address ("" when unknown or not offered)."""
        with self._lock:
            address = self._leaders.get(group)
        return self.routes.data_address(address) if address else ""

    def _send_batch(
        self, data_address: str, method: DataMethod, request: Message, response: type[_Batched]
    ) -> Future[Sequence[Any]]:
        """One batched request; a Future of its per-item answers, in order: each item's
        response, or the typed error that refused it."""
        out: Future[Sequence[Any]] = Future()

        def answered(f: Future[Message]) -> None:
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
                return
            resp = f.result()
            assert isinstance(resp, response)  # PAYLOADS: the method's response type
            out.set_result(
                [error_from_detail(r.error) if r.HasField("error") else r.response
                 for r in resp.results]
            )  # fmt: skip

        self._data.submit(data_address, method, request, self._request_s).add_done_callback(
            answered
        )
        return out

    def _send_halves(
        self, data_address: str, halves: list[transaction_pb2.SendHalfMessageRequest]
    ) -> Future[Sequence[transaction_pb2.SendHalfMessageResponse | RaftMQError]]:
        req = transaction_pb2.SendHalfMessagesRequest(halves=halves)
        return self._send_batch(
            data_address,
            DataMethod.SEND_HALF_MESSAGES,
            req,
            transaction_pb2.SendHalfMessagesResponse,
        )

    def _send_ends(
        self, data_address: str, ends: list[transaction_pb2.EndTransactionRequest]
    ) -> Future[Sequence[transaction_pb2.EndTransactionResponse | RaftMQError]]:
        req = transaction_pb2.EndTransactionsRequest(ends=ends)
        return self._send_batch(
            data_address, DataMethod.END_TRANSACTIONS, req, transaction_pb2.EndTransactionsResponse
        )

    def _on_leader(
        self,
        group: str,
        method: DataMethod,
        request: Message,
        budget_s: float,
    ) -> Message:
        """`request` on the group's leader over its framed data path (the SDK's one data
        transport; a leader without one is unavailable), retried across leader changes within
        budget_s; the method's response (PAYLOADS)."""
        deadline = time.monotonic() + budget_s
        refresh = False
        backoff = RETRY_BACKOFF_S
        while True:
            err: RaftMQError
            try:
                address = self._leader(group, refresh)
                data_address = self.routes.data_address(address)
                if not data_address:  # retried after a route refresh, like a dead leader
                    raise no_data_address(address)
                return self._data.call(data_address, method, request, self._request_s)
            except RaftMQError as exc:
                err = exc
            if not _retryable(err) or time.monotonic() + backoff > deadline:
                raise err
            if err.leader_hint:
                with self._lock:
                    self._leaders[group] = err.leader_hint
                refresh = False
                time.sleep(HINT_PAUSE_S)  # two nodes that point at each other: no busy loop
            else:
                refresh = True
                time.sleep(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)

    # ---- check-back ---------------------------------------------------------------------------

    def _watch_groups(self) -> None:
        """Keep one poller per broker group of the cluster (groups appear as they register)."""
        while not self._closed.is_set():
            try:
                for group in self._groups():
                    if group not in self._pollers:
                        t = threading.Thread(
                            target=self._poll_loop,
                            args=(group,),
                            name=f"raftmq-txn-check-{group}",
                            daemon=True,
                        )
                        self._pollers[group] = t
                        t.start()
            except RaftMQError as exc:
                log.debug("producer.txn_groups_unknown error=%s", exc)
            self._closed.wait(self._refresh_s)

    def _poll_loop(self, group: str) -> None:
        req = transaction_pb2.PollTransactionChecksRequest(
            producer_group=self.producer_group,
            client_id=self.client_id,
            max_wait_ms=self._poll_ms,
        )
        refresh = False
        backoff = RETRY_BACKOFF_S
        while not self._closed.is_set():
            try:
                address = self._leader(group, refresh)
                resp = self._stub(address).PollTransactionChecks(
                    req, timeout=self._poll_ms / 1000 + self._request_s
                )
            except (grpc.RpcError, RaftMQError) as exc:
                err = from_rpc_error(exc) if isinstance(exc, grpc.RpcError) else exc
                if err.leader_hint:
                    with self._lock:
                        self._leaders[group] = err.leader_hint
                    refresh = False
                    self._closed.wait(HINT_PAUSE_S)
                    continue
                refresh = True
                self._closed.wait(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
                continue
            refresh = False
            backoff = RETRY_BACKOFF_S
            for check in resp.checks:
                self._answer(group, check)

    def _answer(self, group: str, pb: transaction_pb2.TransactionCheck) -> None:
        check = TransactionCheck(
            pb.transaction_id,
            pb.producer_group,
            ReceivedMessage.from_pb(pb.message),
            pb.check_times,
        )
        try:
            state = self._checker(check)
            if not isinstance(state, LocalTransactionState):
                state = LocalTransactionState.UNKNOWN
        except Exception:
            log.exception("producer.transaction_checker_failed txn=%s", pb.transaction_id)
            state = LocalTransactionState.UNKNOWN
        if state is LocalTransactionState.UNKNOWN:
            return  # nothing changes; the broker checks again after check_interval_ms
        try:
            self.end_transaction(group, pb.transaction_id, state, from_check=True)
        except RaftMQError as exc:
            log.warning("producer.check_answer_failed txn=%s error=%s", pb.transaction_id, exc)
