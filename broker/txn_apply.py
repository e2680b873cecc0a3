"""The transaction events as the dispatcher applies them: the pure TransactionBook
(broker/transaction.py) plus what a ConsumeQueue row needs and what the store persists.

Every replica's dispatcher applies the same committed chunks in log order with the time each
carries, so every replica holds the same table; each change also leaves a TxnRow that the store
writes in the transaction that advances its dispatched index, so a restart (or a new leader)
resumes from exactly the applied state: `restore` loads those rows. No clock, no I/O; the lock is
for the shell's threads (the leader's check loop and end requests read the book the dispatcher
thread writes).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from raftmq.broker.rows import (
    Appended,
    Applied,
    ChunkOutcome,
    CQRow,
    Duplicate,
    Rejected,
    StoredRange,
)
from raftmq.broker.schedule import MessageRef
from raftmq.broker.transaction import (
    MOVED_TOPIC,
    EndOutcome,
    EndResult,
    Resolution,
    TransactionBook,
    Txn,
    TxnSettings,
    TxnState,
)
from raftmq.broker.txn_records import (
    HALF_PRODUCER_ID,
    PROP_CHECK_IMMUNITY,
    PROP_PRODUCER_GROUP,
    PROP_TRAN_MSG,
    PROP_TRANSACTION_CLIENT,
    PROP_TRANSACTION_ID,
    TxnCheck,
    TxnEnd,
    TxnMoved,
    decode_txn,
)
from raftmq.common.filter.tag import tag_hash
from raftmq.common.record_batch import Kind, MalformedBatchError, ProduceBatch, ProduceHeader
from raftmq.common.stored_batch import BatchHeader
from raftmq.common.topic_config import Permission, TopicConfig

MAX_TXN_ID_BYTES = 128


@dataclass(frozen=True, slots=True)
class TxnRow:
    """A transaction's persisted state (None: forgotten, delete it)."""

    txn_id: str
    value: bytes | None
    # The raft index of the half message's bytes while the transaction is open (HALF), else
    # None: retention must not cut an entry an open half still lives in (store.py).
    open_half_index: int | None = None
    ref_index: int = 0  # the half's raft index, whatever the state


@dataclass(frozen=True, slots=True)
class HalfPlace:
    """What a ConsumeQueue row of the half message needs beyond its MessageRef."""

    chunk_offset: int
    body_bytes: int
    tag_hash: int
    keys: tuple[str, ...]


class RowSink(Protocol):
    """The dispatcher's per-entry work (broker/dispatch.py _EntryWork)."""

    txn_rows: dict[str, TxnRow]

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
    ) -> int: ...

    def topic(self, name: str) -> TopicConfig | None: ...

    def put_topic(self, cfg: TopicConfig) -> None: ...


def end_detail(result: EndResult) -> str:
    """Applied.detail of an end: its outcome and the state after it ("conflict|committed")."""
    return f"{result.outcome.value}|{result.state.value if result.state else ''}"


def parse_end_detail(detail: str) -> tuple[EndOutcome, TxnState | None]:
    outcome, _, state = detail.partition("|")
    return EndOutcome(outcome), TxnState(state) if state else None


class TxnApplier:
    def __init__(self, settings: TxnSettings, persisted: Iterable[bytes] = ()) -> None:
        self.settings = settings
        self.lock = threading.RLock()
        self.book = TransactionBook(settings, track_forgotten=True)
        self._places: dict[str, HalfPlace] = {}
        self._ended_at: dict[str, int] = {}  # id -> (raft index, slot) of its end, packed: order
        self._restore(persisted)

    # ---- the dispatcher's calls (the dispatcher thread, in log order) ---------------------------

    @staticmethod
    def is_half(batch: ProduceBatch | ProduceHeader | BatchHeader) -> bool:
        """A half message: its batch carries the HALF_PRODUCER_ID mark, which only the broker's
        SendHalfMessage writes (the header tells: the dispatcher asks before decoding)."""
        return batch.producer is not None and batch.producer.producer_id == HALF_PRODUCER_ID

    def apply_half(
        self,
        work: RowSink,
        raft_index: int,
        slot: int,
        batch: ProduceBatch,
        chunk_offset: int,
        stored_bytes: int,
    ) -> ChunkOutcome:
        """A half message committed: stored, invisible until its end. `chunk_offset` and
        `stored_bytes` are what its ConsumeQueue row will keep: where its record starts in the
        chunk and, as for any row of the chunk's format, its body's size (v1) or its record's
        (v2)."""
        if len(batch.messages) != 1:
            return Rejected(slot, f"a half message batch of {len(batch.messages)} messages")
        msg = batch.messages[0]
        props = msg.properties
        txn_id = props.get(PROP_TRANSACTION_ID, "")
        # Groups, clients and topics repeat across many transactions: one string object each.
        group = sys.intern(props.get(PROP_PRODUCER_GROUP, ""))
        client = sys.intern(props.get(PROP_TRANSACTION_CLIENT, ""))
        if (
            props.get(PROP_TRAN_MSG) != "true"
            or not txn_id
            or not group
            or len(txn_id.encode("utf-8")) > MAX_TXN_ID_BYTES
        ):
            return Rejected(slot, "a half message without a valid transaction id or group")
        immunity_ms: int | None = None
        raw = props.get(PROP_CHECK_IMMUNITY, "")
        if raw.isdigit():
            immunity_ms = int(raw) * 1000
        with self.lock:
            if self.book.get(txn_id) is not None:
                # A retried half send: stored already; this copy stays invisible forever.
                return Duplicate(slot, batch.topic, batch.queue_id, None)
            ref = MessageRef(raft_index, slot, 0, sys.intern(batch.topic), batch.queue_id)
            self.book.apply_half(txn_id, group, client, ref, batch.store_timestamp_ms, immunity_ms)
            keys = tuple(k for k in dict.fromkeys(msg.keys) if k)
            self._places[txn_id] = HalfPlace(chunk_offset, stored_bytes, tag_hash(msg.tags), keys)
            self._persist(work, txn_id)
            self._forget(work)
        return Appended(slot, batch.topic, batch.queue_id, StoredRange(-1, 1, raft_index, slot))

    def apply_record(self, work: RowSink, raft_index: int, slot: int, chunk: bytes) -> ChunkOutcome:
        try:
            record = decode_txn(chunk)
        except MalformedBatchError as exc:
            return Rejected(slot, f"undecodable transaction record: {exc}")
        with self.lock:
            try:
                if isinstance(record, TxnEnd):
                    return self._end(work, raft_index, slot, record)
                if isinstance(record, TxnCheck):
                    sent = self.book.apply_check_sent(record.txn_id, record.ts_ms, record.client)
                    if sent:
                        self._persist(work, record.txn_id)
                    return Applied(slot, Kind.TXN_CHECK, "sent" if sent else "ended")
                return self._moved(work, raft_index, slot, record)
            finally:
                self._forget(work)

    def _end(self, work: RowSink, raft_index: int, slot: int, record: TxnEnd) -> ChunkOutcome:
        result = self.book.apply_end(
            record.txn_id, record.resolution, record.ts_ms, from_check=record.from_check
        )
        if result.outcome is EndOutcome.VISIBLE:
            assert result.ref is not None
            self._index(work, result.ref.topic, result.ref, record.txn_id, record.ts_ms)
        if result.outcome in (EndOutcome.VISIBLE, EndOutcome.DROPPED):
            self._ended_at[record.txn_id] = (raft_index << 20) | slot
            self._persist(work, record.txn_id)
        return Applied(slot, Kind.TXN_END, end_detail(result))

    def _moved(self, work: RowSink, raft_index: int, slot: int, record: TxnMoved) -> ChunkOutcome:
        ref = self.book.apply_moved(record.txn_id, record.ts_ms)
        if ref is None:
            return Applied(slot, Kind.TXN_MOVED, "ended")
        # For a person to inspect: the moved topic's queue of the same id points at the half's
        # bytes (their header still names the real topic; the reader allows that here only).
        cfg = work.topic(MOVED_TOPIC)
        queues = max(ref.queue_id + 1, cfg.read_queue_nums if cfg is not None else 1)
        if cfg is None or cfg.read_queue_nums < queues:
            work.put_topic(TopicConfig(MOVED_TOPIC, queues, queues, Permission.READ))
        self._index(work, MOVED_TOPIC, ref, record.txn_id, record.ts_ms)
        self._ended_at[record.txn_id] = (raft_index << 20) | slot
        self._persist(work, record.txn_id)
        return Applied(slot, Kind.TXN_MOVED, "moved")

    def _index(self, work: RowSink, topic: str, ref: MessageRef, txn_id: str, ts: int) -> None:
        place = self._places[txn_id]
        work.append_rows(
            topic,
            ref.queue_id,
            ref.raft_index,
            ref.slot,
            ts,
            (place.chunk_offset,),
            (place.body_bytes,),
            (place.tag_hash,),
            (place.keys,) if place.keys else (),
        )

    # ---- reads (any thread, under `lock`) -------------------------------------------------------

    def half_row(self, txn_id: str) -> CQRow | None:
        """A ConsumeQueue-like row of the half message (queue offset -1), to read its bytes."""
        with self.lock:
            txn = self.book.get(txn_id)
            place = self._places.get(txn_id)
            if txn is None or place is None:
                return None
            ref = txn.ref
            return CQRow(
                ref.topic,
                ref.queue_id,
                -1,
                ref.raft_index,
                ref.slot,
                ref.position,
                place.chunk_offset,
                place.body_bytes,
                place.tag_hash,
                txn.stored_ms,
            )

    def end_result(self, txn_id: str, resolution: Resolution) -> None:
        """Raise the typed error an end would get now (validate_end under the lock)."""
        with self.lock:
            self.book.validate_end(txn_id, resolution)

    # ---- persistence ----------------------------------------------------------------------------

    def _persist(self, work: RowSink, txn_id: str) -> None:
        txn = self.book.get(txn_id)
        assert txn is not None
        if txn.state is not TxnState.HALF:
            self._places.pop(txn_id, None)  # ended: nothing will point at its bytes again
        place = self._places.get(txn_id)
        doc = {
            "id": txn.txn_id,
            "g": txn.producer_group,
            "c": txn.producer_client,
            "r": [txn.ref.raft_index, txn.ref.slot, txn.ref.position, txn.ref.topic],
            "q": txn.ref.queue_id,
            "s": txn.stored_ms,
            "st": txn.state.value,
            "n": txn.checks,
            "nc": txn.next_check_ms,
            "lc": txn.last_check_client,
            "e": txn.ended_ms,
            "ei": self._ended_at.get(txn_id, 0),
            "p": (
                [place.chunk_offset, place.body_bytes, place.tag_hash, list(place.keys)]
                if place is not None
                else None
            ),
        }
        work.txn_rows[txn_id] = TxnRow(
            txn_id,
            json.dumps(doc, separators=(",", ":")).encode(),
            txn.ref.raft_index if txn.state is TxnState.HALF else None,
            txn.ref.raft_index,
        )

    def _forget(self, work: RowSink) -> None:
        for txn_id in self.book.take_forgotten():
            self._places.pop(txn_id, None)
            self._ended_at.pop(txn_id, None)
            work.txn_rows[txn_id] = TxnRow(txn_id, None)

    def _restore(self, persisted: Iterable[bytes]) -> None:
        txns: list[tuple[int, Txn]] = []
        for raw in persisted:
            d = json.loads(raw)
            index, slot, position, topic = d["r"]
            txn = Txn(
                d["id"],
                d["g"],
                d["c"],
                MessageRef(index, slot, position, topic, d["q"]),
                d["s"],
                TxnState(d["st"]),
                d["n"],
                d["nc"],
                d["lc"],
                d["e"],
            )
            if d["p"] is not None:
                at, size, tag, keys = d["p"]
                self._places[txn.txn_id] = HalfPlace(at, size, tag, tuple(keys))
            if txn.state is not TxnState.HALF:
                self._ended_at[txn.txn_id] = d["ei"]
            txns.append((d["ei"], txn))
        txns.sort(key=lambda pair: (pair[0], pair[1].txn_id))  # ended in the order they ended
        self.book.restore(txn for _, txn in txns)

    def reload(self, persisted: Iterable[bytes]) -> None:
        """After a failed store write: back to what the store holds (the entries come again)."""
        with self.lock:
            self.book = TransactionBook(self.settings, track_forgotten=True)
            self._places.clear()
            self._ended_at.clear()
            self._restore(persisted)
