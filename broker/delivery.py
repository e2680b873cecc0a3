"""Delayed delivery in the dispatcher's apply (pure) and the leader's send path: a delayed batch
enters the schedule instead of its queue; a DELIVER record moves due messages into the queue of
their real topic as ConsumeQueue rows pointing at the bytes where the producer's entry put them.

Apply is deterministic (the leader's due time travels in the message, TIMER_OUT_MS; the DELIVER
record carries its own time) and idempotent: a key already delivered is skipped, a key not yet
due stays scheduled, so two leaders proposing the same key deliver it once, never early (the
rules of broker/schedule.py's Schedule.apply_deliver, applied to the dispatcher's pending view).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from raftmq.broker.rows import CQRow, KeyRow, QueueHead, TimeRow
from raftmq.broker.schedule import MessageRef, ScheduleKey
from raftmq.broker.schedule_store import schedule_key
from raftmq.common.delay import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_DELAY_MS,
    PROPERTY_DELAY_SEC,
    PROPERTY_DELIVER_MS,
    DelayPolicy,
    delay_from_properties,
)
from raftmq.common.message import Message
from raftmq.common.record_batch import Deliver, ProduceBatch

# RocketMQ 5's timer property: the due time the broker computed, set by the leader at store time.
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
DELAY_PROPERTIES = frozenset(
    {PROPERTY_DELAY_LEVEL, PROPERTY_DELAY_MS, PROPERTY_DELAY_SEC, PROPERTY_DELIVER_MS}
)
_SYSTEM_DELAY_PROPERTIES = DELAY_PROPERTIES | {PROPERTY_TIMER_OUT_MS}


class ScheduleWork(Protocol):
    """The dispatcher's view of one entry being applied (broker/dispatch.py's _EntryWork)."""

    def queue_head(self, topic: str, queue_id: int) -> QueueHead: ...

    def set_head(self, head: QueueHead) -> None: ...

    def add_time_row(self, row: TimeRow) -> None: ...

    def add_loose_row(self, row: CQRow) -> None: ...

    def add_key_rows(self, rows: Sequence[KeyRow]) -> None: ...

    def schedule_ref(self, key: ScheduleKey) -> MessageRef | None: ...

    def schedule_put(self, key: ScheduleKey, ref: MessageRef) -> None: ...

    def schedule_delete(self, key: ScheduleKey) -> None: ...


@dataclass(frozen=True, slots=True)
class DeliverCounts:
    delivered: int
    already: int  # delivered by an earlier DELIVER entry (a deposed leader's)
    early: int  # not due at the record's time: left in the schedule


# ---- the leader's send path --------------------------------------------------------------------


def is_delayed(message: Message) -> bool:
    return not DELAY_PROPERTIES.isdisjoint(message.properties)


def user_view(message: Message) -> Message:
    """The message without its delay properties: what validate_message checks (the SDK sets
    those reserved names through its delay arguments, not as user properties)."""
    props = {k: v for k, v in message.properties.items() if k not in _SYSTEM_DELAY_PROPERTIES}
    return dataclasses.replace(message, properties=props)


def stamp_due(
    messages: Sequence[Message], store_ms: int, policy: DelayPolicy
) -> tuple[Message, ...]:
    """The messages of a delayed send with their due time (TIMER_OUT_MS) computed from the store
    time, as every replica will read it. Raises InvalidDelayError for a request outside the
    rules; a message without a delay in the batch is due at once."""
    out = []
    for m in messages:
        spec = delay_from_properties(m.properties)
        due = store_ms if spec is None else policy.due_ms(spec, store_ms)
        out.append(
            dataclasses.replace(m, properties={**m.properties, PROPERTY_TIMER_OUT_MS: str(due)})
        )
    return tuple(out)


# ---- apply (every replica, in log order) ------------------------------------------------------


def due_of(message: Message, store_ms: int) -> int:
    """The due time the leader stamped; a message without one (or unreadable) is due at once."""
    try:
        return max(int(message.properties[PROPERTY_TIMER_OUT_MS]), 0)
    except (KeyError, ValueError):
        return store_ms


def schedule_batch(
    work: ScheduleWork,
    raft_index: int,
    slot: int,
    batch: ProduceBatch,
    chunk_offsets: Sequence[int],
    sizes: Sequence[int],
    tag_hashes: Sequence[int],
    keys: Sequence[tuple[str, ...]] = (),
) -> None:
    """A delayed batch committed: each message enters the schedule at its due time, with its
    keys (`keys[i]`: message i's, deduplicated; () when no message has keys) for delivery to
    index under the real topic. `sizes`: what its ConsumeQueue row will keep, as any row of
    the chunk's format (the body's size in v1, the record's in v2)."""
    ts = batch.store_timestamp_ms
    for i, m in enumerate(batch.messages):
        key = schedule_key(due_of(m, ts), raft_index, slot, i)
        ref = MessageRef(
            raft_index,
            slot,
            i,
            batch.topic,
            batch.queue_id,
            chunk_offsets[i],
            sizes[i],
            tag_hashes[i],
            keys[i] if keys else (),
        )
        work.schedule_put(key, ref)


def apply_deliver(work: ScheduleWork, record: Deliver) -> DeliverCounts:
    """A DELIVER record committed: each key still scheduled and due at the record's time gets a
    ConsumeQueue row in its real queue, in the record's order (the leader's due order), and its
    keys key index rows under the real topic, stamped with the delivery time like its row (so a
    key query narrowed to a time range and `message list` agree). The key rows go out as one
    list for the whole record."""
    delivered = already = early = 0
    key_rows: list[KeyRow] = []
    ts = record.now_ms
    for k in record.keys:
        key = schedule_key(k.due_ms, k.raft_index, k.slot, k.position)
        if k.due_ms > ts:
            early += 1
            continue
        ref = work.schedule_ref(key)
        if ref is None:
            already += 1
            continue
        work.schedule_delete(key)
        head = work.queue_head(ref.topic, ref.queue_id)
        offset = head.next_offset
        work.add_loose_row(
            CQRow(
                ref.topic,
                ref.queue_id,
                offset,
                ref.raft_index,
                ref.slot,
                ref.position,
                ref.chunk_offset_bytes,
                ref.body_bytes,
                ref.tag_hash,
                ts,
            )
        )
        key_rows.extend(KeyRow(ref.topic, k, ref.queue_id, offset, ts) for k in ref.keys)
        time_ms = head.time_index_ms
        if ts > time_ms:
            work.add_time_row(TimeRow(ref.topic, ref.queue_id, ts, offset))
            time_ms = ts
        work.set_head(QueueHead(ref.topic, ref.queue_id, offset + 1, time_ms))
        delivered += 1
    if key_rows:
        work.add_key_rows(key_rows)
    return DeliverCounts(delivered, already, early)
