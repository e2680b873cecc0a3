"""The schedule of delayed messages on disk: an lmdb ScheduleIndex (broker/schedule.py) ordered by
(due_ms, seq), where seq names the stored message (raft index, slot, position). Written only by
the dispatcher, in the transaction that records the dispatched index; read by the leader's
delivery loop. Holds locations and row data, never message bytes."""

from __future__ import annotations

import struct
from typing import Any

from raftmq.broker.schedule import MessageRef, ScheduleEntry, ScheduleKey

# Key: big-endian due ms (u64) then seq (u128 = raft index u64, slot u32, position u32), so
# lmdb's byte order is due order and every key is unique and the same on every replica.
_KEY = struct.Struct(">QQII")
# Value: raft index, slot, position, queue id, chunk offset, body bytes, tag hash; the topic
# follows, then the message's keys, each after a NUL (neither topics nor keys may hold control
# characters, and a value written before keys were kept simply has none).
_VALUE = struct.Struct(">QIIIIIQ")
_SEP = b"\0"
KEY_BYTES = _KEY.size


def schedule_key(due_ms: int, raft_index: int, slot: int, position: int) -> ScheduleKey:
    """The key of the message stored at (raft_index, slot, position), due at due_ms."""
    return ScheduleKey(due_ms, (raft_index << 64) | (slot << 32) | position)


def location(key: ScheduleKey) -> tuple[int, int, int]:
    """(raft index, slot, position) of the message a key names."""
    return key.seq >> 64, (key.seq >> 32) & 0xFFFF_FFFF, key.seq & 0xFFFF_FFFF


def pack_key(key: ScheduleKey) -> bytes:
    raft_index, slot, position = location(key)
    return _KEY.pack(key.due_ms, raft_index, slot, position)


def unpack_key(raw: bytes) -> ScheduleKey:
    due, raft_index, slot, position = _KEY.unpack(raw)
    return schedule_key(due, raft_index, slot, position)


def pack_ref(ref: MessageRef) -> bytes:
    return _VALUE.pack(
        ref.raft_index,
        ref.slot,
        ref.position,
        ref.queue_id,
        ref.chunk_offset_bytes,
        ref.body_bytes,
        ref.tag_hash,
    ) + _SEP.join((ref.topic.encode("utf-8"), *(k.encode("utf-8") for k in ref.keys)))


def unpack_ref(raw: bytes) -> MessageRef:
    raft_index, slot, position, queue_id, at, size, tag = _VALUE.unpack_from(raw)
    topic, *keys = bytes(raw[_VALUE.size :]).decode("utf-8").split("\0")
    return MessageRef(raft_index, slot, position, topic, queue_id, at, size, tag, tuple(keys))


class LmdbScheduleIndex:
    """ScheduleIndex over one lmdb database. Reads open their own read transaction; `put` and
    `delete` write in their own transaction (tests, tools): the dispatcher writes through
    MessageStore.apply instead, with the dispatched index."""

    def __init__(self, env: Any, db: Any) -> None:
        self._env = env
        self._db = db

    def put(self, key: ScheduleKey, ref: MessageRef) -> None:
        with self._env.begin(write=True) as txn:
            old = txn.get(pack_key(key), db=self._db)
            if old is not None:
                if unpack_ref(old) != ref:
                    raise ValueError(f"schedule key {key} already holds {unpack_ref(old)}")
                return
            txn.put(pack_key(key), pack_ref(ref), db=self._db)

    def get(self, key: ScheduleKey) -> MessageRef | None:
        with self._env.begin() as txn:
            raw = txn.get(pack_key(key), db=self._db)
        return unpack_ref(raw) if raw is not None else None

    def scan_due(self, upto_ms: int, limit: int) -> list[ScheduleEntry]:
        return self.scan_after(None, upto_ms, limit)

    def scan_after(
        self, after: ScheduleKey | None, upto_ms: int, limit: int
    ) -> list[ScheduleEntry]:
        out: list[ScheduleEntry] = []
        if limit <= 0:
            return out
        with self._env.begin() as txn, txn.cursor(db=self._db) as cur:
            if after is None:
                found = cur.first()
            else:
                start = pack_key(after)
                found = cur.set_range(start)
                if found and cur.key() == start:
                    found = cur.next()
            while found:
                key = unpack_key(cur.key())
                if key.due_ms > upto_ms:
                    break
                out.append(ScheduleEntry(key, unpack_ref(cur.value())))
                if len(out) >= limit:
                    break
                found = cur.next()
        return out

    def delete(self, key: ScheduleKey) -> MessageRef | None:
        with self._env.begin(write=True) as txn:
            raw = txn.pop(pack_key(key), db=self._db)
        return unpack_ref(raw) if raw is not None else None

    def first_due_ms(self) -> int | None:
        with self._env.begin() as txn, txn.cursor(db=self._db) as cur:
            if not cur.first():
                return None
            due: int = _KEY.unpack(cur.key())[0]
            return due

    def count(self) -> int:
        with self._env.begin() as txn:
            n: int = txn.stat(self._db)["entries"]
            return n
