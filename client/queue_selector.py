"""Producer queue selection: round robin avoiding recently failed broker groups (RocketMQ's
LatencyFaultTolerance) and ordered sends by sharding key. Pure: time comes in as `now_ms`, the
round-robin position as `counter`, the fault table is an immutable value; never does I/O.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from raftmq.common.types import QueueRef

# RocketMQ 5's MQFaultStrategy defaults: a send slower than latency_steps_ms[i] keeps its broker
# group out of rotation for avoid_ms[i]; a failure counts as ISOLATION_LATENCY_MS.
DEFAULT_LATENCY_STEPS_MS = (50, 100, 550, 1800, 3000, 5000, 15000)
DEFAULT_AVOID_MS = (0, 0, 2000, 5000, 6000, 10000, 30000)
DEFAULT_FAILURE_LATENCY_MS = 10000
DEFAULT_MAX_BROKERS = 1024


@dataclass(frozen=True, slots=True)
class PublishQueues:
    """A topic's writable queues, deduplicated and sorted once per route refresh.

    Sorting makes selection the same in every producer process (which matters for sharding keys).
    Never empty: a topic with no writable queue cannot be sent to, and the caller says so.
    """

    topic: str
    queues: tuple[QueueRef, ...]

    def __post_init__(self) -> None:
        if not self.queues:
            raise ValueError(f"topic {self.topic!r} has no writable queue")
        if any(q.topic != self.topic for q in self.queues):
            raise ValueError(f"every queue must belong to topic {self.topic!r}")
        if any(a >= b for a, b in zip(self.queues, self.queues[1:], strict=False)):
            raise ValueError("queues must be sorted and distinct; build with PublishQueues.of")

    @classmethod
    def of(cls, topic: str, queues: Iterable[QueueRef]) -> PublishQueues:
        return cls(topic, tuple(sorted(set(queues))))


@dataclass(frozen=True, slots=True)
class FaultPolicy:
    """How long a broker group stays avoided after a slow or failed send; every value in ms."""

    latency_steps_ms: tuple[int, ...] = DEFAULT_LATENCY_STEPS_MS
    avoid_ms: tuple[int, ...] = DEFAULT_AVOID_MS
    failure_latency_ms: int = DEFAULT_FAILURE_LATENCY_MS
    max_brokers: int = DEFAULT_MAX_BROKERS  # bound on the table; the stalest entries go first

    def __post_init__(self) -> None:
        if len(self.latency_steps_ms) != len(self.avoid_ms) or not self.latency_steps_ms:
            raise ValueError("latency_steps_ms and avoid_ms must be non-empty and of equal length")
        if list(self.latency_steps_ms) != sorted(self.latency_steps_ms):
            raise ValueError("latency_steps_ms must be ascending")
        if any(a < 0 for a in self.avoid_ms) or self.failure_latency_ms < 0:
            raise ValueError("durations must not be negative")
        if self.max_brokers < 1:
            raise ValueError("max_brokers must be at least 1")

    def avoid_for_ms(self, latency_ms: int) -> int:
        """The avoidance of the highest step that `latency_ms` reaches (0 below the first)."""
        i = bisect.bisect_right(self.latency_steps_ms, latency_ms)
        return 0 if i == 0 else self.avoid_ms[i - 1]


@dataclass(frozen=True, slots=True)
class FaultItem:
    broker_group: str
    latency_ms: int
    avoid_until_ms: int


@dataclass(frozen=True, slots=True)
class FaultTable:
    """Broker groups to avoid, and until when. Updates return a new table (copy-on-write, at most
    `policy.max_brokers` items), so a producer can swap it in atomically and share it freely."""

    policy: FaultPolicy = field(default_factory=FaultPolicy)
    items: tuple[FaultItem, ...] = ()

    def item(self, broker_group: str) -> FaultItem | None:
        for it in self.items:
            if it.broker_group == broker_group:
                return it
        return None

    def is_available(self, broker_group: str, now_ms: int) -> bool:
        it = self.item(broker_group)
        return it is None or now_ms >= it.avoid_until_ms

    def record(
        self, broker_group: str, latency_ms: int, now_ms: int, *, failed: bool = False
    ) -> FaultTable:
        """The table after a send to `broker_group` took `latency_ms` (or failed). A fast send
        clears the entry: the broker was retried after its avoidance and works again."""
        latency = max(latency_ms, self.policy.failure_latency_ms) if failed else latency_ms
        avoid_ms = self.policy.avoid_for_ms(latency)
        others = tuple(it for it in self.items if it.broker_group != broker_group)
        if avoid_ms == 0:
            return self if len(others) == len(self.items) else FaultTable(self.policy, others)
        if len(others) >= self.policy.max_brokers:
            # Full: drop expired items, then those whose avoidance ends first (least relevant).
            live = sorted(
                (it for it in others if it.avoid_until_ms > now_ms),
                key=lambda it: (it.avoid_until_ms, it.broker_group),
            )
            keep = self.policy.max_brokers - 1
            others = tuple(live[max(0, len(live) - keep) :])
        new = FaultItem(broker_group, latency, now_ms + avoid_ms)
        return FaultTable(self.policy, (*others, new))

    def prune(self, now_ms: int) -> FaultTable:
        """The table without the items whose avoidance is over."""
        live = tuple(it for it in self.items if it.avoid_until_ms > now_ms)
        return self if len(live) == len(self.items) else FaultTable(self.policy, live)


def select_queue(
    queues: PublishQueues,
    counter: int,
    faults: FaultTable,
    now_ms: int,
    *,
    avoid_broker: str | None = None,
) -> QueueRef:
    """The queue for the `counter`-th send: round robin over the queues of available broker
    groups, never `avoid_broker` (the one a retry just failed on) unless it is the only one.

    When every group is avoided, RocketMQ's pickOneAtLeast: the groups whose avoidance ends
    first. The caller passes an ever-increasing counter (one per send attempt)."""
    candidates = [
        q
        for q in queues.queues
        if q.broker_group != avoid_broker and faults.is_available(q.broker_group, now_ms)
    ]
    if not candidates:
        others = [q for q in queues.queues if q.broker_group != avoid_broker] or list(queues.queues)

        def until(q: QueueRef) -> int:
            it = faults.item(q.broker_group)
            return now_ms if it is None else it.avoid_until_ms

        soonest = min(until(q) for q in others)
        candidates = [q for q in others if until(q) == soonest]
    return candidates[counter % len(candidates)]


def shard_index(sharding_key: str, queue_count: int) -> int:
    """A stable index in 0..queue_count-1 for a key (BLAKE2b, not the per-process `hash()`)."""
    if queue_count < 1:
        raise ValueError(f"queue_count must be at least 1, got {queue_count}")
    digest = hashlib.blake2b(sharding_key.encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "big") % queue_count


def select_by_key(queues: PublishQueues, sharding_key: str) -> QueueRef:
    """The queue for an ordered send: the same key hits the same queue as long as the topic's
    queue set is unchanged. Failed brokers are not skipped: that would break the key's order."""
    return queues.queues[shard_index(sharding_key, len(queues.queues))]
