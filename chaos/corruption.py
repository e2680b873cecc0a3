"""Storage faults for the chaos suite (issue 25): one byte of a broker node's files changed under
it while it runs, as a rotten disk sector would: a record in the middle of a sealed journal
segment, or a ConsumeQueue row of its lmdb index (malformed, or well-formed: pointing at another
batch of the same queue). Only files change here: no process, no network, no repair.
"""

from __future__ import annotations

import mmap
import os
import random
import struct
from dataclasses import dataclass
from pathlib import Path

import lmdb

from raftmq.raftlog.journal.segments import IDX_RE, POS, POS_BYTES, segment_name

_U64 = struct.Struct(">Q")
_BATCH = struct.Struct(">QI")  # a ConsumeQueue row's value starts with its raft index and slot
CQ_TABLE = b"consume_queue"


class NothingToCorrupt(Exception):
    """The files hold nothing of the kind yet (no sealed segment, no row in mid-queue)."""


@dataclass(frozen=True, slots=True)
class Flip:
    """What was changed: the file, the byte offset and what it held (for the history)."""

    path: Path
    offset: int
    what: str

    def to_json(self) -> dict[str, object]:
        return {"path": str(self.path), "offset": self.offset, "what": self.what}


def journal_dir(data_dir: Path) -> Path:
    return data_dir / "raft" / "journal"


def store_dir(data_dir: Path) -> Path:
    return data_dir / "store"


def sealed_segments(journal: Path) -> list[int]:
    """First indexes of the durable sealed segments (those with a position index), in order."""
    firsts = []
    for p in journal.iterdir() if journal.is_dir() else ():
        m = IDX_RE.match(p.name)
        if m:
            firsts.append(int(m.group(1)))
    return sorted(firsts)


def flip_sealed_record(journal: Path, rng: random.Random) -> Flip:
    """Flip the middle byte of a record in the middle of the first sealed segment (the largest
    of its middle half, so the byte is well inside it)."""
    firsts = sealed_segments(journal)
    if not firsts:
        raise NothingToCorrupt(f"{journal} has no sealed segment yet")
    seg = journal / segment_name(firsts[0])
    idx = seg.with_suffix(".idx")
    raw = idx.read_bytes()
    positions = [POS.unpack_from(raw, i)[0] for i in range(0, len(raw) - POS_BYTES + 1, POS_BYTES)]
    ends = [*positions[1:], seg.stat().st_size]
    n = len(positions)
    if n < 4:
        raise NothingToCorrupt(f"{seg} holds {n} records")
    middle = range(n // 4, 3 * n // 4)
    k = max(middle, key=lambda i: (ends[i] - positions[i], rng.random()))
    offset = (positions[k] + ends[k]) // 2
    _xor_byte(seg, offset, 0x5A)
    return Flip(seg, offset, f"record {k} of {n} (index {firsts[0] + k}) of a sealed segment")


def flip_index_row(store: Path, topic: str, rng: random.Random, *, well_formed: bool) -> Flip:
    """Change a ConsumeQueue row of `topic` from the middle of its fullest queue, in place in
    the lmdb file. Well-formed: its raft index and slot become another row's (another batch of
    the same queue, the issue's silent wrong data). Malformed: one byte of its columns flipped."""
    env = lmdb.open(str(store), readonly=True, max_dbs=64, lock=True)
    try:
        with env.begin() as txn:
            db = env.open_db(CQ_TABLE, txn=txn, create=False)
            prefix = topic.encode() + b"\0"
            by_queue: dict[bytes, list[tuple[bytes, bytes]]] = {}
            cur = txn.cursor(db=db)
            if cur.set_range(prefix):
                for k, v in cur:
                    if not k.startswith(prefix):
                        break
                    by_queue.setdefault(bytes(k[: len(prefix) + 4]), []).append(
                        (bytes(k), bytes(v))
                    )
    finally:
        env.close()
    rows = max(by_queue.values(), key=len, default=[])
    if len(rows) < 3:
        raise NothingToCorrupt(f"{store}: no queue of {topic} has 3 rows yet")
    i = rng.randrange(1, len(rows) - 1)
    key, value = rows[i]
    path = store / "data.mdb"
    # Copy-on-write leaves stale copies of a leaf page in free pages: every copy of the row's
    # bytes is changed, so the live one is (an lmdb leaf node holds its key, then its value).
    found: list[int] = []
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        at = m.find(key + value)
        while at >= 0:
            found.append(at + len(key))
            at = m.find(key + value, at + 1)
    if not found:
        raise NothingToCorrupt(f"{path}: row {key!r} not found as one run of bytes")
    offset = _U64.unpack_from(key, len(key) - 8)[0]
    if well_formed:
        # The (raft index, slot) of the nearest row naming another batch: two batches of one
        # queue can share an entry, so the previous row's index alone may be this one's.
        here = value[:12]
        other = next(
            (v[:12] for _, v in [*reversed(rows[:i]), *rows[i + 1 :]] if v[:12] != here), None
        )
        if other is None:
            raise NothingToCorrupt(f"{store}: every row of the queue names one batch")
        for at in found:
            _write(path, at, other)
        what = (
            f"row of offset {offset}: (raft index, slot) {_BATCH.unpack(here)} -> "
            f"{_BATCH.unpack(other)} (another batch of the queue), {len(found)} copies"
        )
        return Flip(path, found[0], what)
    byte = rng.randrange(12, len(value) - 4)  # past the raft index and slot, before the seal
    for at in found:
        _write(path, at + byte, bytes([value[byte] ^ 0x10]))
    return Flip(
        path,
        found[0] + byte,
        f"row of offset {offset}: byte {byte} of its value flipped, {len(found)} copies",
    )


def _write(path: Path, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def _xor_byte(path: Path, offset: int, mask: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        (b,) = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([b ^ mask]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)
