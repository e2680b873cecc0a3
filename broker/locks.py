"""Orderly consumption's queue locks on the broker (RocketMQ's lockBatchMQ / unlockBatchMQ),
wired through the Raft log: a request becomes a QueueLockChange entry stamped by the leader with
its time and the lease, and every replica applies it with `LockTable` (broker/queue_lock.py)
over the leases kept in its store. A new leader therefore knows who holds which queue and never
grants one to a second owner while the first one's lease lives (RocketMQ keeps its lock table in
the leader's memory and loses it on failover).

`apply_lock_change` is the pure half the dispatcher calls; `LockProcessor` the leader's shell.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from raftmq.broker.queue_lock import (
    DEFAULT_LOCK_LEASE_MS,
    Lease,
    LockKind,
    LockRequest,
    LockResult,
    LockTable,
)
from raftmq.broker.rows import Applied, LockRow, Rejected
from raftmq.common import record_batch
from raftmq.common.errors import InternalError, InvalidArgumentError
from raftmq.common.message import validate_group, validate_topic
from raftmq.common.record_batch import QueueLockChange, QueueLockOp
from raftmq.common.types import MAX_QUEUE_ID, QueueRef

if TYPE_CHECKING:
    from raftmq.broker.node import BrokerNode

MAX_QUEUES_PER_LOCK = 1024  # one request's queues; a topic rarely has more than a few dozen
MAX_CLIENT_ID_CHARS = 255
LeaseLookup = Callable[[str, str, int], Lease | None]


def apply_lock_change(
    rec: QueueLockChange, lease_of: LeaseLookup
) -> tuple[LockResult, tuple[LockRow, ...]]:
    """The outcome of one committed lock change and the leases it changed, from the leases
    before it: a LockTable over just the queues named, applied at the entry's time (every
    replica alike; never raises for the request's content)."""
    table = LockTable(lease_ms=max(1, rec.lease_ms))
    queues: list[QueueRef] = []
    for qid in dict.fromkeys(rec.queue_ids):
        if not 0 <= qid <= MAX_QUEUE_ID:
            continue  # checked by the leader; a replica skips what it cannot name
        q = QueueRef(rec.topic, "", qid)
        queues.append(q)
        lease = lease_of(rec.group, rec.topic, qid)
        if lease is not None:
            table.restore(rec.group, q, lease)
    kind = LockKind.LOCK if rec.op is QueueLockOp.LOCK else LockKind.UNLOCK
    result = table.apply(
        LockRequest(kind, rec.group, rec.client_id, tuple(queues)), rec.timestamp_ms
    )
    rows = tuple(
        LockRow(rec.group, rec.topic, q.queue_id, table.lease(rec.group, q))
        for q in queues
        if q in result.granted
    )
    return result, rows


class LockProcessor:
    """The leader's side: check a request, stamp it, replicate it, answer from the apply."""

    def __init__(self, node: BrokerNode, lease_ms: int = DEFAULT_LOCK_LEASE_MS) -> None:
        self._node = node
        self.lease_ms = lease_ms

    def lock(self, group: str, client_id: str, topic: str, queue_ids: Sequence[int]) -> LockResult:
        """Take (or renew) the queues that are free, expired or this client's already."""
        return self._change(QueueLockOp.LOCK, group, client_id, topic, queue_ids)

    def unlock(
        self, group: str, client_id: str, topic: str, queue_ids: Sequence[int]
    ) -> LockResult:
        """Let go of this client's queues (others' are left alone)."""
        return self._change(QueueLockOp.UNLOCK, group, client_id, topic, queue_ids)

    def holders(self, group: str, topic: str, queue_ids: Sequence[int]) -> dict[int, str]:
        """Who holds each queue now (this node's view; followers lag by their apply)."""
        now = int(time.time() * 1000)
        out: dict[int, str] = {}
        for qid in queue_ids:
            lease = self._node.store.queue_lease(group, topic, qid)
            if lease is not None and lease.live(now):
                out[qid] = lease.client_id
        return out

    def _change(
        self,
        op: QueueLockOp,
        group: str,
        client_id: str,
        topic: str,
        queue_ids: Sequence[int],
    ) -> LockResult:
        validate_group(group)
        validate_topic(topic, allow_system=True)
        if not client_id or len(client_id) > MAX_CLIENT_ID_CHARS:
            raise InvalidArgumentError(
                f"client_id must be 1..{MAX_CLIENT_ID_CHARS} characters, got {len(client_id)}",
                details={"argument": "client_id"},
            )
        if not queue_ids or len(queue_ids) > MAX_QUEUES_PER_LOCK:
            raise InvalidArgumentError(
                f"a lock request names 1..{MAX_QUEUES_PER_LOCK} queues, got {len(queue_ids)}",
                details={"argument": "queue_ids"},
            )
        for qid in queue_ids:
            if not 0 <= qid <= MAX_QUEUE_ID:
                raise InvalidArgumentError(
                    f"queue id {qid} is outside 0..{MAX_QUEUE_ID}; take queue ids from the "
                    "topic's route",
                    details={"argument": "queue_ids"},
                )
        self._node.require_leader()
        rec = QueueLockChange(
            op,
            group,
            client_id,
            topic,
            tuple(sorted(set(queue_ids))),
            int(time.time() * 1000),  # the entry's time: every replica applies with it
            self.lease_ms,
        )
        outcome = self._node.replicate(
            [record_batch.encode(rec)], self._node.settings.send_timeout_ms / 1000
        )[0]
        if isinstance(outcome, Rejected):
            raise InvalidArgumentError(f"queue lock refused: {outcome.reason}")
        if not isinstance(outcome, Applied) or outcome.locks is None:
            raise InternalError(f"queue lock answered with {outcome!r}")
        return outcome.locks
