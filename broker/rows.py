"""The rows the dispatcher derives from committed entries and the store keeps, as values.

ConsumeQueue rows, key and time index rows, queue heads, consumer offsets, the idempotent
producer table and per-chunk outcomes. Values only: no I/O, no decisions. The ones made per
committed entry (or per row read) take common/frozen_init.py's cheaper __init__.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftmq.broker.pop_apply import PopAckResult, PopReceiveResult
from raftmq.broker.queue_lock import Lease, LockResult
from raftmq.common.frozen_init import frozen_init
from raftmq.common.record_batch import Kind
from raftmq.common.topic_config import TopicConfig

NO_TIME_MS = -1  # a queue head whose time index is still empty
# BatchOrigin.first_offset of a delayed batch: its messages have no queue offsets when stored.
SCHEDULED_OFFSET = (1 << 64) - 1


@frozen_init
@dataclass(frozen=True, slots=True)
class CQRow:
    """One ConsumeQueue row: where message `queue_offset` of (topic, queue_id) lives."""

    topic: str
    queue_id: int
    queue_offset: int
    raft_index: int
    slot: int
    position: int
    chunk_offset_bytes: int  # where the message's record starts in its chunk: read it alone
    body_bytes: int
    tag_hash: int
    store_timestamp_ms: int


@frozen_init
@dataclass(frozen=True, slots=True)
class CQBatch:
    """The ConsumeQueue rows of one appended batch, by column: row i has offset first_offset + i
    and position i. One value per batch rather than per message keeps dispatch cheap."""

    topic: str
    queue_id: int
    first_offset: int
    raft_index: int
    slot: int
    store_timestamp_ms: int
    chunk_offsets: tuple[int, ...]
    body_sizes: tuple[int, ...]
    tag_hashes: tuple[int, ...]
    keys: tuple[tuple[str, ...], ...] = ()  # per message, for the key index; () if none has keys

    @property
    def count(self) -> int:
        return len(self.body_sizes)

    @property
    def next_offset(self) -> int:
        return self.first_offset + len(self.body_sizes)

    def rows(self) -> tuple[CQRow, ...]:
        return tuple(
            CQRow(
                self.topic,
                self.queue_id,
                self.first_offset + i,
                self.raft_index,
                self.slot,
                i,
                at,
                size,
                tag,
                self.store_timestamp_ms,
            )
            for i, (at, size, tag) in enumerate(
                zip(self.chunk_offsets, self.body_sizes, self.tag_hashes, strict=True)
            )
        )

    def key_rows(self) -> tuple[KeyRow, ...]:
        return tuple(
            KeyRow(self.topic, key, self.queue_id, self.first_offset + i, self.store_timestamp_ms)
            for i, keys in enumerate(self.keys)
            for key in keys
        )


@dataclass(frozen=True, slots=True)
class KeyRow:
    topic: str
    key: str
    queue_id: int
    queue_offset: int
    store_timestamp_ms: int  # lets a key query be narrowed to a time range


@frozen_init
@dataclass(frozen=True, slots=True)
class TimeRow:
    """From `store_timestamp_ms` on, the queue's messages start at `queue_offset`. Timestamps
    are made monotonic per queue (a leader's clock may be behind its predecessor's)."""

    topic: str
    queue_id: int
    store_timestamp_ms: int
    queue_offset: int


@frozen_init
@dataclass(frozen=True, slots=True)
class QueueHead:
    """A queue's dispatch state: the next offset to assign and the newest time index stamp."""

    topic: str
    queue_id: int
    next_offset: int
    time_index_ms: int = NO_TIME_MS


@dataclass(frozen=True, slots=True)
class OffsetRow:
    """A consumer group's offset for one queue. Commits may move it anywhere (RocketMQ);
    `reset` marks an administrative reset so the broker can tell the group's consumers."""

    group: str
    topic: str
    queue_id: int
    offset: int
    reset: bool = False


@frozen_init
@dataclass(frozen=True, slots=True)
class BatchOrigin:
    """Where an idempotent producer's batch landed, remembered to answer a retried send."""

    first_sequence: int
    count: int
    first_offset: int
    raft_index: int
    slot: int


@frozen_init
@dataclass(frozen=True, slots=True)
class ProducerState:
    last_sequence: int
    last_store_timestamp_ms: int  # lets a future expiry drop idle producers deterministically
    recent: tuple[BatchOrigin, ...]  # newest last, bounded


@frozen_init
@dataclass(frozen=True, slots=True)
class ProducerRow:
    producer_id: str
    topic: str
    queue_id: int
    state: ProducerState


@dataclass(frozen=True, slots=True)
class TopicRow:
    name: str
    config: TopicConfig | None  # None: deleted


# ---- per-chunk outcomes: what the broker answers the request that submitted the chunk ------------


@frozen_init
@dataclass(frozen=True, slots=True)
class StoredRange:
    """`count` messages at queue offsets first_offset.., in entry raft_index, chunk slot, at
    positions first_position.. (so their message ids are known)."""

    first_offset: int
    count: int
    raft_index: int
    slot: int
    first_position: int = 0


@dataclass(frozen=True, slots=True)
class SequenceGap:
    expected: int
    received: int


@frozen_init
@dataclass(frozen=True, slots=True)
class Appended:
    slot: int
    topic: str
    queue_id: int
    stored: StoredRange
    sequence_gap: SequenceGap | None = None  # accepted anyway; reported for the producer


@dataclass(frozen=True, slots=True)
class Duplicate:
    """An idempotent retry of messages already stored: not dispatched again. `stored` is where
    the originals are, or None when they are older than the remembered batches."""

    slot: int
    topic: str
    queue_id: int
    stored: StoredRange | None


@dataclass(frozen=True, slots=True)
class Scheduled:
    """A delayed batch: stored at (raft_index, slot), its messages in the schedule, not in a
    queue yet (they get queue offsets when they fall due: broker/delivery.py)."""

    slot: int
    topic: str
    queue_id: int
    raft_index: int
    count: int


@dataclass(frozen=True, slots=True)
class Rejected:
    """A chunk skipped on every replica alike (undecodable, invalid names, sequence overlap)."""

    slot: int
    reason: str


@dataclass(frozen=True, slots=True)
class LockRow:
    """An orderly consumer queue's lease after an entry: held until `lease.expires_ms`, or
    free (None: unlocked)."""

    group: str
    topic: str
    queue_id: int
    lease: Lease | None


@dataclass(frozen=True, slots=True)
class OutOfOrder(Rejected):
    """A strict idempotent batch (ProducerSequence.strict) that skips past the next expected
    sequence of its queue: an earlier batch is still in flight. Skipped like any Rejected; the
    producer retries it after the earlier one."""

    expected: int = 0


@dataclass(frozen=True, slots=True)
class Applied:
    """A non-produce record took effect (or was a no-op, said in `detail`)."""

    slot: int
    kind: Kind
    detail: str = ""
    locks: LockResult | None = None  # a queue lock record: what it granted and refused
    pop: PopReceiveResult | PopAckResult | None = None  # a POP record: what it handed out, acked


ChunkOutcome = Appended | Duplicate | Rejected | Applied | Scheduled
