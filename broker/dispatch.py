"""The dispatcher (RocketMQ's ReputMessageService) as a pure state machine: committed entry in,
rows out. It never reads a clock, a random source or anything but its arguments and never writes:
the same entries in the same order give equal outputs on every replica."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from raftmq.broker import delivery
from raftmq.broker.errors import DispatchGapError, OffsetDisagreementError
from raftmq.broker.locks import apply_lock_change
from raftmq.broker.pop_apply import (
    PopAckResult,
    PopReceiveResult,
    PopRow,
    apply_ack,
    apply_receive,
    reset_state,
)
from raftmq.broker.queue_lock import Lease
from raftmq.broker.retention import RetentionRecord, is_retention_chunk
from raftmq.broker.retention import decode_record as decode_retention
from raftmq.broker.rows import (
    NO_TIME_MS,
    SCHEDULED_OFFSET,
    Appended,
    Applied,
    BatchOrigin,
    ChunkOutcome,
    CQBatch,
    CQRow,
    Duplicate,
    KeyRow,
    LockRow,
    OffsetRow,
    OutOfOrder,
    ProducerRow,
    ProducerState,
    QueueHead,
    Rejected,
    Scheduled,
    SequenceGap,
    StoredRange,
    TimeRow,
    TopicRow,
)
from raftmq.broker.schedule import MessageRef, ScheduleEntry, ScheduleKey
from raftmq.broker.txn_apply import TxnApplier, TxnRow
from raftmq.broker.txn_records import is_txn_chunk
from raftmq.common import stored_batch
from raftmq.common.errors import InvalidArgumentError
from raftmq.common.filter.tag import tag_hash
from raftmq.common.frozen_init import frozen_init
from raftmq.common.group_config import GroupConfig, validate_group_config
from raftmq.common.message import (
    ValidNames,
    validate_group,
    validate_producer_id,
    validate_system_topic,
    validate_topic,
)
from raftmq.common.record_batch import (
    CommitOffset,
    Deliver,
    GroupConfigChange,
    GroupDelete,
    Kind,
    MalformedBatchError,
    PopAck,
    PopReceive,
    ProduceBatch,
    ProducerSequence,
    PurgeQueues,
    QueueLockChange,
    ResetOffsets,
    TopicConfigChange,
    TopicOp,
    decode,
    decode_with_offsets,
    is_produce_v1,
    scan_produce,
)
from raftmq.common.topic_config import TopicConfig, validate_topic_config
from raftmq.raftlog.record import Entry

MAX_SEQUENCE = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Refused:
    """A produce batch the producer window refuses, with the outcome to answer."""

    outcome: ChunkOutcome


class DispatchState(Protocol):
    """What the dispatcher reads: the store, or the store plus outputs not yet written."""

    @property
    def dispatched_index(self) -> int: ...

    def queue_head(self, topic: str, queue_id: int) -> QueueHead | None: ...

    def producer_state(
        self, producer_id: str, topic: str, queue_id: int
    ) -> ProducerState | None: ...

    def topic(self, name: str) -> TopicConfig | None: ...

    def schedule_ref(self, key: ScheduleKey) -> MessageRef | None: ...
    def queue_lease(self, group: str, topic: str, queue_id: int) -> Lease | None: ...
    def pop_state(self, group: str, topic: str, queue_id: int) -> bytes | None: ...


@frozen_init
@dataclass(frozen=True, slots=True)
class DispatchOutput:
    """Everything one committed entry changes. ConsumeQueue and key-index rows come per batch,
    by column (CQBatch); cq_rows()/key_rows() expand them. Entries without chunks (Raft's own)
    change nothing but the dispatched index."""

    raft_index: int
    term: int
    outcomes: tuple[ChunkOutcome, ...] = ()  # one per chunk, in slot order
    cq_batches: tuple[CQBatch, ...] = ()
    time_rows: tuple[TimeRow, ...] = ()
    queue_heads: tuple[QueueHead, ...] = ()  # final head of each queue the entry appended to
    offset_rows: tuple[OffsetRow, ...] = ()
    # Consumer groups deleted (GroupDelete): their offsets, leases and POP state go, after this
    # entry's offset rows (a delete is its own entry: the service proposes it alone).
    deleted_groups: tuple[str, ...] = ()
    # Consumer groups' configs set (GroupConfigChange), written after the deletions: a delete
    # takes a group's config too, a config set later in the log brings it back.
    group_configs: tuple[GroupConfig, ...] = ()
    # (topic, queue id, offset): the queue's min offset moves up to it (PurgeQueues), after
    # this entry's queue heads, never past the queue's end.
    purges: tuple[tuple[str, int, int], ...] = ()
    producer_rows: tuple[ProducerRow, ...] = ()  # final state of each producer key touched
    topic_rows: tuple[TopicRow, ...] = ()
    txn_rows: tuple[TxnRow, ...] = ()  # transactions touched (broker/txn_apply.py)
    # Delayed delivery (broker/delivery.py): rows of delivered messages, one per message (their
    # positions are not a batch's 0..n-1), and the schedule's changes.
    loose_rows: tuple[CQRow, ...] = ()
    loose_key_rows: tuple[KeyRow, ...] = ()  # their keys, under the real topic
    schedule_puts: tuple[ScheduleEntry, ...] = ()
    schedule_deletes: tuple[ScheduleKey, ...] = ()
    retention: RetentionRecord | None = None  # the store applies the cut and keeps a base
    lock_rows: tuple[LockRow, ...] = ()  # final lease of each orderly queue touched
    pop_rows: tuple[PopRow, ...] = ()  # final POP state of each (group, queue) touched

    @property
    def errors(self) -> tuple[Rejected, ...]:
        return tuple(o for o in self.outcomes if isinstance(o, Rejected))

    def cq_rows(self) -> tuple[CQRow, ...]:
        return tuple(row for batch in self.cq_batches for row in batch.rows()) + self.loose_rows

    def key_rows(self) -> tuple[KeyRow, ...]:
        batched = tuple(row for batch in self.cq_batches for row in batch.key_rows())
        return batched + self.loose_key_rows if self.loose_key_rows else batched


class PendingState:
    """A DispatchState over a base state plus outputs absorbed since: lets the dispatcher run
    ahead of the store, e.g. over several entries written in one transaction."""

    def __init__(self, base: DispatchState) -> None:
        self._base = base
        self._index = base.dispatched_index
        self._heads: dict[tuple[str, int], QueueHead] = {}
        self._producers: dict[tuple[str, str, int], ProducerState] = {}
        self._topics: dict[str, TopicConfig | None] = {}
        self._schedule: dict[ScheduleKey, MessageRef | None] = {}  # None: deleted
        self._leases: dict[tuple[str, str, int], Lease | None] = {}
        self._pops: dict[tuple[str, str, int], bytes] = {}

    @property
    def dispatched_index(self) -> int:
        return self._index

    def pop_state(self, group: str, topic: str, queue_id: int) -> bytes | None:
        row = self._pops.get((group, topic, queue_id))
        return row if row is not None else self._base.pop_state(group, topic, queue_id)

    def schedule_ref(self, key: ScheduleKey) -> MessageRef | None:
        if key in self._schedule:
            return self._schedule[key]
        return self._base.schedule_ref(key)

    def queue_head(self, topic: str, queue_id: int) -> QueueHead | None:
        head = self._heads.get((topic, queue_id))
        return head if head is not None else self._base.queue_head(topic, queue_id)

    def producer_state(self, producer_id: str, topic: str, queue_id: int) -> ProducerState | None:
        state = self._producers.get((producer_id, topic, queue_id))
        return (
            state if state is not None else self._base.producer_state(producer_id, topic, queue_id)
        )

    def topic(self, name: str) -> TopicConfig | None:
        if name in self._topics:
            return self._topics[name]
        return self._base.topic(name)

    def queue_lease(self, group: str, topic: str, queue_id: int) -> Lease | None:
        key = (group, topic, queue_id)
        if key in self._leases:
            return self._leases[key]
        return self._base.queue_lease(group, topic, queue_id)

    def absorb(self, out: DispatchOutput) -> None:
        if out.raft_index != self._index + 1:
            raise DispatchGapError(self._index + 1, out.raft_index)
        self._index = out.raft_index
        for head in out.queue_heads:
            self._heads[head.topic, head.queue_id] = head
        for p in out.producer_rows:
            self._producers[p.producer_id, p.topic, p.queue_id] = p.state
        for t in out.topic_rows:
            self._topics[t.name] = t.config
        for e in out.schedule_puts:
            self._schedule[e.key] = e.ref
        for key in out.schedule_deletes:
            self._schedule[key] = None
        for lock in out.lock_rows:
            self._leases[lock.group, lock.topic, lock.queue_id] = lock.lease
        for pop in out.pop_rows:
            self._pops[pop.group, pop.topic, pop.queue_id] = pop.value


class _EntryWork:
    """Rows of the entry being dispatched, and the state as of the chunk being looked at."""

    def __init__(self, state: DispatchState) -> None:
        self.state = state
        self.outcomes: list[ChunkOutcome] = []
        self.cq_batches: list[CQBatch] = []
        self.time_rows: list[TimeRow] = []
        self.heads: dict[tuple[str, int], QueueHead] = {}
        self.offset_rows: list[OffsetRow] = []
        self.deleted_groups: list[str] = []
        self.group_configs: list[GroupConfig] = []
        self.purges: list[tuple[str, int, int]] = []
        self.producers: dict[tuple[str, str, int], ProducerRow] = {}
        self.topics: dict[str, TopicRow] = {}
        self.txn_rows: dict[str, TxnRow] = {}
        self.loose_rows: list[CQRow] = []
        self.loose_key_rows: list[KeyRow] = []
        self.schedule: dict[ScheduleKey, MessageRef | None] = {}  # None: deleted
        self.retention: RetentionRecord | None = None
        self.locks: dict[tuple[str, str, int], LockRow] = {}
        self.pops: dict[tuple[str, str, int], PopRow] = {}

    def output(self, raft_index: int, term: int) -> DispatchOutput:
        """The entry's DispatchOutput. A produce-only entry (the common one) fills four fields:
        the others keep their defaults rather than be built from empty collections."""
        if (
            self.offset_rows
            or self.deleted_groups
            or self.group_configs
            or self.purges
            or self.topics
            or self.txn_rows
            or self.loose_rows
            or self.loose_key_rows
            or self.schedule
            or self.retention is not None
            or self.locks
            or self.pops
        ):
            return DispatchOutput(
                raft_index=raft_index,
                term=term,
                outcomes=tuple(self.outcomes),
                cq_batches=tuple(self.cq_batches),
                time_rows=tuple(self.time_rows),
                queue_heads=tuple(self.heads.values()),
                offset_rows=tuple(self.offset_rows),
                deleted_groups=tuple(self.deleted_groups),
                group_configs=tuple(self.group_configs),
                purges=tuple(self.purges),
                producer_rows=tuple(self.producers.values()),
                topic_rows=tuple(self.topics.values()),
                txn_rows=tuple(self.txn_rows.values()),
                loose_rows=tuple(self.loose_rows),
                loose_key_rows=tuple(self.loose_key_rows),
                schedule_puts=tuple(ScheduleEntry(k, r) for k, r in self.schedule.items() if r),
                schedule_deletes=tuple(k for k, r in self.schedule.items() if r is None),
                retention=self.retention,
                lock_rows=tuple(self.locks.values()),
                pop_rows=tuple(self.pops.values()),
            )
        return DispatchOutput(
            raft_index,
            term,
            tuple(self.outcomes),
            tuple(self.cq_batches),
            tuple(self.time_rows),
            tuple(self.heads.values()),
            producer_rows=tuple(self.producers.values()),
        )

    def pop_state(self, group: str, topic: str, queue_id: int) -> bytes | None:
        row = self.pops.get((group, topic, queue_id))
        return row.value if row is not None else self.state.pop_state(group, topic, queue_id)

    def put_pop_row(self, row: PopRow) -> None:
        self.pops[row.group, row.topic, row.queue_id] = row
        if row.commit is not None:  # the group's progress, as RocketMQ commits a pop queue's
            self.offset_rows.append(OffsetRow(row.group, row.topic, row.queue_id, row.commit))

    def set_head(self, head: QueueHead) -> None:
        self.heads[head.topic, head.queue_id] = head

    def add_time_row(self, row: TimeRow) -> None:
        self.time_rows.append(row)

    def add_loose_row(self, row: CQRow) -> None:
        self.loose_rows.append(row)

    def add_key_rows(self, rows: Sequence[KeyRow]) -> None:
        self.loose_key_rows.extend(rows)

    def schedule_ref(self, key: ScheduleKey) -> MessageRef | None:
        if key in self.schedule:
            return self.schedule[key]
        return self.state.schedule_ref(key)

    def schedule_put(self, key: ScheduleKey, ref: MessageRef) -> None:
        self.schedule[key] = ref

    def schedule_delete(self, key: ScheduleKey) -> None:
        self.schedule[key] = None

    def append_rows(
        self,
        topic: str,
        queue_id: int,
        raft_index: int,
        slot: int,
        ts: int,
        chunk_offsets: tuple[int, ...],
        body_sizes: tuple[int, ...],
        tag_hashes: tuple[int, ...],
        keys: tuple[tuple[str, ...], ...] = (),
        head: QueueHead | None = None,
    ) -> int:
        """ConsumeQueue, key and time index rows for messages of chunk (raft_index, slot) at the
        queue's head (`head`: the caller looked it up already); returns the first offset.
        Produce batches and transaction commits."""
        if head is None:
            head = self.queue_head(topic, queue_id)
        first = head.next_offset
        self.cq_batches.append(
            CQBatch(
                topic,
                queue_id,
                first,
                raft_index,
                slot,
                ts,
                chunk_offsets,
                body_sizes,
                tag_hashes,
                keys,
            )
        )
        time_ms = head.time_index_ms
        if ts > time_ms:
            self.time_rows.append(TimeRow(topic, queue_id, ts, first))
            time_ms = ts
        self.heads[topic, queue_id] = QueueHead(topic, queue_id, first + len(body_sizes), time_ms)
        return first

    def put_topic(self, cfg: TopicConfig) -> None:
        self.topics[cfg.name] = TopicRow(cfg.name, cfg)

    def queue_lease(self, group: str, topic: str, queue_id: int) -> Lease | None:
        row = self.locks.get((group, topic, queue_id))
        return row.lease if row is not None else self.state.queue_lease(group, topic, queue_id)

    def queue_head(self, topic: str, queue_id: int) -> QueueHead:
        head = self.heads.get((topic, queue_id)) or self.state.queue_head(topic, queue_id)
        return head if head is not None else QueueHead(topic, queue_id, 0, NO_TIME_MS)

    def producer_state(self, producer_id: str, topic: str, queue_id: int) -> ProducerState | None:
        row = self.producers.get((producer_id, topic, queue_id))
        return (
            row.state
            if row is not None
            else self.state.producer_state(producer_id, topic, queue_id)
        )

    def topic(self, name: str) -> TopicConfig | None:
        row = self.topics.get(name)
        return row.config if row is not None else self.state.topic(name)


class Dispatcher:
    """Assigns queue offsets and derives rows. Offsets come from the per-queue next offset, not
    from the leader: every replica derives the same rows, and a submission that failed on the
    leader leaves no hole in the queue."""

    def __init__(
        self, *, recent_batches_per_producer: int = 5, transactions: TxnApplier | None = None
    ) -> None:
        if not 1 <= recent_batches_per_producer <= 64:
            raise ValueError("recent_batches_per_producer must be within 1..64")
        self._recent = recent_batches_per_producer
        self.transactions = transactions  # None: half messages are stored as plain messages
        # per batch, the same few names: each checked once (issue 24: per batch, not per call)
        self._topics = ValidNames(validate_system_topic)
        self._producer_ids = ValidNames(validate_producer_id)

    @property
    def recent_batches_per_producer(self) -> int:
        return self._recent

    def _produce_of(self, chunk: bytes) -> Callable[[_EntryWork, int, int, bytes], None] | None:
        """The hot path's indexer of a produce chunk (issue 14: index columns, no Message object
        per message): v1 from stores written before the v2 stored batch, v2 and v3 as the
        producer sent them; None for any other chunk."""
        if stored_batch.is_stored(chunk):  # what every producer writes now: tested first
            return self._produce_v2
        if is_produce_v1(chunk):
            return self._produce
        return None

    def apply(self, entry: Entry, state: DispatchState) -> DispatchOutput:
        expected = state.dispatched_index + 1
        if entry.index != expected:
            raise DispatchGapError(expected, entry.index)
        if not entry.chunks:
            return DispatchOutput(entry.index, entry.term)
        work = _EntryWork(state)
        txns = self.transactions
        for slot, chunk in enumerate(entry.chunks):
            produce = self._produce_of(chunk)
            if produce is not None:
                try:
                    produce(work, entry.index, slot, chunk)
                except MalformedBatchError as exc:
                    work.outcomes.append(Rejected(slot, f"undecodable chunk: {exc}"))
                except InvalidArgumentError as exc:  # checked alike on every replica
                    work.outcomes.append(Rejected(slot, str(exc)))
                continue
            if txns is not None and is_txn_chunk(chunk):
                work.outcomes.append(txns.apply_record(work, entry.index, slot, chunk))
                continue
            if is_retention_chunk(chunk):
                try:
                    work.retention = decode_retention(chunk)
                    work.outcomes.append(Applied(slot, Kind.RETENTION))
                except MalformedBatchError as exc:
                    work.outcomes.append(Rejected(slot, f"undecodable chunk: {exc}"))
                continue
            try:
                record = decode(chunk)
            except MalformedBatchError as exc:
                work.outcomes.append(Rejected(slot, f"undecodable chunk: {exc}"))
                continue
            try:
                if isinstance(record, ProduceBatch):  # another version's produce: none yet
                    raise InvalidArgumentError("a produce batch of an unknown version")
                if isinstance(record, CommitOffset):
                    self._commit(work, slot, record)
                elif isinstance(record, ResetOffsets):
                    self._reset(work, slot, record)
                elif isinstance(record, PurgeQueues):
                    validate_topic(record.topic, allow_system=True)
                    work.purges += [(record.topic, q, o) for q, o in sorted(record.offsets.items())]
                    work.outcomes.append(Applied(slot, Kind.PURGE, f"{len(record.offsets)} queues"))
                elif isinstance(record, GroupDelete):
                    validate_group(record.group)  # committed: the same check on every replica
                    work.deleted_groups.append(record.group)
                    work.outcomes.append(Applied(slot, Kind.GROUP_DELETE))
                elif isinstance(record, GroupConfigChange):
                    validate_group_config(record.config)  # committed: the same on every replica
                    work.group_configs.append(record.config)
                    work.outcomes.append(Applied(slot, Kind.GROUP_CONFIG))
                elif isinstance(record, Deliver):
                    counts = delivery.apply_deliver(work, record)
                    work.outcomes.append(Applied(slot, Kind.DELIVER, str(counts)))
                elif isinstance(record, QueueLockChange):
                    self._queue_lock(work, slot, record)
                elif isinstance(record, (PopReceive, PopAck)):
                    self._pop(work, entry.index, slot, record)
                else:
                    self._topic_change(work, slot, record)
            except InvalidArgumentError as exc:  # names and ranges checked alike on every replica
                work.outcomes.append(Rejected(slot, str(exc)))
        return work.output(entry.index, entry.term)

    def _produce(self, work: _EntryWork, raft_index: int, slot: int, chunk: bytes) -> None:
        """A produce chunk, from its index columns (record_batch.scan_produce): the messages
        are decoded only for the features that need them (half and delayed messages)."""
        scan = scan_produce(chunk if isinstance(chunk, bytes) else bytes(chunk))
        header = scan.header
        topic, queue_id, count = header.topic, header.queue_id, header.count
        self._topics.check(topic)
        if self.transactions is not None and self.transactions.is_half(header):
            # Stored, invisible: no ConsumeQueue row until a commit adds one.
            batch, chunk_offsets = _decode_batch(chunk)
            at, body_bytes = (
                (chunk_offsets[0], len(batch.messages[0].body)) if batch.messages else (0, 0)
            )
            work.outcomes.append(
                self.transactions.apply_half(work, raft_index, slot, batch, at, body_bytes)
            )
            return
        verdict = self._sequences(work, slot, topic, queue_id, count, header.producer)
        if isinstance(verdict, Refused):
            work.outcomes.append(verdict.outcome)
            return
        prev, gap = verdict

        tags = scan.tags
        distinct = set(tags)
        tag_hashes: tuple[int, ...]
        if len(distinct) == 1:  # one tag (or none) for the whole batch: one hash
            tag_hashes = (tag_hash(tags[0]),) * count
        else:
            hashes = {t: tag_hash(t) for t in distinct}
            tag_hashes = tuple([hashes[t] for t in tags])
        keys: tuple[tuple[str, ...], ...] = ()
        if scan.keys:
            # A key repeated in one message gives one index row; empty keys give none.
            keys = tuple(tuple(k for k in dict.fromkeys(ks) if k) for ks in scan.keys)
        if header.scheduled:
            batch, chunk_offsets = _decode_batch(chunk)
            delivery.schedule_batch(
                work, raft_index, slot, batch, chunk_offsets, scan.body_sizes, tag_hashes, keys
            )
            self._record_producer(
                work, topic, queue_id, count, header.producer, header.store_timestamp_ms, prev,
                SCHEDULED_OFFSET, raft_index, slot,
            )  # fmt: skip
            work.outcomes.append(Scheduled(slot, topic, queue_id, raft_index, count))
            return
        first = work.append_rows(
            topic,
            queue_id,
            raft_index,
            slot,
            header.store_timestamp_ms,
            scan.offsets,
            scan.body_sizes,
            tag_hashes,
            keys,
        )
        self._record_producer(
            work, topic, queue_id, count, header.producer, header.store_timestamp_ms, prev, first,
            raft_index, slot,
        )  # fmt: skip
        work.outcomes.append(
            Appended(slot, topic, queue_id, StoredRange(first, count, raft_index, slot, 0), gap)
        )

    def _produce_v2(self, work: _EntryWork, raft_index: int, slot: int, chunk: bytes) -> None:
        """A v2 stored batch (issue 24), indexed from its header and tables: one ConsumeQueue
        row, no object per message; its records are read only when some message has keys (the
        key index). The leader checked it whole (check_batch) before it was replicated."""
        header = stored_batch.read_header(chunk)
        topic, queue_id, count, producer = (
            header.topic, header.queue_id, header.count, header.producer,
        )  # fmt: skip
        self._topics.check(topic)
        placed = stored_batch.placed_offset(chunk)  # the leader's, checked below (issue 29)
        # A v2 row keeps each message's record size where a v1 row keeps its body size: what a
        # pull's byte budget counts and the reader checks against (broker/store.py).
        at, sizes, tag_hashes = stored_batch.index_columns(chunk, header)
        txns = self.transactions
        if txns is not None and txns.is_half(header):  # the broker's own write (one message)
            # Stored, invisible: no ConsumeQueue row until a commit adds one.
            _check_placed(placed, None, topic, queue_id, raft_index, slot)
            messages = tuple(m.message() for m in stored_batch.iter_messages(chunk, verify=False))
            batch = ProduceBatch(topic, queue_id, header.store_timestamp_ms, messages, producer)
            work.outcomes.append(txns.apply_half(work, raft_index, slot, batch, at[0], sizes[0]))
            return
        prev: ProducerState | None = None
        gap: SequenceGap | None = None
        if producer is not None:  # an idempotent batch against its producer's window
            verdict = window_verdict(
                work.producer_state(producer.producer_id, topic, queue_id),
                slot, topic, queue_id, count, producer, self._producer_ids,
            )  # fmt: skip
            if isinstance(verdict, Refused):
                _check_placed(placed, None, topic, queue_id, raft_index, slot)
                work.outcomes.append(verdict.outcome)
                return
            prev, gap = verdict
        scheduled = stored_batch.is_scheduled(chunk)
        head = None if scheduled else work.queue_head(topic, queue_id)
        _check_placed(
            placed, None if head is None else head.next_offset, topic, queue_id, raft_index, slot
        )
        keys: tuple[tuple[str, ...], ...] = ()
        if stored_batch.has_keys(chunk):  # per message, for the key index only
            keys = tuple(
                tuple(k for k in dict.fromkeys(m.keys) if k)
                for m in stored_batch.iter_messages(chunk, verify=False)
            )
        if head is None:  # a delayed send (the broker's own write)
            # Each message's due time is in its record (TIMER_OUT_MS): read per message.
            messages = tuple(m.message() for m in stored_batch.iter_messages(chunk, verify=False))
            batch = ProduceBatch(
                topic, queue_id, header.store_timestamp_ms, messages, producer, True
            )
            delivery.schedule_batch(work, raft_index, slot, batch, at, sizes, tag_hashes, keys)
            self._record_producer(
                work, topic, queue_id, count, producer, header.store_timestamp_ms, prev,
                SCHEDULED_OFFSET, raft_index, slot,
            )  # fmt: skip
            work.outcomes.append(Scheduled(slot, topic, queue_id, raft_index, count))
            return
        first = work.append_rows(
            topic, queue_id, raft_index, slot, header.store_timestamp_ms, at, sizes, tag_hashes,
            keys, head,
        )  # fmt: skip
        self._record_producer(
            work, topic, queue_id, count, producer, header.store_timestamp_ms, prev, first,
            raft_index, slot,
        )  # fmt: skip
        work.outcomes.append(
            Appended(slot, topic, queue_id, StoredRange(first, count, raft_index, slot, 0), gap)
        )

    def _sequences(
        self,
        work: _EntryWork,
        slot: int,
        topic: str,
        queue_id: int,
        count: int,
        producer: ProducerSequence | None,
    ) -> Refused | tuple[ProducerState | None, SequenceGap | None]:
        """An idempotent batch against its producer's window: refused (out of order, a
        duplicate, an overlap), or (the producer's state before it, a gap it leaves)."""
        if producer is None:
            return None, None
        prev = work.producer_state(producer.producer_id, topic, queue_id)
        return window_verdict(prev, slot, topic, queue_id, count, producer, self._producer_ids)

    def _record_producer(
        self,
        work: _EntryWork,
        topic: str,
        queue_id: int,
        count: int,
        producer: ProducerSequence | None,
        store_timestamp_ms: int,
        prev: ProducerState | None,
        first: int,
        raft_index: int,
        slot: int,
    ) -> None:
        if producer is None:
            return
        origin = BatchOrigin(producer.first_sequence, count, first, raft_index, slot)
        work.producers[producer.producer_id, topic, queue_id] = ProducerRow(
            producer.producer_id,
            topic,
            queue_id,
            next_producer_state(prev, producer, origin, store_timestamp_ms, self._recent),
        )

    @staticmethod
    def _commit(work: _EntryWork, slot: int, rec: CommitOffset) -> None:
        validate_group(rec.group, allow_system=True)  # committed: apply what the log holds
        validate_topic(rec.topic, allow_system=True)
        work.offset_rows.append(OffsetRow(rec.group, rec.topic, rec.queue_id, rec.offset))
        work.outcomes.append(Applied(slot, Kind.COMMIT_OFFSET))

    @staticmethod
    def _reset(work: _EntryWork, slot: int, rec: ResetOffsets) -> None:
        validate_group(rec.group, allow_system=True)  # committed: apply what the log holds
        validate_topic(rec.topic, allow_system=True)
        for queue_id in sorted(rec.offsets):
            work.offset_rows.append(
                OffsetRow(rec.group, rec.topic, queue_id, rec.offsets[queue_id], reset=True)
            )
            raw = work.pop_state(rec.group, rec.topic, queue_id)
            if raw is not None:  # a POP consumer group: its cursor moves with the reset
                row = reset_state(rec.group, rec.topic, queue_id, raw, rec.offsets[queue_id])
                work.pops[rec.group, rec.topic, queue_id] = row
        work.outcomes.append(Applied(slot, Kind.RESET_OFFSETS, f"{len(rec.offsets)} queues"))

    @staticmethod
    def _queue_lock(work: _EntryWork, slot: int, rec: QueueLockChange) -> None:
        validate_group(rec.group, allow_system=True)  # committed: apply what the log holds
        validate_topic(rec.topic, allow_system=True)
        result, rows = apply_lock_change(rec, work.queue_lease)
        for row in rows:
            work.locks[row.group, row.topic, row.queue_id] = row
        detail = f"{len(result.granted)} granted, {len(result.refused)} refused"
        work.outcomes.append(Applied(slot, Kind.QUEUE_LOCK, detail, result))

    @staticmethod
    def _pop(work: _EntryWork, raft_index: int, slot: int, rec: PopReceive | PopAck) -> None:
        validate_group(rec.group, allow_system=True)  # committed: apply what the log holds
        validate_topic(rec.topic, allow_system=True)
        if isinstance(rec, PopReceive):
            result: PopReceiveResult | PopAckResult
            result, rows = apply_receive(rec, raft_index, slot, work.pop_state)
            kind, detail = Kind.POP_RECEIVE, f"{sum(len(p.handed) for p in result.parts)} handed"
        else:
            result, rows = apply_ack(rec, raft_index, slot, work.pop_state)
            kind, detail = Kind.POP_ACK, f"{len(result.outcomes)} entries"
        for row in rows:
            work.put_pop_row(row)
        work.outcomes.append(Applied(slot, kind, detail, pop=result))

    @staticmethod
    def _topic_change(work: _EntryWork, slot: int, rec: TopicConfigChange) -> None:
        cfg = rec.config
        if rec.op is TopicOp.DELETE:
            validate_topic(cfg.name, allow_system=True)
            if work.topic(cfg.name) is None:
                work.outcomes.append(Applied(slot, Kind.TOPIC_CONFIG, "absent; nothing deleted"))
                return
            work.topics[cfg.name] = TopicRow(cfg.name, None)
            work.outcomes.append(Applied(slot, Kind.TOPIC_CONFIG, "deleted"))
            return
        validate_topic_config(cfg)
        if rec.op is TopicOp.CREATE and work.topic(cfg.name) is not None:
            work.outcomes.append(Applied(slot, Kind.TOPIC_CONFIG, "exists; unchanged"))
            return
        work.topics[cfg.name] = TopicRow(cfg.name, cfg)
        work.outcomes.append(Applied(slot, Kind.TOPIC_CONFIG, rec.op.name.lower() + "d"))


def placement_disagreement(placed: int | None, counted: int | None) -> str | None:
    """The dispatcher's check of one produce batch on every replica: `placed` is the base
    offset the leader placed (None: it placed none, the dispatcher assigns), `counted` the
    offset this replica's own count gives the batch (None: it appends nothing: refused by
    the producer window, delayed, a half message). Why they disagree, or None."""
    if placed is None:
        return None
    if counted is None:
        return "the leader placed offsets for a batch this replica does not append"
    if placed != counted:
        return f"the leader placed it at {placed}, this replica's count is {counted}"
    return None


def _check_placed(
    placed: int | None,
    counted: int | None,
    topic: str,
    queue_id: int,
    raft_index: int,
    slot: int,
) -> None:
    """A placed offset this replica does not count alike stops dispatch (never a divergent
    index): leader_offsets.placement_disagreement decides."""
    reason = placement_disagreement(placed, counted)
    if reason is not None:
        assert placed is not None
        raise OffsetDisagreementError(topic, queue_id, placed, counted, raft_index, slot, reason)


def window_verdict(
    prev: ProducerState | None,
    slot: int,
    topic: str,
    queue_id: int,
    count: int,
    producer: ProducerSequence,
    producer_ids: ValidNames | None = None,
) -> Refused | tuple[ProducerState | None, SequenceGap | None]:
    """An idempotent batch against its producer's window `prev`: refused (out of order, a
    duplicate, an overlap), or (`prev`, a gap it leaves). The one rule for the dispatcher and
    the leader that places offsets (broker/leader_offsets.py). `producer_ids`: the caller's
    memory of ids that passed validate_producer_id (the same verdict, once per id)."""
    gap: SequenceGap | None = None
    if producer_ids is not None:
        producer_ids.check(producer.producer_id)
    else:
        validate_producer_id(producer.producer_id)
    first_seq = producer.first_sequence
    last_seq = first_seq + count - 1
    if last_seq > MAX_SEQUENCE:
        return Refused(Rejected(slot, f"sequences {first_seq}..{last_seq} exceed {MAX_SEQUENCE}"))
    expected = prev.last_sequence + 1 if prev is not None else 0
    if producer.strict and first_seq > expected:
        # An earlier batch of this queue is still in flight (retried): storing this one
        # now would put it before that one, whose retry would then look like a
        # duplicate and be dropped. Refused unstored; the producer retries it.
        return Refused(
            OutOfOrder(
                slot,
                f"producer {producer.producer_id!r} sequence {first_seq} arrived before "
                f"{expected} on {topic}/{queue_id}; retry it after the earlier batch",
                expected,
            )
        )
    if prev is not None:
        if last_seq <= prev.last_sequence:
            stored = _find_original(prev, first_seq, count)
            return Refused(Duplicate(slot, topic, queue_id, stored))
        if first_seq <= prev.last_sequence:
            return Refused(
                Rejected(
                    slot,
                    f"producer {producer.producer_id!r} sequences {first_seq}..{last_seq} "
                    f"overlap the last stored sequence {prev.last_sequence}; "
                    "retry exactly the batch that was sent before",
                )
            )
        if first_seq > prev.last_sequence + 1:
            gap = SequenceGap(prev.last_sequence + 1, first_seq)
    return prev, gap


def next_producer_state(
    prev: ProducerState | None,
    producer: ProducerSequence,
    origin: BatchOrigin,
    store_timestamp_ms: int,
    recent_batches: int,
) -> ProducerState:
    """The producer's window once `origin` (an accepted batch) is stored."""
    recent = ((*prev.recent, origin) if prev is not None else (origin,))[-recent_batches:]
    return ProducerState(producer.first_sequence + origin.count - 1, store_timestamp_ms, recent)


def _decode_batch(chunk: bytes) -> tuple[ProduceBatch, tuple[int, ...]]:
    """The whole batch, for the features that read its messages (half and delayed ones)."""
    record, offsets = decode_with_offsets(chunk)
    if not isinstance(record, ProduceBatch):  # scan_produce read it as one: a bug
        raise MalformedBatchError("a produce chunk decoded as another record")
    return record, offsets


def _find_original(state: ProducerState, first_seq: int, count: int) -> StoredRange | None:
    """Where a retried batch's messages were stored, if one remembered batch holds them all."""
    last_seq = first_seq + count - 1
    for origin in reversed(state.recent):
        if origin.first_sequence <= first_seq and last_seq < origin.first_sequence + origin.count:
            skip = first_seq - origin.first_sequence
            if origin.first_offset == SCHEDULED_OFFSET:  # a delayed batch: no offsets yet
                return StoredRange(-1, count, origin.raft_index, origin.slot, skip)
            return StoredRange(
                origin.first_offset + skip, count, origin.raft_index, origin.slot, skip
            )
    return None
