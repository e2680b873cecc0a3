"""POP consumption's replicated state (RocketMQ 5 keeps pop checkpoints and ack records in the
broker): the dispatcher applies each POP_RECEIVE and POP_ACK record with common/pop.py's
transitions, at the record's time and with tokens named by the entry, over one state row per
(consumer group, topic, queue). Pure: rows in, rows out; every replica derives the same ones,
so a new leader, a restarted proxy and a node restored from a retention base know what is in
flight, until when, at which attempt, and which receipt handles are current.

A token is `raft index << 16 | slot` of the entry that made the delivery: unique per delivery
of an offset on every replica, with no counter to replicate.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from raftmq.common.pop import AckOutcome, Delivery, QueuePop
from raftmq.common.record_batch import NO_OFFSET, PopAck, PopReceive
from raftmq.common.types import MAX_QUEUE_ID

# Past this many messages in flight a queue's row gives nothing new (the proxy asks for less);
# it bounds the row, which is rewritten by every batch that touches the queue.
MAX_INFLIGHT_ROW = 10_000
MAX_SLOTS = 1 << 16

_HEAD = struct.Struct(">QQBI")  # cursor, committed (as written to the offsets), fifo, count
_DELIVERY = struct.Struct(">QIQQ")  # offset, attempt, token, visible at ms

RowLookup = Callable[[str, str, int], bytes | None]


def token_of(raft_index: int, slot: int) -> int:
    assert 0 <= slot < MAX_SLOTS
    return (raft_index << 16) | slot


@dataclass(frozen=True, slots=True)
class Handed:
    """A delivery as the apply made it (a copy: the state it came from is thrown away)."""

    offset: int
    attempt: int
    token: int
    visible_at_ms: int


def _handed(d: Delivery) -> Handed:
    return Handed(d.offset, d.attempt, d.token, d.visible_at_ms)


@dataclass(frozen=True, slots=True)
class PopPartResult:
    queue_id: int
    handed: tuple[Handed, ...]  # redeliveries first, then new ones, ascending within each
    cursor: int


@dataclass(frozen=True, slots=True)
class PopReceiveResult:
    parts: tuple[PopPartResult, ...]


@dataclass(frozen=True, slots=True)
class PopAckResult:
    """Per entry, in order: the outcome and, for a change of the invisible duration that took
    effect, the new delivery (its new token)."""

    outcomes: tuple[tuple[AckOutcome, Handed | None], ...]


@dataclass(frozen=True, slots=True)
class PopRow:
    """A queue's POP state after an entry (encoded), and the offset to commit for the group
    when its low watermark moved (None: unchanged)."""

    group: str
    topic: str
    queue_id: int
    value: bytes
    commit: int | None = None


def encode_state(p: QueuePop, committed: int) -> bytes:
    ds = sorted(p.inflight.values(), key=lambda d: d.offset)
    return _HEAD.pack(p.cursor, committed, int(p.fifo), len(ds)) + b"".join(
        _DELIVERY.pack(d.offset, d.attempt, d.token, d.visible_at_ms) for d in ds
    )


def decode_state(raw: bytes, max_inflight: int = MAX_INFLIGHT_ROW) -> tuple[QueuePop, int]:
    """The queue's state and the offset last committed for it."""
    cursor, committed, fifo, n = _HEAD.unpack_from(raw, 0)
    p = QueuePop(cursor, fifo=bool(fifo), max_inflight=max(1, max_inflight))
    for i in range(n):
        off, attempt, token, until = _DELIVERY.unpack_from(raw, _HEAD.size + i * _DELIVERY.size)
        p.inflight[off] = Delivery(off, attempt, token, until)
    p.committed(committed)
    return p, committed


def _load(
    row_of: RowLookup, group: str, topic: str, queue_id: int, init: int, fifo: bool
) -> tuple[QueuePop, int]:
    raw = row_of(group, topic, queue_id)
    if raw is None:
        p = QueuePop(init, fifo=fifo, max_inflight=MAX_INFLIGHT_ROW)
        p.committed(init)
        return p, init
    p, committed = decode_state(raw)
    p.fifo = fifo
    return p, committed


def _row(group: str, topic: str, queue_id: int, p: QueuePop, committed: int) -> PopRow:
    low = p.low_watermark()
    moved = low if low != committed else None
    return PopRow(group, topic, queue_id, encode_state(p, low), moved)


def reset_state(group: str, topic: str, queue_id: int, raw: bytes, offset: int) -> PopRow:
    """An administrative offset reset of a POP queue: the cursor goes there and every delivery
    in flight is forgotten (its handle acknowledges nothing any more), as the reset says where
    consumption goes on."""
    p, _ = decode_state(raw)
    p.inflight.clear()
    p.cursor = offset
    return PopRow(group, topic, queue_id, encode_state(p, offset))


def apply_receive(
    rec: PopReceive, raft_index: int, slot: int, row_of: RowLookup
) -> tuple[PopReceiveResult, tuple[PopRow, ...]]:
    """One receive batch at the record's time. Never raises for the record's content: what the
    state no longer allows (a cursor moved by another receive, a message no longer visible) is
    not handed out, so the answer is only what every replica agrees was delivered."""
    token = token_of(raft_index, slot)
    now, invisible = rec.timestamp_ms, rec.invisible_ms
    results: list[PopPartResult] = []
    states: dict[int, tuple[QueuePop, int]] = {}
    for part in rec.parts:
        qid = part.queue_id
        if not 0 <= qid <= MAX_QUEUE_ID or part.init_offset == NO_OFFSET:
            continue  # checked by the leader; a replica skips what it cannot name
        st = states.get(qid)
        if st is None:
            st = states[qid] = _load(row_of, rec.group, rec.topic, qid, part.init_offset, part.fifo)
        p = st[0]
        for o in part.drops:
            p.drop(o)
        handed: list[Handed] = []
        if part.reset_to != NO_OFFSET:
            if part.pulled_from == p.cursor:
                p.reset(part.reset_to)
        else:
            redeliver, claim = part.redeliver, part.pulled_from != NO_OFFSET
            if p.fifo:
                # A FIFO queue in order, whatever the proxy planned: again only from its first
                # unacknowledged message, nothing new while one is unacknowledged.
                plan = p.plan(now, MAX_INFLIGHT_ROW)
                allowed = set(plan.redeliver)
                redeliver = tuple(o for o in redeliver if o in allowed)
                claim = claim and plan.new_from is not None
            for o in redeliver:
                d = p.redeliver(o, now, invisible, token=token)
                if d is not None:
                    handed.append(_handed(d))
            if claim:
                limit = min(rec.max_inflight or MAX_INFLIGHT_ROW, MAX_INFLIGHT_ROW)
                take = min(part.take, max(0, limit - len(p.inflight)))
                new = sorted(o for o in part.new_offsets if o >= part.pulled_from)
                if new:
                    ds = p.claim_new(
                        part.pulled_from, new, part.next_offset, now, invisible, take, token=token
                    )
                    handed += [_handed(d) for d in ds]
                else:
                    p.skip_to(part.pulled_from, part.next_offset)
        results.append(PopPartResult(qid, tuple(handed), p.cursor))
    rows = tuple(_row(rec.group, rec.topic, q, p, c) for q, (p, c) in states.items())
    return PopReceiveResult(tuple(results)), rows


def apply_ack(
    rec: PopAck, raft_index: int, slot: int, row_of: RowLookup
) -> tuple[PopAckResult, tuple[PopRow, ...]]:
    """One ack (or change-invisible) batch at the record's time."""
    token = token_of(raft_index, slot)
    states: dict[int, tuple[QueuePop, int]] = {}
    outcomes: list[tuple[AckOutcome, Handed | None]] = []
    for e in rec.entries:
        st = states.get(e.queue_id)
        if st is None:
            raw = row_of(rec.group, rec.topic, e.queue_id) if e.queue_id <= MAX_QUEUE_ID else None
            if raw is None:
                outcomes.append((AckOutcome.UNKNOWN, None))
                continue
            st = states[e.queue_id] = decode_state(raw)
        p = st[0]
        if rec.invisible_ms == 0:
            outcomes.append((p.ack(e.offset, e.token), None))
            continue
        outcome, d = p.change_invisible(
            e.offset, e.token, rec.timestamp_ms, rec.invisible_ms, new_token=token
        )
        outcomes.append((outcome, _handed(d) if d is not None else None))
    rows = tuple(_row(rec.group, rec.topic, q, p, c) for q, (p, c) in states.items())
    return PopAckResult(tuple(outcomes)), rows
