"""Test support: an in-process implementation of the committed-log protocol and chunk builders.

A real (if small) log held in a list, not a mock: it hands out Entry values exactly as raftlog's
ReplicatedLog does (dense indexes, control entries with no chunks, at least one entry per read).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from raftmq.common.message import Message
from raftmq.common.record_batch import (
    CommitOffset,
    ProduceBatch,
    ProducerSequence,
    ResetOffsets,
    encode,
)
from raftmq.raftlog.record import Entry


class InProcessLog:
    """Committed entries in memory; `append` commits at once and wakes waiters."""

    def __init__(self, entries: Sequence[Entry] = ()) -> None:
        self._entries: list[Entry] = []
        self._cond = threading.Condition()
        self.reads = 0
        for e in entries:
            self._append_entry(e)

    def _append_entry(self, entry: Entry) -> None:
        with self._cond:
            if entry.index != len(self._entries) + 1:
                raise ValueError(f"entry {entry.index} is not next ({len(self._entries) + 1})")
            self._entries.append(entry)
            self._cond.notify_all()

    def append(self, chunks: Sequence[bytes], term: int = 1) -> Entry:
        entry = Entry(len(self._entries) + 1, term, tuple(chunks))
        self._append_entry(entry)
        return entry

    def append_control(self, term: int = 1) -> Entry:
        return self.append((), term)

    @property
    def committed_index(self) -> int:
        return len(self._entries)

    def wait_committed(self, index: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self._entries) < index:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def read_from(self, start: int, *, max_bytes: int, max_entries: int) -> list[Entry]:
        with self._cond:
            out: list[Entry] = []
            size = 0
            for entry in self._entries[start - 1 : start - 1 + max_entries]:
                n = sum(len(c) for c in entry.chunks)
                if out and size + n > max_bytes:
                    break
                out.append(entry)
                size += n
            return out

    def read(self, index: int) -> Entry:
        self.reads += 1
        with self._cond:
            if not 1 <= index <= len(self._entries):
                raise IndexError(f"index {index} is not committed")
            return self._entries[index - 1]


def msg(
    topic: str, body: bytes = b"x", tags: str | None = None, keys: Sequence[str] = ()
) -> Message:
    return Message(topic, body, tags, tuple(keys), {}, 0, 1_700_000_000_000, "127.0.0.1:1")


def produce(
    topic: str,
    queue_id: int,
    n: int = 1,
    *,
    ts_ms: int = 1_000,
    tags: str | None = None,
    keys: Sequence[str] = (),
    producer: tuple[str, int] | None = None,
    body: bytes = b"hello",
) -> bytes:
    messages = tuple(msg(topic, body + bytes([i % 256]), tags, keys) for i in range(n))
    seq = ProducerSequence(*producer) if producer is not None else None
    return encode(ProduceBatch(topic, queue_id, ts_ms, messages, seq))


def commit(group: str, topic: str, queue_id: int, offset: int) -> bytes:
    return encode(CommitOffset(group, topic, queue_id, offset))


def reset(group: str, topic: str, offsets: dict[int, int]) -> bytes:
    return encode(ResetOffsets(group, topic, offsets))
