"""Transactions of the RocketMQ 5 API on raftmq's transactions (client/producer/transaction.py).

A v2 client has no producer group; as RocketMQ 5's proxy does, the topic stands for it: the proxy
keeps one TransactionProducer per topic with transactional sends (producer group = the topic).
Its half sends store what the v2 client sends; its check poll, held on every broker group's leader,
makes the proxy the member of the producer group the broker checks back; each check goes to a
client connected through Telemetry that publishes the topic (RecoverOrphanedTransactionCommand),
and that client's checker answers with EndTransaction (source SERVER_CHECK).

A topic's producer is opened by a transactional send (or end) and closed once no client
connected to this proxy publishes the topic and none used it for the client expiry time: the
proxy holds the check poll only for producer groups it can reach a client of.

The v2 transaction id names the broker group that holds the half message, so an EndTransaction
needs no state here (and works on any proxy, after a restart too): `<broker group>:<raftmq id>`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping

from raftmq.client.producer.transaction import (
    LocalTransactionState,
    TransactionCheck,
    TransactionProducer,
    TransactionSendResult,
)
from raftmq.common.auth import Credentials
from raftmq.common.errors import InvalidNameError
from raftmq.common.message import validate_group
from raftmq.common.pb.apache.rocketmq.v2 import definition_pb2 as v2
from raftmq.common.types import QueueRef
from raftmq.proxy.codes import ApiError
from raftmq.proxy.convert import Outgoing

log = logging.getLogger("proxy")

# Called on a transaction producer's check thread: (topic, check); must not block.
CheckSink = Callable[[str, TransactionCheck], None]


def transaction_id(broker_group: str, raftmq_id: str) -> str:
    return f"{broker_group}:{raftmq_id}"


def parse_transaction_id(text: str) -> tuple[str, str]:
    """(broker group, raftmq transaction id); ApiError INVALID_TRANSACTION_ID if malformed."""
    group, sep, txn = text.rpartition(":")
    if not sep or not group or not txn:
        raise ApiError(
            v2.INVALID_TRANSACTION_ID,
            f"transaction id {text[:120]!r} was not issued by this proxy; use the one the send "
            "of the half message returned",
        )
    return group, txn


def idle(
    last_used: Mapping[str, float], connected: Collection[str], now_s: float, grace_s: float
) -> list[str]:
    """Topics whose transaction producer may close: no client connected to this proxy publishes
    them and no transactional call used them for `grace_s`. Pure."""
    return [t for t, used in last_used.items() if t not in connected and now_s - used >= grace_s]


def resolution(r: int) -> LocalTransactionState:
    if r == v2.COMMIT:
        return LocalTransactionState.COMMIT
    if r == v2.ROLLBACK:
        return LocalTransactionState.ROLLBACK
    raise ApiError(v2.BAD_REQUEST, "the transaction resolution must be COMMIT or ROLLBACK")


class ProxyTransactions:
    """The transaction producers of this proxy, least recently used first (at most
    `max_topics`; the oldest is closed past it: its unended halves are checked via the others'
    members, or again once a send reopens it). Thread-safe: half sends run on worker threads."""

    def __init__(
        self,
        namesrv_addresses: str,
        client_id: str,
        max_topics: int,
        credentials: Credentials | None = None,
    ) -> None:
        self._credentials = credentials
        self._namesrv = namesrv_addresses
        self._client_id = client_id
        self._max = max_topics
        self._lock = threading.Lock()
        self._producers: OrderedDict[str, TransactionProducer] = OrderedDict()
        self._last_used: dict[str, float] = {}  # monotonic seconds
        self.on_check: CheckSink | None = None

    def producer(self, topic: str) -> TransactionProducer:
        """The topic's producer (made on first use; a blocking call: it starts threads)."""
        try:
            validate_group(topic)
        except InvalidNameError as exc:
            raise ApiError(
                v2.ILLEGAL_TOPIC,
                f"topic {topic!r} cannot take transactional messages here (its name is the "
                f"producer group): {exc.message}",
            ) from None
        closing: list[TransactionProducer] = []
        with self._lock:
            self._last_used[topic] = time.monotonic()
            p = self._producers.get(topic)
            if p is not None:
                self._producers.move_to_end(topic)
                return p
            p = TransactionProducer(
                self._namesrv,
                topic,
                lambda check: self._check(topic, check),
                client_id=f"{self._client_id}-{topic}",
                credentials=self._credentials,
            )
            self._producers[topic] = p
            while len(self._producers) > self._max:
                old_topic, old = self._producers.popitem(last=False)
                self._last_used.pop(old_topic, None)
                closing.append(old)
        for old in closing:
            old.close()
        return p

    def _check(self, topic: str, check: TransactionCheck) -> LocalTransactionState:
        """The broker asks: pass it on to a client; the client's answer comes as an
        EndTransaction, so the producer itself reports nothing (UNKNOWN)."""
        sink = self.on_check
        if sink is not None:
            try:
                sink(topic, check)
            except Exception:
                log.exception("proxy.check_forward_failed txn=%s", check.transaction_id)
        return LocalTransactionState.UNKNOWN

    def send_half(self, out: Outgoing, queue: QueueRef | None) -> TransactionSendResult:
        """Store a half message (blocking): the v2 client ends it with EndTransaction."""
        p = self.producer(out.topic)
        return p.send_in_transaction(
            out.topic,
            out.body,
            lambda _half: LocalTransactionState.UNKNOWN,
            tags=out.tag,
            keys=out.keys,
            properties=out.properties,
            queue=queue,
        )

    def end(
        self, topic: str, v2_transaction_id: str, state: LocalTransactionState, *, from_check: bool
    ) -> str:
        broker_group, txn = parse_transaction_id(v2_transaction_id)
        return self.producer(topic).end_transaction(broker_group, txn, state, from_check=from_check)

    def idle_topics(self, connected: Collection[str], grace_s: float) -> list[str]:
        with self._lock:
            return idle(self._last_used, connected, time.monotonic(), grace_s)

    def close_topics(self, topics: Collection[str]) -> None:
        """Stop answering check-backs of `topics` (blocking: the pollers end). The broker asks
        the producer group's other members, or asks again later."""
        with self._lock:
            closing = [p for t in topics if (p := self._producers.pop(t, None)) is not None]
            for t in topics:
                self._last_used.pop(t, None)
        for p in closing:
            p.close()
        if closing:
            log.info("proxy.transaction_producers_closed topics=%s", ",".join(sorted(topics)))

    def close(self) -> None:
        with self._lock:
            producers = list(self._producers.values())
            self._producers.clear()
            self._last_used.clear()
        for p in producers:
            p.close()
