"""Checked lmdb tables: every value the store writes carries a CRC-32C of its table's name, its
key and itself, checked on every read, so a flipped byte in a key or a value (a well-formed one
too: a raft index turned into another batch's) is a CorruptRowError, never a row. Holds the
sealing and the wrappers only; it never repairs, retries or decides what a bad row means.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import crc32c

from raftmq.broker.errors import CorruptRowError

_CRC = struct.Struct(">I")
SEAL_BYTES = _CRC.size
MAX_KEY_SHOWN = 64  # bytes of a bad row's key in its report (lmdb keys reach 511)


@dataclass(frozen=True, slots=True)
class Table:
    """One lmdb database and the name its checksums start from: a row copied into another
    table fails its check there."""

    name: str
    handle: Any
    seed: int

    @classmethod
    def open(cls, env: Any, name: str) -> Table:
        return cls(name, env.open_db(name.encode("ascii")), crc32c.crc32c(name.encode() + b"\0"))


_pack_crc = _CRC.pack
_unpack_crc = _CRC.unpack_from
_crc32c = crc32c.crc32c


def _crc(table: Table, key: bytes, value: bytes) -> int:
    # Key and value are each prefixed by the key's length, so (k, v) and (k + v[:1], v[1:])
    # never share a checksum.
    # One call on the joined bytes: rows are tens of bytes, so the call, not the CRC, costs.
    return int(_crc32c(_pack_crc(len(key)) + key + value, table.seed))


def seal(table: Table, key: bytes, value: bytes) -> bytes:
    """`value` as stored: itself, then the checksum over table, key and value (the same bytes
    as _crc's, computed inline: the dispatcher seals every row it writes)."""
    return value + _pack_crc(_crc32c(_pack_crc(len(key)) + key + value, table.seed))


def show_key(key: bytes) -> str:
    """A key as a report shows it: printable bytes as they are, the rest escaped, clipped."""
    text = repr(bytes(key[:MAX_KEY_SHOWN]))[2:-1]
    return text + ("..." if len(key) > MAX_KEY_SHOWN else "")


CorruptListener = Callable[[CorruptRowError], None]


class CheckedEnv:
    """An lmdb environment whose transactions seal what they put and check what they get.
    `on_corrupt` hears every bad row before the reader gets its CorruptRowError."""

    def __init__(self, env: Any, path: str) -> None:
        self.raw = env
        self.path = path
        self.on_corrupt: CorruptListener | None = None

    def begin(self, write: bool = False) -> CheckedTxn:
        return CheckedTxn(self, self.raw.begin(write=write))

    def unseal(self, table: Table, key: bytes, stored: bytes) -> bytes:
        """The value of a stored row, or CorruptRowError (reported first) if it fails its check."""
        n = len(stored) - SEAL_BYTES
        if n >= 0:
            value = bytes(stored[:n])
            if _CRC.unpack_from(stored, n)[0] == _crc(table, bytes(key), value):
                return value
            reason = "checksum mismatch"
        else:
            reason = f"{len(stored)}-byte value, shorter than its checksum"
        exc = CorruptRowError(self.path, table.name, show_key(key), reason)
        if self.on_corrupt is not None:
            self.on_corrupt(exc)
        raise exc

    # Pass-throughs the store's shell needs (sizes, sync, close).
    def info(self) -> Any:
        return self.raw.info()

    def stat(self) -> Any:
        return self.raw.stat()

    def sync(self, force: bool = False) -> None:
        self.raw.sync(force)

    def close(self) -> None:
        self.raw.close()


class CheckedTxn:
    """An lmdb transaction over Tables: values in and out are the callers' own, unsealed."""

    def __init__(self, env: CheckedEnv, txn: Any) -> None:
        self._env = env
        self.raw = txn

    def __enter__(self) -> CheckedTxn:
        self.raw.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.raw.__exit__(*exc)

    def abort(self) -> None:
        self.raw.abort()

    def get(self, key: bytes, *, db: Table) -> bytes | None:
        stored = self.raw.get(key, db=db.handle)
        if stored is None:
            return None
        n = len(stored) - SEAL_BYTES  # unseal's check inline (the dispatcher's head reads)
        if n >= 0:
            value: bytes = stored[:n]
            if _unpack_crc(stored, n)[0] == _crc32c(_pack_crc(len(key)) + key + value, db.seed):
                return value
        return self._env.unseal(db, key, stored)  # reported, then CorruptRowError

    def put(self, key: bytes, value: bytes, *, db: Table) -> bool:
        # seal() inline: one Python call per row the dispatcher writes, not three
        sealed = value + _pack_crc(_crc32c(_pack_crc(len(key)) + key + value, db.seed))
        return bool(self.raw.put(key, sealed, db=db.handle))

    def pop(self, key: bytes, *, db: Table) -> bytes | None:
        stored = self.raw.pop(key, db=db.handle)
        return None if stored is None else self._env.unseal(db, key, stored)

    def delete(self, key: bytes, *, db: Table) -> bool:
        return bool(self.raw.delete(key, db=db.handle))

    def drop(self, db: Table, delete: bool = True) -> None:
        self.raw.drop(db.handle, delete=delete)

    def stat(self, db: Table) -> Any:
        return self.raw.stat(db.handle)

    def cursor(self, *, db: Table) -> CheckedCursor:
        return CheckedCursor(self._env, db, self.raw.cursor(db=db.handle))


class CheckedCursor:
    """An lmdb cursor whose values are checked as they are read (keys are covered by them)."""

    def __init__(self, env: CheckedEnv, table: Table, cur: Any) -> None:
        self._env = env
        self._table = table
        self.raw = cur

    def __enter__(self) -> CheckedCursor:
        self.raw.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.raw.__exit__(*exc)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return self.iternext()

    def key(self) -> bytes:
        return bytes(self.raw.key())

    def value(self) -> bytes:
        raw = self.raw
        return self._env.unseal(self._table, raw.key(), raw.value())

    def set_range(self, key: bytes) -> bool:
        return bool(self.raw.set_range(key))

    def first(self) -> bool:
        return bool(self.raw.first())

    def last(self) -> bool:
        return bool(self.raw.last())

    def next(self) -> bool:
        return bool(self.raw.next())

    def prev(self) -> bool:
        return bool(self.raw.prev())

    def delete(self) -> bool:
        return bool(self.raw.delete())

    def iternext(self) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) from the current row on (from the first if unpositioned), each checked."""
        unseal, table = self._env.unseal, self._table
        for key, stored in self.raw.iternext():
            yield key, unseal(table, key, stored)

    def iterkeys(self) -> Iterator[bytes]:
        """Keys only, unchecked: for callers that only count or locate rows, never serve them."""
        for key in self.raw.iternext(keys=True, values=False):
            yield bytes(key)
