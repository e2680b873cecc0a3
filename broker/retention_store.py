"""Retention inside the lmdb store: applying a replicated cut, keeping bases, installing a base
sent by the leader, and deleting index rows below the queues' min offsets in bounded steps.

Called by MessageStore (store.py) inside its transactions; decides nothing that
broker/retention.py does not. A base is the raw rows of the small replicated tables (topics,
consumer offsets, producer table, queue heads), so installing one needs no per-type codec.

A base leaves out the schedule of delayed messages (Tables.unbased), which can hold millions of
rows: a cut stands only on a base whose schedule was empty (every scheduled message pins the
entry holding its bytes, and a delivered one its row's entry, so a cut right after a base that
still had one is refused by the floor), so the only schedule a base could be installed with is
the empty one. The base records how many rows those tables held; a cut on a base with any is
refused and installing one is an error (neither can happen while the floor holds).
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Any

from raftmq.broker import cq_rows
from raftmq.broker.errors import StoreError
from raftmq.broker.retention import (
    GroupLoss,
    QueueCut,
    RetentionRecord,
    bases_to_keep,
    losses,
    new_min_offsets,
)

log = logging.getLogger("broker.retention")

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_QUEUE_VALUE = struct.Struct(">QQq")  # store.py's: next offset, min offset, time index ms
_CQ_INDEX = struct.Struct(">Q")  # the raft index leading a ConsumeQueue row's value
_BASE_HEAD = struct.Struct("<4sIQQI")  # magic, version, base index, base term, sections
_UNBASED_ROWS = struct.Struct("<Q")  # version 2: rows the unbased tables held at the base
_LEN = struct.Struct("<I")
_MAGIC = b"RMQB"
_VERSION = 2
# Version 1 carried the schedule tables among the sections, at these positions; they are read
# and counted as unbased rows (the sections after them keep their order in version 2).
_V1_UNBASED_SECTIONS = (5, 7)
META_CUT = b"retention_cut"
MAX_TOPICS_LOGGED = 10  # per group in the lost-messages line
META_TRIMMED = b"retention_trimmed"  # the cut below which every index row is already deleted


@dataclass(frozen=True, slots=True)
class Tables:
    """The lmdb databases retention touches (MessageStore's handles)."""

    cq: Any
    queues: Any
    keys: Any
    time: Any
    offsets: Any
    producers: Any
    topics: Any
    batches: Any
    meta: Any
    bases: Any
    # The lifecycle's replicated tables (transactions, schedule and what retention must keep):
    # a base carries them too, or a node that installs one would forget them.
    lifecycle: tuple[Any, ...] = ()
    # Replicated tables a base does not carry, only counts (the schedule: see the module doc).
    unbased: tuple[Any, ...] = ()

    def replicated(self) -> tuple[Any, ...]:
        """The small tables a base carries, in a fixed order."""
        return (self.topics, self.offsets, self.producers, self.queues, *self.lifecycle)


@dataclass(frozen=True, slots=True)
class Base:
    index: int
    term: int
    sections: list[list[tuple[bytes, bytes]]]  # the rows of each of Tables.replicated()
    unbased_rows: int  # rows Tables.unbased held at the base (0 for any base a cut stands on)


@dataclass(frozen=True, slots=True)
class CutApplied:
    raft_index: int
    record: RetentionRecord
    cut_index: int  # in force afterwards (unchanged when the record's cut was refused)
    queues: tuple[QueueCut, ...]
    losses: tuple[GroupLoss, ...]
    refused: str = ""


def cut_index(txn: Any, t: Tables) -> int:
    raw = txn.get(META_CUT, db=t.meta)
    return int(_U64.unpack(raw)[0]) if raw is not None else 0


def base_indexes(txn: Any, t: Tables) -> list[int]:
    with txn.cursor(db=t.bases) as cur:
        return [int(_U64.unpack(k)[0]) for k in cur.iterkeys()]


def encode_base(txn: Any, t: Tables, base_index: int, base_term: int) -> bytes:
    unbased = sum(int(txn.stat(db)["entries"]) for db in t.unbased)
    parts = [
        _BASE_HEAD.pack(_MAGIC, _VERSION, base_index, base_term, len(t.replicated())),
        _UNBASED_ROWS.pack(unbased),
    ]
    for db in t.replicated():
        rows = list(txn.cursor(db=db))
        parts.append(_LEN.pack(len(rows)))
        for k, v in rows:
            parts += [_LEN.pack(len(k)), k, _LEN.pack(len(v)), v]
    return b"".join(parts)


def decode_base(blob: bytes) -> Base:
    """The base's index, term and rows of each replicated table; StoreError if damaged."""
    try:
        magic, version, index, term, n = _BASE_HEAD.unpack_from(blob, 0)
        if magic != _MAGIC or version not in (1, _VERSION) or n < 4:
            raise StoreError(f"not a retention base (magic {magic!r}, version {version})")
        pos = _BASE_HEAD.size
        unbased = 0
        if version >= 2:
            (unbased,) = _UNBASED_ROWS.unpack_from(blob, pos)
            pos += _UNBASED_ROWS.size
        sections: list[list[tuple[bytes, bytes]]] = []
        for _ in range(n):
            (count,) = _LEN.unpack_from(blob, pos)
            pos += _LEN.size
            rows = []
            for _ in range(count):
                (klen,) = _LEN.unpack_from(blob, pos)
                key = blob[pos + 4 : pos + 4 + klen]
                pos += 4 + klen
                (vlen,) = _LEN.unpack_from(blob, pos)
                value = blob[pos + 4 : pos + 4 + vlen]
                pos += 4 + vlen
                if len(key) != klen or len(value) != vlen:
                    raise StoreError("retention base truncated")
                rows.append((key, value))
            sections.append(rows)
        if pos != len(blob):
            raise StoreError(f"retention base has {len(blob) - pos} stray bytes")
    except struct.error as exc:
        raise StoreError(f"retention base truncated: {exc}") from exc
    if version == 1:
        unbased = sum(len(sections[i]) for i in _V1_UNBASED_SECTIONS if i < len(sections))
        sections = [rows for i, rows in enumerate(sections) if i not in _V1_UNBASED_SECTIONS]
    return Base(int(index), int(term), sections, int(unbased))


def _heads(rows: list[tuple[bytes, bytes]]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for key, value in rows:
        topic, queue_id = _split_queue_key(key)
        out[topic, queue_id] = int(_QUEUE_VALUE.unpack(value)[0])
    return out


def _split_queue_key(key: bytes) -> tuple[str, int]:
    return key[:-5].decode("utf-8"), int(_U32.unpack_from(key, len(key) - 4)[0])


def _queue_key(topic: str, queue_id: int) -> bytes:
    return topic.encode("utf-8") + b"\0" + _U32.pack(queue_id)


def apply_record(
    txn: Any,
    t: Tables,
    raft_index: int,
    term: int,
    rec: RetentionRecord,
    floor_index: int | None = None,
) -> CutApplied:
    """A RETENTION record at raft_index, on every replica alike: the cut (if it stands right
    after a base this replica keeps, moves forward and does not pass `floor_index`, the oldest
    entry replicated state still points into), then a new base as of raft_index."""
    current = cut_index(txn, t)
    cuts: list[QueueCut] = []
    loss: list[GroupLoss] = []
    refused = ""
    new_cut = current
    if rec.cut_index > current:
        blob = txn.get(_U64.pack(rec.cut_index - 1), db=t.bases)
        if rec.cut_index > raft_index:
            refused = f"cut {rec.cut_index} lies after the record itself"
        elif floor_index is not None and rec.cut_index > floor_index:
            refused = f"entry {floor_index} is still referenced by replicated state"
        elif blob is None:
            refused = f"no base at {rec.cut_index - 1}"
        elif (base := decode_base(blob)).unbased_rows:
            refused = f"the base at {rec.cut_index - 1} was taken with scheduled messages"
        else:
            cuts = new_min_offsets(_bounds(txn, t), _heads(base.sections[3]))
            for c in cuts:
                key = _queue_key(c.topic, c.queue_id)
                nxt, _, time_ms = _QUEUE_VALUE.unpack(txn.get(key, db=t.queues))
                txn.put(key, _QUEUE_VALUE.pack(nxt, c.new_min, time_ms), db=t.queues)
            loss = losses(_committed(txn, t), cuts)
            new_cut = rec.cut_index
            txn.put(META_CUT, _U64.pack(new_cut), db=t.meta)
    txn.put(_U64.pack(raft_index), encode_base(txn, t, raft_index, term), db=t.bases)
    keep = set(bases_to_keep(base_indexes(txn, t), new_cut))
    for b in base_indexes(txn, t):
        if b not in keep:
            txn.delete(_U64.pack(b), db=t.bases)
    return CutApplied(raft_index, rec, new_cut, tuple(cuts), tuple(loss), refused)


def preview_cut(txn: Any, t: Tables, cut: int) -> tuple[list[QueueCut], list[GroupLoss]] | None:
    """What a cut at `cut` would do now, read-only: the queues whose min offset it moves and
    what each group would lose (retention's warning before it deletes). None: no base at
    cut - 1 on this replica (no such cut can stand)."""
    blob = txn.get(_U64.pack(cut - 1), db=t.bases)
    if blob is None:
        return None
    cuts = new_min_offsets(_bounds(txn, t), _heads(decode_base(blob).sections[3]))
    return cuts, losses(_committed(txn, t), cuts)


def _bounds(txn: Any, t: Tables) -> dict[tuple[str, int], tuple[int, int]]:
    """(min offset, next offset) of every queue now."""
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for key, value in txn.cursor(db=t.queues):
        nxt, low, _ = _QUEUE_VALUE.unpack(value)
        out[_split_queue_key(key)] = (int(low), int(nxt))
    return out


def _committed(txn: Any, t: Tables) -> list[tuple[str, str, int, int]]:
    out = []
    for key, value in txn.cursor(db=t.offsets):
        group, topic, rest = key.split(b"\0", 2)
        out.append(
            (
                group.decode("utf-8"),
                topic.decode("utf-8"),
                int(_U32.unpack(rest)[0]),
                int(_U64.unpack(value)[0]),
            )
        )
    return out


def install(txn: Any, t: Tables, blob: bytes, dispatched_key: bytes) -> int:
    """Replace every table with a base sent by the leader: the state as of its index, with the
    cut right after it (queue min offsets = the base's next offsets). Returns the base index."""
    base = decode_base(blob)
    index, sections = base.index, base.sections
    if base.unbased_rows:
        raise StoreError(
            f"the retention base at {index} was taken with {base.unbased_rows} scheduled "
            "messages, which bases do not carry; no cut stands on such a base"
        )
    for db in (t.cq, t.keys, t.time, t.batches, t.bases, *t.replicated(), *t.unbased):
        txn.drop(db, delete=False)
    if len(sections) > len(t.replicated()):
        raise StoreError(
            f"a retention base with {len(sections)} tables; this build keeps "
            f"{len(t.replicated())}: the leader runs a newer version"
        )
    # A base taken by a build before a table was added (the last ones: group configs) carries
    # no section for it; that table was empty then, and stays empty here (dropped above).
    for db, rows in zip(t.replicated(), sections, strict=False):
        for k, v in rows:
            value = v
            if db is t.queues:
                nxt, _, time_ms = _QUEUE_VALUE.unpack(v)
                value = _QUEUE_VALUE.pack(nxt, nxt, time_ms)
            txn.put(k, value, db=db)
    txn.put(_U64.pack(index), blob, db=t.bases)
    txn.put(META_CUT, _U64.pack(index + 1), db=t.meta)
    txn.put(dispatched_key, _U64.pack(index), db=t.meta)
    return index


def trim_step(txn: Any, t: Tables, max_rows: int) -> int:
    """Delete up to max_rows index rows that lie below their queue's min offset (ConsumeQueue,
    time index) or below the cut (batch rows). Key-index rows stay (lookups drop hits below the
    min offset): sweeping them means a scan of the whole key index. Returns how many went."""
    cut = cut_index(txn, t)
    trimmed = txn.get(META_TRIMMED, db=t.meta)
    if cut == 0 or (trimmed is not None and int(_U64.unpack(trimmed)[0]) == cut):
        return 0  # nothing below this cut is left (a full pass found nothing)
    done = 0
    mins = {}
    for key, value in txn.cursor(db=t.queues):
        mins[key] = int(_QUEUE_VALUE.unpack(value)[1])
    for prefix, low in mins.items():
        for db in (t.cq, t.time):
            if done >= max_rows:
                return done
            done += _delete_prefix_rows(
                txn, db, prefix, low, max_rows - done, by_value=db is t.time
            )
    with txn.cursor(db=t.batches) as cur:
        while done < max_rows and cur.first():
            if int(_U64.unpack_from(cur.key(), 0)[0]) >= cut:
                break
            cur.delete()
            done += 1
    if done < max_rows:
        txn.put(META_TRIMMED, _U64.pack(cut), db=t.meta)
    return done


def _delete_prefix_rows(
    txn: Any, db: Any, prefix: bytes, low: int, limit: int, *, by_value: bool
) -> int:
    """Rows of one queue below offset `low`: ConsumeQueue keys end in the offset of the row's
    first message (a row holds a batch: broker/cq_rows.py); time-index rows (keyed by store
    time) carry the offset in their value."""
    n = 0
    plen = len(prefix)
    with txn.cursor(db=db) as cur:
        if not cur.set_range(prefix):
            return 0
        while n < limit:
            key = cur.key()
            if not key.startswith(prefix) or len(key) != plen + 8:
                break
            if by_value:  # a time-index row: the first offset stored from its time on
                offset = _U64.unpack(cur.value())[0]
            else:  # a ConsumeQueue row holds a batch: it goes once all of it is below `low`
                offset = _U64.unpack(key[plen:])[0] + cq_rows.count(cur.value()) - 1
            if offset >= low:
                break
            if not cur.delete():
                break
            n += 1
    return n


def log_cut(node_id: str, applied: CutApplied) -> None:
    """One line per cut and one per group that lost unconsumed messages (on every replica)."""
    if applied.refused:
        log.warning(
            "broker.retention_cut_refused node=%s index=%d cut=%d reason=%s",
            node_id,
            applied.raft_index,
            applied.record.cut_index,
            applied.refused.replace(" ", "_"),
        )
        return
    if applied.record.cut_index == 0 or (not applied.queues and not applied.losses):
        if applied.record.cut_index:
            log.info(
                "broker.retention_cut node=%s index=%d cut=%d queues=0",
                node_id,
                applied.raft_index,
                applied.cut_index,
            )
        return
    log.info(
        "broker.retention_cut node=%s index=%d cut=%d reason=%s queues=%d messages=%d",
        node_id,
        applied.raft_index,
        applied.cut_index,
        applied.record.reason.name.lower(),
        len(applied.queues),
        sum(q.new_min - q.old_min for q in applied.queues),
    )
    by_group: dict[str, list[GroupLoss]] = {}
    for loss in applied.losses:
        by_group.setdefault(loss.group, []).append(loss)
    for group, rows in by_group.items():  # one line per group, whatever its topic count
        topics = ",".join(f"{r.topic}:{r.messages}" for r in rows[:MAX_TOPICS_LOGGED])
        more = f",+{len(rows) - MAX_TOPICS_LOGGED}_more" if len(rows) > MAX_TOPICS_LOGGED else ""
        log.warning(
            "broker.retention_deleted_unconsumed node=%s group=%s lost_messages=%d queues=%d "
            "topics=%s%s: deleted by retention before the group consumed them",
            node_id,
            group,
            sum(r.messages for r in rows),
            sum(r.queues for r in rows),
            topics,
            more,
        )
