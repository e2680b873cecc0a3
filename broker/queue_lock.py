"""The broker's lock table for orderly consumption (RocketMQ's RebalanceLockManager): a queue is
held by one client of a consumer group under a lease that a lock request renews.

Deterministic functions of (table, request, now_ms): the broker applies lock and unlock requests
as committed log entries with the entry's store time, so a new leader knows who holds what and
an orderly consumer never meets a second owner after failover. No clock, no I/O, no threads.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from raftmq.common.types import QueueRef

DEFAULT_LOCK_LEASE_MS = 60_000  # RocketMQ rocketmq.broker.rebalance.lockMaxLiveTime


@dataclass(frozen=True, slots=True)
class Lease:
    client_id: str
    expires_ms: int  # last lock (or renewal) + lease

    def live(self, now_ms: int) -> bool:
        return now_ms < self.expires_ms


class LockKind(enum.Enum):
    LOCK = "lock"  # take free or expired queues, renew own ones (RocketMQ lockBatchMQ)
    UNLOCK = "unlock"  # let go of own queues (unlockBatchMQ); others' are left alone


@dataclass(frozen=True, slots=True)
class LockRequest:
    """One client's request for a batch of queues, as it travels through the log."""

    kind: LockKind
    group: str
    client_id: str
    queues: tuple[QueueRef, ...]


@dataclass(frozen=True, slots=True)
class LockResult:
    """Lock: `granted` are the queues the client now holds (new or renewed); `refused` are held
    by another live client. Unlock: `granted` are the queues released."""

    granted: frozenset[QueueRef]
    refused: frozenset[QueueRef] = frozenset()
    taken_over: frozenset[QueueRef] = frozenset()  # granted after another's lease expired


@dataclass
class LockTable:
    lease_ms: int = DEFAULT_LOCK_LEASE_MS
    _leases: dict[tuple[str, QueueRef], Lease] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.lease_ms <= 0:
            raise ValueError(f"lease_ms must be positive, got {self.lease_ms}")

    def restore(self, group: str, queue: QueueRef, lease: Lease) -> None:
        """Put back a lease kept elsewhere (the broker keeps leases in its store and builds a
        table of just the queues an entry names)."""
        self._leases[group, queue] = lease

    def lease(self, group: str, queue: QueueRef) -> Lease | None:
        """The lease on record, live or expired (None: never locked, unlocked or swept)."""
        return self._leases.get((group, queue))

    def holder(self, group: str, queue: QueueRef, now_ms: int) -> str | None:
        lease = self._leases.get((group, queue))
        return lease.client_id if lease is not None and lease.live(now_ms) else None

    def lock(
        self, group: str, client_id: str, queues: Iterable[QueueRef], now_ms: int
    ) -> LockResult:
        granted: set[QueueRef] = set()
        refused: set[QueueRef] = set()
        taken: set[QueueRef] = set()
        for queue in queues:
            key = (group, queue)
            lease = self._leases.get(key)
            if lease is not None and lease.live(now_ms) and lease.client_id != client_id:
                refused.add(queue)
                continue
            if lease is not None and lease.client_id != client_id:
                taken.add(queue)
            self._leases[key] = Lease(client_id, now_ms + self.lease_ms)
            granted.add(queue)
        return LockResult(frozenset(granted), frozenset(refused), frozenset(taken))

    def unlock(
        self, group: str, client_id: str, queues: Iterable[QueueRef], now_ms: int
    ) -> LockResult:
        released: set[QueueRef] = set()
        for queue in queues:
            key = (group, queue)
            lease = self._leases.get(key)
            if lease is not None and lease.client_id == client_id:
                del self._leases[key]
                released.add(queue)
        return LockResult(frozenset(released))

    def apply(self, request: LockRequest, now_ms: int) -> LockResult:
        """Apply a committed request at its entry's store time (every replica alike)."""
        if request.kind is LockKind.LOCK:
            return self.lock(request.group, request.client_id, request.queues, now_ms)
        return self.unlock(request.group, request.client_id, request.queues, now_ms)

    def expire(self, now_ms: int, limit: int = 1_000) -> list[tuple[str, QueueRef]]:
        """Drop at most `limit` expired leases (memory stays bounded by the live ones); an
        expired lease is already free for `lock`, so this only reclaims space."""
        gone: list[tuple[str, QueueRef]] = []
        for key, lease in self._leases.items():
            if len(gone) >= limit:
                break
            if not lease.live(now_ms):
                gone.append(key)
        for key in gone:
            del self._leases[key]
        return gone

    def held_by(self, group: str, client_id: str, now_ms: int) -> frozenset[QueueRef]:
        return frozenset(
            q
            for (g, q), lease in self._leases.items()
            if g == group and lease.client_id == client_id and lease.live(now_ms)
        )

    def __len__(self) -> int:
        return len(self._leases)
