"""Exactly-once plan of the raftmq Spark sink: producer ids, queue choice and sequence chunks.

Pure: a Spark task's rows become (queue, first_sequence, messages) chunks, deterministically, so
a replayed task sends the same sequences to the same queues and the broker's idempotent producer
table stores nothing twice. Never does I/O and never depends on timing or arrival of answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from raftmq.client.queue_selector import shard_index
from raftmq.common.types import QueueRef

T = TypeVar("T")

MAX_CHUNK_MESSAGES = 512  # messages per SendMessage: one Raft entry amortises its cost
MAX_CHUNK_BYTES = 1 << 20  # body bytes per SendMessage; well under the broker's wire limit
MAX_PRODUCER_ID_CHARS = 128  # the broker's limit (bytes of UTF-8; ours are ASCII)
_ID_PART = re.compile(r"[^A-Za-z0-9_.-]")


def _part(text: str) -> str:
    return _ID_PART.sub("_", text)


def stream_producer_id(query_id: str, batch_id: int, partition_id: int) -> str:
    """The idempotent producer id of one task of one micro-batch: a replay of the batch (same
    query id, batch id and partition) gets the same id, any other task a different one."""
    if batch_id < 0 or partition_id < 0:
        raise ValueError("batch and partition ids are >= 0")
    pid = f"spark-{_part(query_id)}-b{batch_id}-p{partition_id}"
    if len(pid) > MAX_PRODUCER_ID_CHARS:
        raise ValueError(f"producer id {pid!r} is longer than {MAX_PRODUCER_ID_CHARS}")
    return pid


def job_producer_id(job_id: str, partition_id: int) -> str:
    """The producer id of one task of a batch write (`df.write`): task retries of the same job
    share it; another job never does."""
    if partition_id < 0:
        raise ValueError("partition ids are >= 0")
    pid = f"spark-job-{_part(job_id)}-p{partition_id}"
    if len(pid) > MAX_PRODUCER_ID_CHARS:
        raise ValueError(f"producer id {pid!r} is longer than {MAX_PRODUCER_ID_CHARS}")
    return pid


def queue_indices(
    queue_count: int,
    keys: Sequence[str | None] | None,
    partition_id: int,
    row_numbers: Sequence[int],
) -> list[int]:
    """Each row's index into the topic's sorted publish queues: a keyed row goes where its key
    hashes (ordered per key, as the SDK's sharding key), others round robin by their row number
    in the task, starting at the partition id so that tasks do not all begin on the same queue.
    One hash per distinct key of the call, not one per row."""
    if queue_count < 1:
        raise ValueError("a topic has at least one publish queue")
    out = [(partition_id + r) % queue_count for r in row_numbers]
    if keys is not None:
        hashed: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key:
                at = hashed.get(key)
                if at is None:
                    at = hashed[key] = shard_index(key, queue_count)
                out[i] = at
    return out


def rows_per_queue(
    queue_count: int,
    keys: Sequence[str | None] | None,
    partition_id: int,
    first_row: int,
    positions: Sequence[int],
) -> list[tuple[int, Sequence[int]]]:
    """The batch's positions per queue index (queue_indices' rule, `first_row` the task's row
    number of position 0), in queue index order, for the queues that get any. Without keys,
    over consecutive positions, a queue's positions are every queue_count-th: ranges, no
    Python step per row."""
    if keys is None and isinstance(positions, range) and positions.step == 1:
        out: list[tuple[int, Sequence[int]]] = []
        for qi in range(queue_count):
            # row p goes to (partition_id + first_row + p) % queue_count
            skip = (qi - partition_id - first_row - positions.start) % queue_count
            mine = positions[skip::queue_count]
            if mine:
                out.append((qi, mine))
        return out
    targets = queue_indices(
        queue_count,
        None if keys is None else [keys[p] for p in positions],
        partition_id,
        [first_row + p for p in positions],
    )
    per_queue: dict[int, list[int]] = {}
    for p, qi in zip(positions, targets, strict=True):
        per_queue.setdefault(qi, []).append(p)
    return sorted(per_queue.items())


def pick(values: Sequence[T], positions: Sequence[int]) -> Sequence[T]:
    """values[p] for p in positions; a slice for a range (no Python step per row)."""
    if isinstance(positions, range):
        return values[positions.start : positions.stop : positions.step]
    return [values[p] for p in positions]


@dataclass(frozen=True, slots=True)
class Chunk(Generic[T]):
    """Messages for one queue carrying sequences first_sequence .. first_sequence + count - 1:
    `pieces` are slices of the sequences given to SequenceChunker.extend (a chunk may span
    Spark batches), never copied item by item."""

    queue: QueueRef
    first_sequence: int
    pieces: tuple[Sequence[T], ...]
    size_bytes: int
    count: int

    @property
    def items(self) -> tuple[T, ...]:
        """The messages one by one (a Python step per message: tests and the messages path)."""
        return tuple(item for piece in self.pieces for item in piece)


@dataclass(slots=True)
class _Buffer(Generic[T]):
    next_sequence: int = 0
    pieces: list[Sequence[T]] = field(default_factory=list)
    count: int = 0
    size_bytes: int = 0
    biggest: int = 0  # at least the largest size among the pending messages


class SequenceChunker(Generic[T]):
    """Groups a task's messages per queue into chunks with consecutive sequences from 0.

    A chunk closes before a message that would take it past `max_bytes` and when it holds
    `max_messages`; so the same messages in the same order always give the same chunks. It is
    the SDK accumulator's rule with the same limits: handed to the Producer whole, every chunk
    but a queue's last is full, so the Producer sends each as exactly one request whatever
    the timing, several per queue in flight (tests/spark/test_planning.py checks both).
    Items are only sliced, never iterated: a BodyColumn (bodies in Arrow's buffers) is cut
    into BodyColumns."""

    def __init__(
        self, *, max_messages: int = MAX_CHUNK_MESSAGES, max_bytes: int = MAX_CHUNK_BYTES
    ) -> None:
        if max_messages < 1 or max_bytes < 1:
            raise ValueError("chunk limits must be positive")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._buffers: dict[QueueRef, _Buffer[T]] = {}

    def extend(
        self, queue: QueueRef, items: Sequence[T], sizes_bytes: Sequence[int]
    ) -> list[Chunk[T]]:
        """Buffer `items` (in order, with their sizes) for `queue`; the chunks that closed. One
        call per queue and Spark batch; a Python step per row only where sizes may cut."""
        n = len(items)
        if n != len(sizes_bytes):
            raise ValueError("one size per item")
        buf = self._buffers.get(queue)
        if buf is None:
            buf = self._buffers[queue] = _Buffer()
        out: list[Chunk[T]] = []
        max_messages, max_bytes = self.max_messages, self.max_bytes
        pending, count, size = buf.pieces, buf.count, buf.size_bytes
        biggest = max(buf.biggest, max(sizes_bytes, default=0))
        start = 0  # where the piece of `items` still open starts
        if biggest * max_messages <= max_bytes:
            # No chunk can pass max_bytes before it holds max_messages (each of its items is at
            # most `biggest`): the rule below cuts by count alone, here by slices.
            room = max_messages - count
            while n - start >= room:
                size += sum(sizes_bytes[start : start + room])
                pending = [*pending, items[start : start + room]]
                out.append(self._cut(queue, buf, pending, max_messages, size))
                pending, count, size = [], 0, 0
                start, room = start + room, max_messages
            size += sum(sizes_bytes[start:])
            count += n - start
        else:
            for i, item_size in enumerate(sizes_bytes):
                if count and size + item_size > max_bytes:
                    if i > start:
                        pending = [*pending, items[start:i]]
                    out.append(self._cut(queue, buf, pending, count, size))
                    pending, count, size, start = [], 0, 0, i
                count += 1
                size += item_size
                if count >= max_messages:
                    pending = [*pending, items[start : i + 1]]
                    out.append(self._cut(queue, buf, pending, count, size))
                    pending, count, size, start = [], 0, 0, i + 1
        if start < n:
            pending = [*pending, items[start:]]
        buf.pieces, buf.count, buf.size_bytes = pending, count, size
        buf.biggest = biggest if pending else 0  # (an upper bound of what is pending)
        return out

    def flush(self) -> Iterator[Chunk[T]]:
        """The chunks still open, in queue order."""
        for queue in sorted(self._buffers):
            buf = self._buffers[queue]
            if buf.count:
                yield self._close(queue, buf)

    def sequences_used(self) -> dict[QueueRef, int]:
        return {q: b.next_sequence for q, b in self._buffers.items()}

    @staticmethod
    def _cut(
        queue: QueueRef, buf: _Buffer[T], pieces: list[Sequence[T]], count: int, size_bytes: int
    ) -> Chunk[T]:
        chunk = Chunk(queue, buf.next_sequence, tuple(pieces), size_bytes, count)
        buf.next_sequence += count
        return chunk

    @classmethod
    def _close(cls, queue: QueueRef, buf: _Buffer[T]) -> Chunk[T]:
        chunk = cls._cut(queue, buf, buf.pieces, buf.count, buf.size_bytes)
        buf.pieces = []
        buf.count = 0
        buf.size_bytes = 0
        buf.biggest = 0
        return chunk
