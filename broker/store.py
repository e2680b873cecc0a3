"""The lmdb shell: MessageStore keeps what the dispatcher derives (ConsumeQueue, indexes, offsets,
producer table, topics); MessageReader fetches message bytes from the Raft log. It decides nothing,
never copies bodies, never fsyncs: the Raft journal is the truth and dispatch resumes from it."""

from __future__ import annotations

import collections
import functools
import hashlib
import itertools
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from raftmq.broker import cq_rows, retention_store
from raftmq.broker.checked_tables import CheckedEnv, CorruptListener, Table, seal
from raftmq.broker.dispatch import DispatchOutput
from raftmq.broker.errors import (
    DispatchGapError,
    StoreError,
    StoreFullError,
    StoreWriteError,
)
from raftmq.broker.queue_lock import Lease
from raftmq.broker.retention import GroupLoss, QueueCut
from raftmq.broker.rows import BatchOrigin, CQRow, ProducerState, QueueHead
from raftmq.broker.schedule import MessageRef, ScheduleKey
from raftmq.broker.schedule_store import LmdbScheduleIndex, pack_key, pack_ref, unpack_ref
from raftmq.broker.transaction import MOVED_TOPIC
from raftmq.common import produce_chunk
from raftmq.common.group_config import GroupConfig, decode_value, encode_value
from raftmq.common.message import Message, StoredMessage, encode_msg_id
from raftmq.common.produce_chunk import ChunkHeader
from raftmq.common.record_batch import MalformedBatchError, ProduceHeader
from raftmq.common.topic_config import Permission, TopicConfig
from raftmq.raftlog.record import Entry

GIB = 1 << 30
# 2: ConsumeQueue rows per batch (broker/cq_rows.py). 3: their evenly stepped columns stored as
# first + step (flags in the count's high byte); format-2 rows read as they are. 4: every value
# sealed with its checksum (broker/checked_tables.py). A format-2 or -3 store is sealed in place
# on opening (_seal_in_place), then marked 4, so that an older build refuses it.
FORMAT_VERSION = b"4"
_UPGRADES_IN_PLACE = (b"2", b"3")
_META_SEALING = b"sealing"  # while sealing in place: the table and key sealed last (unsealed)
# The format while sealing in place: no build reads it but this one, which resumes the sealing.
_FORMAT_SEALING = b"4-sealing"
SEAL_ROWS_PER_TXN = 10_000  # an upgrade's transactions stay small whatever the store's size

# Big-endian everywhere in keys, so lmdb's byte order is numeric order and a range scan reads
# a queue (or a queue's time index) in order.
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_QUEUE_VALUE = struct.Struct(">QQq")  # next offset, min offset, time index ms
_PRODUCER_HEAD = struct.Struct(">QQB")  # last sequence, last store ts, #recent
_ORIGIN = struct.Struct(">QIQQI")  # first sequence, count, first offset, raft index, slot
_TOPIC_VALUE = struct.Struct(">HHBB")  # read queues, write queues, perm, flags
_BATCH_KEY = struct.Struct(">QI")  # raft index, slot
_BATCH_VALUE = struct.Struct(">IQ")  # queue id, first offset (topic bytes follow)
_KEY_VALUE = struct.Struct(">Q")  # store ts (key text follows, to rule out hash collisions)

_ORDERED, _AUTO_CREATED = 0x01, 0x02
_META_INDEX = b"dispatched_index"
_META_FORMAT = b"format"
_U64_MASK = (1 << 64) - 1
_KEY_HASH_BYTES = 16  # user keys may be long; lmdb keys are at most 511 bytes


@dataclass(frozen=True, slots=True)
class QueueRun:
    """The messages a scan chose of one ConsumeQueue row: some of one stored batch's, in
    position order. Message i is at `positions[i]` of its batch and at queue offset
    first_offset + positions[i]; its record starts at chunk_offsets[i]. Lists, not a CQRow per
    message: a raw pull serves them as they are (RawPart), with no per-message object."""

    topic: str
    queue_id: int
    raft_index: int
    slot: int
    first_offset: int  # queue offset of the batch's position 0
    store_timestamp_ms: int
    positions: list[int]
    chunk_offsets: list[int]
    body_sizes: list[int]
    tag_hashes: list[int]

    def rows(self) -> list[CQRow]:
        return [
            CQRow(
                self.topic,
                self.queue_id,
                self.first_offset + position,
                self.raft_index,
                self.slot,
                position,
                at,
                size,
                tag,
                self.store_timestamp_ms,
            )
            for position, at, size, tag in zip(
                self.positions, self.chunk_offsets, self.body_sizes, self.tag_hashes, strict=True
            )
        ]


@dataclass(frozen=True, slots=True)
class QueueScan:
    """Rows read from a queue, as runs, and the offset to continue from (past rows skipped by a
    filter)."""

    runs: list[QueueRun]
    next_offset: int

    @property
    def rows(self) -> list[CQRow]:
        return [row for run in self.runs for row in run.rows()]


@dataclass(frozen=True, slots=True)
class RawPart:
    """Some messages of one stored produce batch, served as the log holds them: the reader
    decodes them (broker/raw_batch.py), the broker does no per-message work."""

    raft_index: int
    slot: int
    first_offset: int  # queue offset of the batch's position 0
    store_timestamp_ms: int
    chunk: bytes
    positions: list[int]
    byte_offsets: list[int]


@dataclass(frozen=True, slots=True)
class ScrubAt:
    """Where an index scrub goes on: after `key` of table number `table` (None: its start)."""

    table: int
    key: bytes | None


@dataclass(frozen=True, slots=True)
class KeyHit:
    queue_id: int
    queue_offset: int
    store_timestamp_ms: int


@functools.lru_cache(
    maxsize=4096
)  # the dispatcher asks for the same queues' prefixes again and again
def _queue_prefix(topic: str, queue_id: int) -> bytes:
    # Topic names never contain NUL (the dispatcher refuses invalid names), so prefixes of
    # different queues never overlap.
    return topic.encode("utf-8") + b"\0" + _U32.pack(queue_id)


def _seek_row(cur: Any, prefix: bytes, offset: int) -> bool:
    """Put `cur` (on the ConsumeQueue) at the row holding `offset` of the queue with `prefix`,
    else at the queue's first row after it. False when the queue has no row at or after it.
    Rows are per batch (broker/cq_rows.py): the one holding an offset may start before it."""
    plen = len(prefix)
    key = prefix + _U64.pack(offset)
    if cur.set_range(key):
        if cur.key() == key:
            return True
        if not cur.prev():  # the row after is the database's first: nothing before it
            cur.set_range(key)
            return bool(cur.key().startswith(prefix))
    elif not cur.last():
        return False
    before = cur.key()  # the last row before `key`, of this queue or of another
    if (
        before.startswith(prefix)
        and len(before) == plen + 8
        and _U64.unpack_from(before, plen)[0] + cq_rows.count(cur.value()) > offset
    ):
        return True
    if not cur.next():
        return False
    after = cur.key()
    return bool(after.startswith(prefix) and len(after) == plen + 8)


def _key_prefix(topic: str, key: str) -> bytes:
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=_KEY_HASH_BYTES).digest()
    return topic.encode("utf-8") + b"\0" + digest


def _offset_key(group: str, topic: str, queue_id: int) -> bytes:
    # Callers validate queue ids (0..2**31-1); a negative one here is a bug, not input.
    assert 0 <= queue_id <= 0xFFFF_FFFF, f"queue id {queue_id} reached the store"
    return group.encode("utf-8") + b"\0" + topic.encode("utf-8") + b"\0" + _U32.pack(queue_id)


@functools.lru_cache(maxsize=4096)  # three times per idempotent batch in dispatch
def _producer_key(producer_id: str, topic: str, queue_id: int) -> bytes:
    pid = producer_id.encode("utf-8")
    return _U32.pack(len(pid)) + pid + _queue_prefix(topic, queue_id)


def _encode_producer(state: ProducerState) -> bytes:
    head = _PRODUCER_HEAD.pack(
        state.last_sequence, state.last_store_timestamp_ms, len(state.recent)
    )
    pack = _ORIGIN.pack
    return head + b"".join(
        [
            pack(o.first_sequence, o.count, o.first_offset, o.raft_index, o.slot)
            for o in state.recent
        ]
    )


def _decode_producer(value: bytes) -> ProducerState:
    last_seq, last_ts, n = _PRODUCER_HEAD.unpack_from(value, 0)
    recent = tuple(
        BatchOrigin(*_ORIGIN.unpack_from(value, _PRODUCER_HEAD.size + i * _ORIGIN.size))
        for i in range(n)
    )
    return ProducerState(last_seq, last_ts, recent)


def _encode_topic(cfg: TopicConfig) -> bytes:
    flags = (_ORDERED if cfg.ordered else 0) | (_AUTO_CREATED if cfg.auto_created else 0)
    return _TOPIC_VALUE.pack(cfg.read_queue_nums, cfg.write_queue_nums, int(cfg.perm), flags)


def _decode_topic(name: bytes, value: bytes) -> TopicConfig:
    read_n, write_n, perm, flags = _TOPIC_VALUE.unpack(value)
    return TopicConfig(
        name.decode("utf-8"),
        read_n,
        write_n,
        Permission(perm),
        bool(flags & _ORDERED),
        bool(flags & _AUTO_CREATED),
    )


def _seal_in_place(raw_env: Any, tables: Sequence[Table]) -> None:
    """Seal every value of a format-2 or -3 store, SEAL_ROWS_PER_TXN rows a transaction, in
    table then key order. Each transaction records the last row it sealed, so an upgrade cut
    short by a crash resumes after it; the last one marks the store FORMAT_VERSION. The format
    key and that mark stay unsealed (they say how to read the rest)."""
    meta = tables[-1]
    unsealed = (_META_FORMAT, _META_SEALING)
    with raw_env.begin(write=True) as txn:
        mark = txn.get(_META_SEALING, db=meta.handle)
        txn.put(_META_FORMAT, _FORMAT_SEALING, db=meta.handle)  # half sealed: no older build
    at_table, _, after = bytes(mark).partition(b"\0") if mark is not None else (b"", b"", b"")
    names = [t.name.encode() for t in tables]
    start = names.index(at_table) if at_table in names else 0
    for i, table in enumerate(tables[start:], start):
        resume = after if i == start and mark is not None else None
        while True:
            with raw_env.begin(write=True) as txn, txn.cursor(db=table.handle) as cur:
                found = cur.set_range(resume) if resume is not None else cur.first()
                if found and resume is not None and cur.key() == resume:
                    found = cur.next()
                rows: list[tuple[bytes, bytes]] = []
                while found and len(rows) < SEAL_ROWS_PER_TXN:
                    rows.append((bytes(cur.key()), bytes(cur.value())))
                    found = cur.next()
                for key, value in rows:
                    if table is not meta or key not in unsealed:
                        txn.put(key, seal(table, key, value), db=table.handle)
                done = not found
                if done and table is meta:
                    txn.delete(_META_SEALING, db=meta.handle)
                    txn.put(_META_FORMAT, FORMAT_VERSION, db=meta.handle)
                elif rows:
                    resume = rows[-1][0]
                    txn.put(_META_SEALING, table.name.encode() + b"\0" + resume, db=meta.handle)
            if done:
                break


PRODUCER_CACHE_ROWS = 4096  # (producer, topic, queue) rows kept decoded, least recent out
HEAD_CACHE_ROWS = 65_536  # queue heads kept decoded; emptied when it grows past this


class MessageStore:
    """One node's indexes in an lmdb environment. Any thread may read; one thread (the
    dispatcher's) writes. Implements the dispatcher's DispatchState."""

    def __init__(
        self, path: str | Path, *, map_size_bytes: int = 4 * GIB, max_readers: int = 256
    ) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        raw_env = lmdb.open(
            str(self.path),
            map_size=map_size_bytes,
            max_dbs=32,  # room for the lifecycle's tables
            max_readers=max_readers,  # concurrent read transactions: one per reading thread
            sync=False,
            metasync=False,
            readahead=False,  # rows are read by key; readahead wastes page cache on big stores
        )
        self._env = CheckedEnv(raw_env, str(self.path))

        def db(name: bytes) -> Table:
            return Table.open(raw_env, name.decode("ascii"))

        self._cq = db(b"consume_queue")
        self._queues = db(b"queues")
        self._keys = db(b"key_index")
        self._time = db(b"time_index")
        self._offsets = db(b"consumer_offsets")
        self._producers = db(b"producers")
        self._topics = db(b"topics")
        self._batches = db(b"batches")
        self._meta = db(b"meta")
        self._locks = db(b"queue_locks")  # orderly queues' leases: key as offsets', u64 expiry
        # POP consumption (broker/pop_apply.py): (group, topic, queue) keyed as offsets', the
        # encoded state (cursor, deliveries in flight with attempt, token, invisible-until).
        self._pops = db(b"pop_state")
        self._txns = db(b"transactions")  # broker/txn_apply.py: id -> persisted state
        # Consumer groups' configs (common/group_config.py): group name -> the encoded value.
        self._group_configs = db(b"group_configs")
        self._schedule = db(b"schedule")  # delayed messages by (due, location): schedule_store
        # What retention must keep (see _retention_floor), by the raft index pointed into: rows
        # of delivered, committed or moved messages whose bytes sit in an older entry (key:
        # index + queue prefix + the row's offset), scheduled messages (index + schedule key)
        # and open half messages (index + transaction id).
        self._old_refs = db(b"old_refs")
        self._sched_refs = db(b"schedule_refs")
        self._half_refs = db(b"half_refs")
        self._retention = retention_store.Tables(
            self._cq, self._queues, self._keys, self._time, self._offsets, self._producers,
            self._topics, self._batches, self._meta, db(b"retention_bases"),
            # New tables go last: a base from before them is installed with them empty.
            (self._txns, self._old_refs, self._half_refs, self._locks, self._pops,
             self._group_configs),
            (self._schedule, self._sched_refs),
        )  # fmt: skip
        self.cuts_applied: list[retention_store.CutApplied] = []  # by the last apply()
        # The format key is the one value left unsealed: it says how to read the others.
        with raw_env.begin() as raw_txn:
            fmt = raw_txn.get(_META_FORMAT, db=self._meta.handle)
        if fmt in _UPGRADES_IN_PLACE or fmt == _FORMAT_SEALING:
            _seal_in_place(raw_env, self._all_tables())
        elif fmt is None:
            with raw_env.begin(write=True) as new_txn:
                new_txn.put(_META_FORMAT, FORMAT_VERSION, db=self._meta.handle)
        elif fmt != FORMAT_VERSION:
            raw_env.close()
            raise StoreError(
                f"store at {self.path} has format {fmt!r}; this build reads "
                f"{FORMAT_VERSION!r}: delete it and let the dispatcher rebuild it from the log"
            )
        with self._env.begin() as txn:
            raw = txn.get(_META_INDEX, db=self._meta)
        self._dispatched_index = _U64.unpack(raw)[0] if raw is not None else 0
        # The producer table's recent rows as written (issue 14): the dispatcher reads one per
        # idempotent batch, and decoding the row's origins cost ~20-40 us each time. Filled
        # only by apply() after its transaction commits, never by a read (a reader on another
        # thread could otherwise put back a value older than the one just written), so it is
        # the store's content whenever it holds a key. Anything that deletes or rewrites
        # producer rows must go through apply() or clear it.
        self._producer_cache: collections.OrderedDict[bytes, ProducerState] = (
            collections.OrderedDict()
        )
        # Queue heads as apply() wrote them, by the same rule: the dispatcher reads one per
        # produce batch, an lmdb read transaction each time otherwise. Retention changes only
        # a head's min offset, which QueueHead does not carry; install_base clears it.
        self._head_cache: dict[bytes, QueueHead] = {}
        # Every topic's config, as the topics table holds it: the leader asks for a batch's
        # topic on every send (an lmdb read and a decode each, ~10% of the data loop's time in
        # W1). Only apply() and install_base write the table; both update this mirror after
        # their transaction commits. As bounded as the table itself.
        self._topic_cache: dict[str, TopicConfig] = {t.name: t for t in self.topics()}
        # Every group's config, mirrored for the same reason: every pull and send-back asks.
        self._group_config_cache: dict[str, GroupConfig] = self._read_group_configs()

    def _all_tables(self) -> tuple[Table, ...]:
        """Every table, meta last (sealing in place ends with it)."""
        r = self._retention
        return (
            self._cq, self._queues, self._keys, self._time, self._offsets, self._producers,
            self._topics, self._batches, r.bases, *r.lifecycle, *r.unbased, self._meta,
        )  # fmt: skip

    def scrub_step(self, at: ScrubAt | None, max_rows: int) -> tuple[ScrubAt | None, int]:
        """Read and check up to max_rows rows from `at` (None: the first table's start), in
        table then key order, in one read transaction. Returns where to go on (None: the pass
        is over) and how many rows were checked; a bad row raises CorruptRowError (reported)."""
        tables = self._all_tables()
        table, after = (0, None) if at is None else (at.table, at.key)
        checked = 0
        with self._env.begin() as txn:
            while table < len(tables) and checked < max_rows:
                with txn.cursor(db=tables[table]) as cur:
                    found = cur.set_range(after) if after is not None else cur.first()
                    if found and after is not None and cur.key() == after:
                        found = cur.next()
                    while found and checked < max_rows:
                        after = cur.key()
                        if tables[table] is not self._meta or after != _META_FORMAT:
                            cur.value()  # the check: a bad row raises here
                        checked += 1
                        found = cur.next()
                if found:
                    break
                table, after = table + 1, None
        return (ScrubAt(table, after) if table < len(tables) else None), checked

    def report_corrupt_to(self, listener: CorruptListener) -> None:
        """Call `listener` with every row that fails its check, before its reader fails."""
        self._env.on_corrupt = listener

    def close(self) -> None:
        self._env.close()

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writes (the dispatcher thread only) ------------------------------------------------

    @property
    def dispatched_index(self) -> int:
        """The last raft index whose rows are in the store; dispatch resumes after it."""
        return self._dispatched_index

    def apply(self, outputs: DispatchOutput | Iterable[DispatchOutput]) -> None:
        """Write dispatch outputs, in index order and without gaps, in one transaction."""
        batch = [outputs] if isinstance(outputs, DispatchOutput) else list(outputs)
        if not batch:
            return
        index = self._dispatched_index
        cuts: list[retention_store.CutApplied] = []
        # Queue heads and producer rows are last-write-wins per key: within the transaction
        # each key is written once, with its last value (a round of many entries to the same
        # queues writes each head once, not once per entry). Flushed before anything that
        # reads those tables back in the same transaction (a purge, a retention cut).
        heads: dict[bytes, QueueHead] = {}
        producers: dict[bytes, ProducerState] = {}
        try:
            with self._env.begin(write=True) as txn:
                for out in batch:
                    if out.raft_index != index + 1:
                        raise DispatchGapError(index + 1, out.raft_index)
                    self._write(txn, out, heads, producers)
                    if out.retention is not None:
                        self._write_heads(txn, heads, producers)
                        cuts.append(
                            retention_store.apply_record(
                                txn,
                                self._retention,
                                out.raft_index,
                                out.term,
                                out.retention,
                                self._retention_floor(txn, out.retention.cut_index - 1),
                            )
                        )
                    index = out.raft_index
                self._write_heads(txn, heads, producers)
                txn.put(_META_INDEX, _U64.pack(index), db=self._meta)
        except lmdb.MapFullError as exc:
            self._producer_cache.clear()
            self._head_cache.clear()
            raise StoreFullError(
                f"the store at {self.path} is full ({self._env.info()['map_size']} bytes); "
                "restart with a larger map_size_bytes"
            ) from exc
        except (lmdb.Error, OSError) as exc:
            if type(exc) is not lmdb.Error and not isinstance(exc, (lmdb.DiskError, OSError)):
                raise  # lmdb's other typed errors (bad value, corrupt page) are not the disk
            # A full disk reaches here as "mdb_txn_commit: Input/output error"; the aborted
            # transaction left the store as it was.
            self._producer_cache.clear()
            self._head_cache.clear()
            raise StoreWriteError(str(self.path), exc) from exc
        self._dispatched_index = index
        self.cuts_applied = cuts
        # The mirrors, as the committed transaction left the tables: one pass over the outputs
        # (a plain produce entry has heads and producer rows only).
        cache = self._producer_cache
        heads = self._head_cache
        if len(heads) > HEAD_CACHE_ROWS:
            heads.clear()  # bounded; refilled by the next writes
        for out in batch:
            for p in out.producer_rows:
                key = _producer_key(p.producer_id, p.topic, p.queue_id)
                cache[key] = p.state
                cache.move_to_end(key)
            for head in out.queue_heads:
                heads[_queue_prefix(head.topic, head.queue_id)] = head
            if out.topic_rows:
                topics = self._topic_cache
                for row in out.topic_rows:
                    if row.config is None:
                        topics.pop(row.name, None)
                    else:  # as a read of the table would give it
                        name = row.name.encode("utf-8")
                        topics[row.name] = _decode_topic(name, _encode_topic(row.config))
            if out.deleted_groups or out.group_configs:
                group_configs = self._group_config_cache
                for group in out.deleted_groups:
                    group_configs.pop(group, None)
                for cfg in out.group_configs:
                    if cfg.is_default:
                        group_configs.pop(cfg.group, None)
                    else:
                        group_configs[cfg.group] = cfg
        while len(cache) > PRODUCER_CACHE_ROWS:
            cache.popitem(last=False)

    # ---- retention (retention_store.py holds the logic) ----------------------------------------

    @property
    def cut_index(self) -> int:
        """Entries below it are deleted by retention on every replica (0: no cut yet)."""
        with self._env.begin() as txn:
            return retention_store.cut_index(txn, self._retention)

    def retention_floor(self, base_index: int) -> int | None:
        """The floor of a cut right after base_index (see _retention_floor)."""
        with self._env.begin() as txn:
            return self._retention_floor(txn, base_index, write=False)

    def _retention_floor(self, txn: Any, base_index: int, write: bool = True) -> int | None:
        """The oldest raft index that replicated state other than the ConsumeQueue's own
        batches still points into after a cut right after base_index; retention never cuts past
        it (None: nothing does). Scheduled messages and open half messages pin their entries.
        So does a row of a delivered, committed or moved message whose bytes sit in an older
        entry, if the row was written after the base (the cut moves each queue's min offset to
        its next offset at the base, so a row written before it is cut with the rest) and is
        still above its queue's min offset. The tables are replicated: every replica computes
        the same floor at the same index. Dead rows are dropped on the way (in a write)."""
        floors: list[int] = []
        for db in (self._sched_refs, self._half_refs):
            with txn.cursor(db=db) as cur:
                if cur.first():
                    floors.append(_U64.unpack_from(cur.key())[0])
        with txn.cursor(db=self._old_refs) as cur:
            more = cur.first()
            for _ in range(10_000):  # past that, the row at hand is kept as the floor: safe
                if not more:
                    break
                key = bytes(cur.key())
                ref, last = _U64.unpack_from(key)[0], _U64.unpack_from(key, len(key) - 8)[0]
                head = txn.get(key[8:-8], db=self._queues)
                if head is not None and last < _QUEUE_VALUE.unpack(head)[1]:
                    more = cur.delete() if write else cur.next()  # below the min offset: dead
                    continue
                if _U64.unpack(cur.value())[0] > base_index:
                    floors.append(ref)
                    break
                more = cur.next()  # written before the base: the cut takes it away
            else:
                if more:
                    floors.append(_U64.unpack_from(cur.key())[0])
        return min(floors, default=None)

    def preview_cut(self, cut: int) -> tuple[list[QueueCut], list[GroupLoss]] | None:
        """What a cut at `cut` would move and who would lose what (read-only; None: no base)."""
        with self._env.begin() as txn:
            return retention_store.preview_cut(txn, self._retention, cut)

    def base_indexes(self) -> list[int]:
        with self._env.begin() as txn:
            return retention_store.base_indexes(txn, self._retention)

    def base(self, index: int) -> bytes | None:
        with self._env.begin() as txn:
            raw = txn.get(_U64.pack(index), db=self._retention.bases)
        return bytes(raw) if raw is not None else None

    def install_base(self, blob: bytes) -> int:
        """Replace the whole store with a base the leader sent (the dispatcher is paused)."""
        self._producer_cache.clear()  # the producer table is replaced with the base's
        self._head_cache.clear()
        with self._env.begin(write=True) as txn:
            index = retention_store.install(txn, self._retention, blob, _META_INDEX)
        self._dispatched_index = index
        self._topic_cache = {t.name: t for t in self.topics()}
        self._group_config_cache = self._read_group_configs()
        return index

    def rebuild(self) -> tuple[int, int]:
        """Empty every table but for the base the current retention cut stands on (none before
        the first cut), so that dispatch derives the rest from the log again; returns the
        (index, term) dispatch resumes after. The dispatcher must be paused. A bad cut or base
        row raises CorruptRowError and changes nothing: no local rebuild can then be trusted."""
        with self._env.begin() as txn:
            cut = retention_store.cut_index(txn, self._retention)
            blob = txn.get(_U64.pack(cut - 1), db=self._retention.bases) if cut > 0 else None
        if cut > 0 and blob is None:
            raise StoreError(f"store at {self.path}: no base at the cut ({cut - 1}) to rebuild on")
        term = retention_store.decode_base(blob).term if blob is not None else 0
        self._producer_cache.clear()
        self._head_cache.clear()
        with self._env.begin(write=True) as txn:
            for table in self._all_tables():
                txn.drop(table, delete=False)
            txn.raw.put(_META_FORMAT, FORMAT_VERSION, db=self._meta.handle)
            if blob is not None:
                index = retention_store.install(txn, self._retention, blob, _META_INDEX)
            else:
                index = 0
                txn.put(_META_INDEX, _U64.pack(0), db=self._meta)
        self._dispatched_index = index
        self._topic_cache = {t.name: t for t in self.topics()}
        self._group_config_cache = self._read_group_configs()
        return index, term

    def trim_step(self, max_rows: int) -> int:
        """Delete up to max_rows index rows below the retention cut; 0 when none is left."""
        with self._env.begin(write=True) as txn:
            return retention_store.trim_step(txn, self._retention, max_rows)

    def sync(self) -> None:
        """Make every applied transaction durable (the store runs without fsync: retention
        calls this before it deletes journal entries the store can no longer be rebuilt from)."""
        self._env.sync(True)

    def size_bytes(self) -> int:
        """Bytes the lmdb file holds in use (pages up to the last one written)."""
        info, stat = self._env.info(), self._env.stat()
        return int((info["last_pgno"] + 1) * stat["psize"])

    def _write_heads(
        self, txn: Any, heads: dict[bytes, QueueHead], producers: dict[bytes, ProducerState]
    ) -> None:
        """Write the queue heads and producer rows gathered by _write, and forget them."""
        get, put, queues = txn.get, txn.put, self._queues
        for key, head in heads.items():
            # Read, not cached: the min offset is retention's, and this read is where dispatch
            # finds a bad head row itself (tests/broker/test_index_repair.py).
            old = get(key, db=queues)
            min_offset = _QUEUE_VALUE.unpack(old)[1] if old is not None else 0
            put(key, _QUEUE_VALUE.pack(head.next_offset, min_offset, head.time_index_ms), db=queues)
        for key, state in producers.items():
            put(key, _encode_producer(state), db=self._producers)
        heads.clear()
        producers.clear()

    def _write(
        self,
        txn: Any,
        out: DispatchOutput,
        heads: dict[bytes, QueueHead],
        producers: dict[bytes, ProducerState],
    ) -> None:
        """Write one output's rows; its queue heads and producer rows go into `heads` and
        `producers` (written by _write_heads), last value per key."""
        put = txn.put
        pack_u64, pack_cq = _U64.pack, cq_rows.pack
        cq, batches, queues = self._cq, self._batches, self._queues
        for b in out.cq_batches:
            prefix = _queue_prefix(b.topic, b.queue_id)
            first, index, slot = b.first_offset, b.raft_index, b.slot
            # One row per batch (issue 14): its columns as the dispatcher derived them.
            put(
                prefix + pack_u64(first),
                pack_cq(index, slot, 0, b.store_timestamp_ms, b.chunk_offsets, b.body_sizes,
                        b.tag_hashes),
                db=cq,
            )  # fmt: skip
            if index < out.raft_index:  # a commit or move: the bytes are in an older entry
                last = first + len(b.body_sizes) - 1
                put(pack_u64(index) + prefix + pack_u64(last), pack_u64(out.raft_index),
                    db=self._old_refs)  # fmt: skip
            put(
                _BATCH_KEY.pack(index, slot),
                _BATCH_VALUE.pack(b.queue_id, first) + b.topic.encode("utf-8"),
                db=batches,
            )
            if b.keys:  # the key index, from the batch's columns (no KeyRow per key)
                self._write_keys(put, b.topic, b.queue_id, first, b.store_timestamp_ms, b.keys)
        for k in out.loose_key_rows:
            put(
                _key_prefix(k.topic, k.key) + _U32.pack(k.queue_id) + pack_u64(k.queue_offset),
                _KEY_VALUE.pack(k.store_timestamp_ms) + k.key.encode("utf-8"),
                db=self._keys,
            )
        for head in out.queue_heads:
            heads[_queue_prefix(head.topic, head.queue_id)] = head
        for p in out.producer_rows:
            producers[_producer_key(p.producer_id, p.topic, p.queue_id)] = p.state
        if out.purges:  # a purge reads the heads as the entries before it left them
            self._write_heads(txn, heads, producers)
        for topic, queue_id, offset in out.purges:
            key = _queue_prefix(topic, queue_id)
            old = txn.get(key, db=queues)
            if old is None:
                continue  # no message was ever stored there
            nxt, low, time_ms = _QUEUE_VALUE.unpack(old)
            put(key, _QUEUE_VALUE.pack(nxt, min(max(low, offset), nxt), time_ms), db=queues)
        for t in out.time_rows:
            put(
                _queue_prefix(t.topic, t.queue_id) + pack_u64(t.store_timestamp_ms),
                pack_u64(t.queue_offset),
                db=self._time,
            )
        for o in out.offset_rows:
            put(_offset_key(o.group, o.topic, o.queue_id), pack_u64(o.offset), db=self._offsets)
        for group in out.deleted_groups:
            prefix = group.encode("utf-8") + b"\0"  # group\0topic\0queue: this group only
            for db in (self._offsets, self._locks, self._pops):
                with txn.cursor(db=db) as cur:
                    more = cur.set_range(prefix)
                    while more and bytes(cur.key()).startswith(prefix):
                        more = cur.delete()
            txn.delete(group.encode("utf-8"), db=self._group_configs)  # deleteSubGroup's too
        for cfg in out.group_configs:
            if cfg.is_default:  # RocketMQ's defaults are what no row means: keep no row
                txn.delete(cfg.group.encode("utf-8"), db=self._group_configs)
            else:
                put(cfg.group.encode("utf-8"), encode_value(cfg), db=self._group_configs)
        for t_row in out.txn_rows:
            tid = t_row.txn_id.encode("utf-8")
            if t_row.value is None:
                txn.delete(tid, db=self._txns)
            else:
                put(tid, t_row.value, db=self._txns)
            if t_row.open_half_index is not None:
                put(pack_u64(t_row.open_half_index) + tid, b"", db=self._half_refs)
            elif t_row.ref_index:
                txn.delete(pack_u64(t_row.ref_index) + tid, db=self._half_refs)
        if out.loose_rows:
            self._write_loose(txn, out.loose_rows)
            for r in out.loose_rows:
                if r.raft_index < out.raft_index:
                    key = _queue_prefix(r.topic, r.queue_id) + pack_u64(r.queue_offset)
                    put(pack_u64(r.raft_index) + key, pack_u64(out.raft_index), db=self._old_refs)
        for e in out.schedule_puts:
            put(pack_key(e.key), pack_ref(e.ref), db=self._schedule)
            put(pack_u64(e.ref.raft_index) + pack_key(e.key), b"", db=self._sched_refs)
        for due in out.schedule_deletes:
            ref = txn.pop(pack_key(due), db=self._schedule)
            if ref is not None:
                txn.delete(
                    pack_u64(unpack_ref(ref).raft_index) + pack_key(due), db=self._sched_refs
                )
        for lock in out.lock_rows:
            key = _offset_key(lock.group, lock.topic, lock.queue_id)
            if lock.lease is None:
                txn.delete(key, db=self._locks)
            else:
                value = pack_u64(lock.lease.expires_ms) + lock.lease.client_id.encode("utf-8")
                put(key, value, db=self._locks)
        for pop in out.pop_rows:
            put(_offset_key(pop.group, pop.topic, pop.queue_id), pop.value, db=self._pops)
        for row in out.topic_rows:
            name = row.name.encode("utf-8")
            if row.config is None:
                txn.delete(name, db=self._topics)
            else:
                put(name, _encode_topic(row.config), db=self._topics)

    def _write_keys(
        self,
        put: Callable[..., bool],
        topic: str,
        queue_id: int,
        first: int,
        store_timestamp_ms: int,
        keys: tuple[tuple[str, ...], ...],
    ) -> None:
        """Key index rows of one batch: message i's keys at offset first + i (CQBatch.key_rows
        without a KeyRow per key)."""
        queue = _U32.pack(queue_id)
        ts = _KEY_VALUE.pack(store_timestamp_ms)
        for i, message_keys in enumerate(keys):
            for key in message_keys:
                put(
                    _key_prefix(topic, key) + queue + _U64.pack(first + i),
                    ts + key.encode("utf-8"),
                    db=self._keys,
                )

    def _write_loose(self, txn: Any, rows: Sequence[CQRow]) -> None:
        """Rows of delivered delayed messages, each on its own (positions need not be 0..n-1).
        The batch entry lets a message id find its row: exact for a one-message batch, the
        usual delayed send."""
        for r in rows:
            txn.put(
                _queue_prefix(r.topic, r.queue_id) + _U64.pack(r.queue_offset),
                cq_rows.pack(
                    r.raft_index,
                    r.slot,
                    r.position,
                    r.store_timestamp_ms,
                    (r.chunk_offset_bytes,),
                    (r.body_bytes,),
                    (r.tag_hash,),
                ),
                db=self._cq,
            )
            txn.put(
                _BATCH_KEY.pack(r.raft_index, r.slot),
                # Modulo 2**64: a row at offset 0 with position 1 has "first offset" -1.
                _BATCH_VALUE.pack(r.queue_id, (r.queue_offset - r.position) & _U64_MASK)
                + r.topic.encode(),
                db=self._batches,
            )

    # ---- the dispatcher's view (DispatchState) ------------------------------------------------

    def schedule_ref(self, key: ScheduleKey) -> MessageRef | None:
        with self._env.begin() as txn:
            raw = txn.get(pack_key(key), db=self._schedule)
        return unpack_ref(raw) if raw is not None else None

    def schedule_index(self) -> LmdbScheduleIndex:
        """The schedule for the leader's delivery loop (reads; apply writes it)."""
        return LmdbScheduleIndex(self._env, self._schedule)

    def queue_head(self, topic: str, queue_id: int) -> QueueHead | None:
        key = _queue_prefix(topic, queue_id)
        cached = self._head_cache.get(key)
        if cached is not None:
            return cached
        with self._env.begin() as txn:
            raw = txn.get(key, db=self._queues)
        if raw is None:
            return None
        next_offset, _, time_ms = _QUEUE_VALUE.unpack(raw)
        return QueueHead(topic, queue_id, next_offset, time_ms)

    def producer_state(self, producer_id: str, topic: str, queue_id: int) -> ProducerState | None:
        key = _producer_key(producer_id, topic, queue_id)
        cached = self._producer_cache.get(key)
        if cached is not None:
            return cached
        with self._env.begin() as txn:
            raw = txn.get(key, db=self._producers)
        return _decode_producer(raw) if raw is not None else None

    def topic(self, name: str) -> TopicConfig | None:
        return self._topic_cache.get(name)

    def queue_lease(self, group: str, topic: str, queue_id: int) -> Lease | None:
        with self._env.begin() as txn:
            raw = txn.get(_offset_key(group, topic, queue_id), db=self._locks)
        if raw is None:
            return None
        return Lease(bytes(raw[8:]).decode("utf-8"), _U64.unpack_from(raw)[0])

    def pop_state(self, group: str, topic: str, queue_id: int) -> bytes | None:
        """A queue's encoded POP state (broker/pop_apply.py); None if the group never popped it."""
        with self._env.begin() as txn:
            raw = txn.get(_offset_key(group, topic, queue_id), db=self._pops)
        return bytes(raw) if raw is not None else None

    # ---- reads (any thread) ------------------------------------------------------------------

    def transaction_values(self) -> list[bytes]:
        """Every persisted transaction (broker/txn_apply.py restores the table from them)."""
        with self._env.begin() as txn:
            return [bytes(v) for _, v in txn.cursor(db=self._txns)]

    def group_config(self, group: str) -> GroupConfig:
        """The group's config here; RocketMQ's defaults for a group never configured."""
        cfg = self._group_config_cache.get(group)
        return cfg if cfg is not None else GroupConfig(group)

    def group_config_count(self) -> int:
        return len(self._group_config_cache)

    def group_configs(self) -> list[GroupConfig]:
        """Every group configured here, by name (as bounded as the table: an admin's rows)."""
        return sorted(self._group_config_cache.values(), key=lambda c: c.group)

    def _read_group_configs(self) -> dict[str, GroupConfig]:
        with self._env.begin() as txn:
            return {
                (name := bytes(k).decode("utf-8")): decode_value(name, bytes(v))
                for k, v in txn.cursor(db=self._group_configs)
            }

    def topics(self) -> list[TopicConfig]:
        with self._env.begin() as txn:
            return [_decode_topic(k, v) for k, v in txn.cursor(db=self._topics)]

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min offset, max offset exclusive); (0, 0) for a queue that never had a message."""
        with self._env.begin() as txn:
            raw = txn.get(_queue_prefix(topic, queue_id), db=self._queues)
        if raw is None:
            return (0, 0)
        next_offset, min_offset, _ = _QUEUE_VALUE.unpack(raw)
        return (min_offset, next_offset)

    def read_queue(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        tag_hashes: Iterable[int] | None = None,
    ) -> list[CQRow]:
        """Up to max_count rows from `offset` on, in offset order; with `tag_hashes`, only rows
        whose tag hash is one of them (the broker-side half of RocketMQ's tag filter)."""
        return self.scan_queue(topic, queue_id, offset, max_count, tag_hashes).rows

    def scan_queue(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        tag_hashes: Iterable[int] | None = None,
        *,
        max_scan_rows: int = 16_000,
    ) -> QueueScan:
        """read_queue plus where to continue: a filter may skip many rows, so the scan stops
        after max_scan_rows rows (RocketMQ's maxFilterMessageCount) and says where it got to."""
        if max_count <= 0 or max_scan_rows <= 0:
            raise ValueError("max_count and max_scan_rows must be positive")
        wanted = frozenset(tag_hashes) if tag_hashes is not None else None
        prefix = _queue_prefix(topic, queue_id)
        plen = len(prefix)
        runs: list[QueueRun] = []
        next_offset = max(offset, 0)
        scanned = taken = 0
        unpack_u64, row_head, row_columns = _U64.unpack_from, cq_rows.head, cq_rows.columns
        with self._env.begin() as txn, txn.cursor(db=self._cq) as cur:
            if not _seek_row(cur, prefix, next_offset):
                return QueueScan(runs, next_offset)
            for key, value in cur.iternext():
                if not key.startswith(prefix) or len(key) != plen + 8:
                    break
                (first,) = unpack_u64(key, plen)
                index, slot, position, ts, n = row_head(value)
                start = max(next_offset - first, 0)
                # Only the messages this scan can still look at (rows may hold thousands).
                left = max_scan_rows - scanned
                if wanted is None:
                    left = min(left, max_count - taken)
                stop = min(n, start + left)
                if stop <= start:
                    break
                ats, sizes, tags = row_columns(value, n, start, stop)
                if wanted is None:  # every message looked at is taken: no loop per message
                    looked = stop - start
                    positions = list(range(position + start, position + stop))
                    kept_ats, kept_sizes, kept_tags = list(ats), list(sizes), list(tags)
                else:
                    looked = 0
                    picked: list[int] = []
                    for j, tag in enumerate(tags):
                        looked = j + 1
                        if tag in wanted:
                            picked.append(j)
                            if taken + len(picked) >= max_count:
                                break
                        if scanned + looked >= max_scan_rows:
                            break
                    positions = [position + start + j for j in picked]
                    kept_ats = [ats[j] for j in picked]
                    kept_sizes = [sizes[j] for j in picked]
                    kept_tags = [tags[j] for j in picked]
                run = QueueRun(
                    topic,
                    queue_id,
                    index,
                    slot,
                    first - position,
                    ts,
                    positions,
                    kept_ats,
                    kept_sizes,
                    kept_tags,
                )
                scanned += looked
                taken += len(run.positions)
                next_offset = first + start + looked
                if run.positions:
                    runs.append(run)
                if taken >= max_count or scanned >= max_scan_rows:
                    break
        return QueueScan(runs, next_offset)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset whose store time is >= timestamp_ms (RocketMQ's searchOffset).
        Before the first message: the queue's min offset. After the last: the max offset
        (exclusive), where the next message will go. An empty queue: its min (== max).
        Store times are taken as made monotonic per queue by the dispatcher."""
        low, high = self.queue_bounds(topic, queue_id)
        if low == high:
            return low
        with self._env.begin() as txn, txn.cursor(db=self._time) as cur:
            prefix = _queue_prefix(topic, queue_id)
            if not cur.set_range(prefix + _U64.pack(max(timestamp_ms, 0))):
                return high
            key = cur.key()
            if not key.startswith(prefix):
                return high
            found: int = _U64.unpack(cur.value())[0]
        return min(max(found, low), high)

    def lookup_key(
        self,
        topic: str,
        key: str,
        max_count: int,
        *,
        begin_ms: int | None = None,
        end_ms: int | None = None,
    ) -> list[KeyHit]:
        """Messages of `topic` carrying `key`, by (queue id, offset), optionally only those
        stored within [begin_ms, end_ms]."""
        prefix = _key_prefix(topic, key)
        plen = len(prefix)
        key_b = key.encode("utf-8")
        hits: list[KeyHit] = []
        with self._env.begin() as txn, txn.cursor(db=self._keys) as cur:
            if not cur.set_range(prefix):
                return hits
            for k, v in cur.iternext():
                if len(hits) >= max_count or not k.startswith(prefix):
                    break
                if v[_KEY_VALUE.size :] != key_b:
                    continue  # a hash collision with another key
                (ts,) = _KEY_VALUE.unpack_from(v)
                if (begin_ms is not None and ts < begin_ms) or (end_ms is not None and ts > end_ms):
                    continue
                queue_id = _U32.unpack_from(k, plen)[0]
                offset = _U64.unpack_from(k, plen + 4)[0]
                head = txn.get(_queue_prefix(topic, queue_id), db=self._queues)
                if head is not None and offset < _QUEUE_VALUE.unpack(head)[1]:
                    continue  # deleted by retention (key rows are not swept)
                hits.append(KeyHit(queue_id, offset, ts))
        return hits

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """The group's committed offset for the queue; None if it never committed one."""
        with self._env.begin() as txn:
            raw = txn.get(_offset_key(group, topic, queue_id), db=self._offsets)
        return _U64.unpack(raw)[0] if raw is not None else None

    def group_offset_count(self, group: str, limit: int = 1_000_000) -> int:
        """How many committed offsets `group` has here (at most `limit` counted)."""
        prefix = group.encode("utf-8") + b"\0"
        n = 0
        with self._env.begin() as txn, txn.cursor(db=self._offsets) as cur:
            more = cur.set_range(prefix)
            while more and n < limit and bytes(cur.key()).startswith(prefix):
                n += 1
                more = cur.next()
        return n

    def committed_offsets_of(
        self, group: str, queues: Sequence[tuple[str, int]]
    ) -> list[int | None]:
        """`committed_offset` of each (topic, queue id), read in one transaction."""
        with self._env.begin() as txn:
            raws = [txn.get(_offset_key(group, t, q), db=self._offsets) for t, q in queues]
        return [_U64.unpack(raw)[0] if raw is not None else None for raw in raws]

    def committed_offsets(self, group: str, topic: str) -> dict[int, int]:
        prefix = group.encode("utf-8") + b"\0" + topic.encode("utf-8") + b"\0"
        out: dict[int, int] = {}
        with self._env.begin() as txn, txn.cursor(db=self._offsets) as cur:
            if not cur.set_range(prefix):
                return out
            for k, v in cur.iternext():
                if not k.startswith(prefix) or len(k) != len(prefix) + 4:
                    break
                out[_U32.unpack_from(k, len(prefix))[0]] = _U64.unpack(v)[0]
        return out

    def producer_rows(
        self, max_rows: int, topic: str = ""
    ) -> tuple[list[tuple[str, str, int, ProducerState]], bool]:
        """(producer id, topic, queue id, state) of the producer table in key order, at most
        `max_rows` (of `topic` only, when given); True when more rows were left."""
        out: list[tuple[str, str, int, ProducerState]] = []
        with self._env.begin() as txn, txn.cursor(db=self._producers) as cur:
            for k, v in cur.iternext():
                n = _U32.unpack_from(k)[0]
                pid, rest = k[4 : 4 + n], k[4 + n :]
                name = rest[:-5].decode("utf-8", "replace")
                if topic and name != topic:
                    continue
                if len(out) >= max_rows:
                    return out, True
                state = _decode_producer(v)
                out.append((pid.decode("utf-8", "replace"), name, _U32.unpack(rest[-4:])[0], state))
        return out, False

    def all_committed_offsets(self, max_rows: int) -> list[tuple[str, str, int, int]]:
        """(group, topic, queue id, offset) of every committed offset, in key order, at most
        `max_rows` (metrics and the admin's group list read this; the bound keeps a scrape
        short on a broker with very many groups)."""
        out: list[tuple[str, str, int, int]] = []
        with self._env.begin() as txn, txn.cursor(db=self._offsets) as cur:
            for k, v in cur.iternext():
                if len(out) >= max_rows:
                    break
                head, queue = k[:-4], k[-4:]
                group, _, topic = head[:-1].partition(b"\0")
                out.append(
                    (
                        group.decode("utf-8", "replace"),
                        topic.decode("utf-8", "replace"),
                        _U32.unpack(queue)[0],
                        _U64.unpack(v)[0],
                    )
                )
        return out

    def cq_row_at(self, raft_index: int, slot: int, position: int) -> CQRow | None:
        """The ConsumeQueue row of the message at (raft index, slot, position), i.e. the one a
        message id names; None if no appended batch is there."""
        with self._env.begin() as txn:
            raw = txn.get(_BATCH_KEY.pack(raft_index, slot), db=self._batches)
            if raw is None:
                return None
            queue_id, first = _BATCH_VALUE.unpack_from(raw)
            topic = raw[_BATCH_VALUE.size :].decode("utf-8")
            prefix = _queue_prefix(topic, queue_id)
            offset = (first + position) & _U64_MASK  # see _write_loose
            with txn.cursor(db=self._cq) as cur:
                found = _seek_row(cur, prefix, offset)
                row_key, value = (bytes(cur.key()), bytes(cur.value())) if found else (b"", b"")
            head = txn.get(prefix, db=self._queues)
        if not found or not row_key.startswith(prefix) or len(row_key) != len(prefix) + 8:
            return None
        if head is not None and offset < _QUEUE_VALUE.unpack(head)[1]:
            return None  # deleted by retention, its row not trimmed yet
        row_first = _U64.unpack_from(row_key, len(prefix))[0]
        index, row_slot, first_position, ts, n, cols = cq_rows.unpack(value)
        i = offset - row_first
        if not 0 <= i < n or (index, row_slot, first_position + i) != (raft_index, slot, position):
            return None  # the position is past the end of that batch
        return CQRow(
            topic, queue_id, offset, index, row_slot, first_position + i, cols[i], cols[n + i],
            cols[2 * n + i], ts,
        )  # fmt: skip


class MessageReader:
    """Turns ConsumeQueue rows into messages by reading their entries from the replicated log.
    Within one call each entry is read once and each batch header parsed once; each message is
    decoded alone, from the byte offset its row keeps, so a pull of 32 messages from a batch of
    1000 decodes 32. Nothing is cached between calls (memory stays bounded)."""

    def __init__(self, broker_group: str, read_entry: Callable[[int], Entry]) -> None:
        self.broker_group = broker_group
        self._read_entry = read_entry

    def read(self, rows: Sequence[CQRow]) -> list[StoredMessage]:
        entries: dict[int, Entry] = {}
        headers: dict[tuple[int, int], tuple[bytes, ChunkHeader]] = {}
        strings: dict[bytes, str] = {}  # tags and hosts repeat: decode each once per call
        out: list[StoredMessage] = []
        # Rows of one batch are decoded together (a v2 batch walks its table once per run).
        for (index, slot), run in itertools.groupby(rows, key=_chunk_of):
            group = list(run)
            key = (index, slot)
            cached = headers.get(key)
            if cached is None:
                entry = entries.get(index)
                if entry is None:
                    entry = entries[index] = self._read_entry(index)
                cached = headers[key] = self._header(entry, group[0])
            chunk, header = cached
            for row in group:
                if row.position >= header.count:
                    raise StoreError(
                        f"{row} points past the end of its {header.count}-message batch"
                    )
            try:
                messages = produce_chunk.messages_at(
                    chunk,
                    header,
                    [r.position for r in group],
                    [r.chunk_offset_bytes for r in group],
                    strings,
                )
            except MalformedBatchError as exc:
                raise StoreError(f"{group[0]} points at an undecodable message: {exc}") from exc
            v2 = not isinstance(header, ProduceHeader)
            for row, msg in zip(group, messages, strict=True):
                # The row and the log must agree; if not, the store is wrong and nothing is
                # served. (A v2 row keeps the record's size, a v1 row the body's.)
                size = row.body_bytes if v2 else len(msg.body)
                if size != row.body_bytes:
                    raise StoreError(f"{row} does not match the message in the log")
                out.append(
                    StoredMessage(
                        msg,
                        self.broker_group,
                        row.queue_id,
                        row.queue_offset,
                        encode_msg_id(self.broker_group, row.raft_index, row.slot, row.position),
                        row.store_timestamp_ms,
                        row.raft_index,
                        row.slot,
                        row.position,
                    )
                )
        return out

    def raw_parts(
        self,
        runs: Sequence[QueueRun],
        max_bytes: int,
        keep: Callable[[Message], bool] | None = None,
    ) -> tuple[list[RawPart], int | None]:
        """The runs' messages as parts of their stored batches, in order, while the chunks fit
        in max_bytes (at least one). `keep` (a property filter) decodes each message to test
        it. Returns the parts and the offset of the first message left out (None: all were
        used). Work per run, not per message, unless `keep` decodes."""
        entries: dict[int, Entry] = {}
        parts: list[RawPart] = []
        strings: dict[bytes, str] = {}  # for `keep`'s decoding: tags and hosts repeat
        total = 0
        cur: RawPart | None = None
        header: ChunkHeader | None = None
        for run in runs:
            # A delivered delayed message's run is alone (its position is not its offset's).
            if (
                cur is None
                or (cur.raft_index, cur.slot) != (run.raft_index, run.slot)
                or cur.first_offset != run.first_offset
                or cur.store_timestamp_ms != run.store_timestamp_ms
            ):
                entry = entries.get(run.raft_index)
                if entry is None:
                    entry = entries[run.raft_index] = self._read_entry(run.raft_index)
                chunk, header = self._header(entry, run)
                if parts and total + len(chunk) > max_bytes:
                    return [p for p in parts if p.positions], run.first_offset + run.positions[0]
                total += len(chunk)
                cur = RawPart(
                    run.raft_index,
                    run.slot,
                    run.first_offset,
                    run.store_timestamp_ms,
                    chunk,
                    [],
                    [],
                )
                parts.append(cur)
            assert header is not None
            if run.positions[-1] >= header.count:  # (positions ascend)
                raise StoreError(
                    f"{run.rows()[-1]} points past the end of its {header.count}-message batch"
                )
            if keep is None:
                cur.positions.extend(run.positions)
                cur.byte_offsets.extend(run.chunk_offsets)
                continue
            for position, at, m in zip(
                run.positions,
                run.chunk_offsets,
                self._decode_run(run, cur.chunk, header, strings),
                strict=True,
            ):
                if keep(m):
                    cur.positions.append(position)
                    cur.byte_offsets.append(at)
        return [p for p in parts if p.positions], None

    @staticmethod
    def _decode_run(
        run: QueueRun, chunk: bytes, header: ChunkHeader, strings: dict[bytes, str]
    ) -> list[Message]:
        """The run's messages, decoded together (one walk of a v2 table)."""
        try:
            return produce_chunk.messages_at(
                chunk, header, run.positions, run.chunk_offsets, strings
            )
        except MalformedBatchError as exc:
            raise StoreError(f"{run.rows()[0]} points at an undecodable message: {exc}") from exc

    @staticmethod
    def _header(entry: Entry, row: CQRow | QueueRun) -> tuple[bytes, ChunkHeader]:
        if entry.index != row.raft_index or row.slot >= len(entry.chunks):
            raise StoreError(f"{row} points at a missing chunk of entry {entry.index}")
        chunk = entry.chunks[row.slot]
        try:
            header = produce_chunk.read_header(chunk)
        except MalformedBatchError as exc:
            raise StoreError(f"{row} points at a chunk that is not a produce batch: {exc}") from exc
        if row.topic not in (header.topic, MOVED_TOPIC):
            # (A half message moved after max checks is indexed under MOVED_TOPIC in place.)
            raise StoreError(f"{row} points at a batch for topic {header.topic!r}")
        if header.queue_id != row.queue_id:
            raise StoreError(f"{row} points at a batch for queue {header.queue_id}")
        return chunk, header


def _chunk_of(row: CQRow) -> tuple[int, int]:
    return row.raft_index, row.slot
