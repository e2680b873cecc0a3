"""The leader's queue offsets (issue 29): each queue's next offset and the idempotent producers'
windows in memory, from which the leader places a produce batch's base offset into its bytes
just before the entry is proposed, in log order, so a send can be answered at its commit
(every replica's dispatcher checks it: dispatch.placement_disagreement). Pure: it reads the
index store through a Protocol and is told the term, the entry index and the dispatched index;
it never writes a row, blocks or reads a clock.

A leader places only what it can count exactly. Every other chunk that may move a queue's head
or a producer's window (a delayed or half message, a delivery of due messages, a transaction's
end, a topic change, a retention cut, a batch the window refuses, anything unknown) leaves its
offsets to the dispatcher and makes the book *unsettled* until this node has dispatched that
entry: meanwhile nothing is placed (those sends are answered after dispatch, as before), and
once it has, the book forgets what it held and reads the store again, which is then exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from raftmq.broker.dispatch import Refused, next_producer_state, window_verdict
from raftmq.broker.rows import BatchOrigin, ProducerState, QueueHead
from raftmq.broker.txn_apply import TxnApplier
from raftmq.common import stored_batch
from raftmq.common.errors import InvalidArgumentError
from raftmq.common.message import ValidNames, validate_producer_id, validate_system_topic
from raftmq.common.record_batch import Kind
from raftmq.raftlog.record import Chunk

# Chunks that never move a queue's next offset or a producer's window (the dispatcher's
# consumer-side records): they leave the book as it is.
_NEUTRAL_KINDS = frozenset(
    {
        Kind.COMMIT_OFFSET,
        Kind.RESET_OFFSETS,
        Kind.GROUP_DELETE,
        Kind.QUEUE_LOCK,
        Kind.POP_RECEIVE,
        Kind.POP_ACK,
    }
)
MAX_QUEUES = 65_536  # queues and producer windows held; past it the book re-reads the store
_UNREAD = object()  # a producer window not read from the store since the book last forgot


class OffsetSource(Protocol):
    """What the book reads when it has forgotten: the index store (broker/store.py)."""

    def queue_head(self, topic: str, queue_id: int) -> QueueHead | None: ...

    def producer_state(
        self, producer_id: str, topic: str, queue_id: int
    ) -> ProducerState | None: ...


class LeaderOffsets:
    """One per broker node; `place` runs on the Raft loop (NativeLog's stamper) for every
    entry this node proposes as leader. Not thread-safe: one caller."""

    def __init__(
        self,
        source: OffsetSource,
        *,
        recent_batches_per_producer: int = 5,
        max_queues: int = MAX_QUEUES,
    ) -> None:
        self._source = source
        self._recent = recent_batches_per_producer
        self._max_queues = max_queues
        self._term = -1
        self._epoch = -1
        # Nothing is placed until this node has dispatched this index (the latch of a term).
        self._unsettled_until = 0
        self._next: dict[tuple[str, int], int] = {}
        self._windows: dict[tuple[str, str, int], ProducerState | object | None] = {}
        # The dispatcher's topic check, remembered per name (a name's verdict never changes):
        # the regex per batch was ~1 % of the leader's Raft loop per W2 entry.
        self._topics = ValidNames(validate_system_topic)
        self._producer_ids = ValidNames(validate_producer_id)
        self.placed_batches = 0  # counts for tests and metrics
        self.left_batches = 0  # produce batches left to the dispatcher

    def place(
        self,
        term: int,
        first_index: int,
        dispatched_index: int,
        epoch: int,
        entries: Sequence[Sequence[Chunk]],
    ) -> None:
        """The entries about to be proposed at first_index, first_index + 1, ... in `term`:
        places the base offset of each produce batch it can count exactly (in place: the
        chunk must be a bytearray or a writable memoryview) and notes every chunk that moves
        what it counts. `epoch` changes when this node's index store was replaced (a
        rebuild): the book forgets."""
        if term != self._term or epoch != self._epoch:
            # A new term: everything before its first entry must be dispatched here first.
            self._term, self._epoch = term, epoch
            self._unsettle(first_index - 1)
        try:
            for k, chunks in enumerate(entries):
                index = first_index + k
                for slot, chunk in enumerate(chunks):
                    self._place_chunk(index, slot, chunk, dispatched_index)
        except BaseException:
            # The caller proposes none of these entries: forget what they placed (their
            # indexes go to later entries, which the book then waits to see dispatched).
            self._unsettle(first_index + len(entries) - 1)
            raise

    def _place_chunk(self, index: int, slot: int, chunk: Chunk, dispatched_index: int) -> None:
        if not chunk:
            self._unsettle(index)
            return
        if not stored_batch.is_stored(chunk):
            if chunk[0] not in _NEUTRAL_KINDS:
                self._unsettle(index)
            return
        if (
            isinstance(chunk, bytes)
            or (isinstance(chunk, memoryview) and chunk.readonly)
            or chunk[2] != stored_batch.STATE_STAMPED
            or stored_batch.is_scheduled(chunk)  # offsets come when due (DELIVER)
            or dispatched_index < self._unsettled_until
        ):
            self._leave(index)
            return
        try:
            header = stored_batch.read_header(chunk)
        except stored_batch.MalformedBatchError:  # refused by every dispatcher alike
            self._leave(index)
            return
        if TxnApplier.is_half(header):
            # Stored invisible: no queue row, no producer window (the node's dispatcher always
            # has its TxnApplier); its commit (TXN_END) gets the offsets, and unsettles.
            return
        topic, queue_id, count, producer = (
            header.topic,
            header.queue_id,
            header.count,
            header.producer,
        )
        if len(self._next) >= self._max_queues or len(self._windows) >= self._max_queues:
            self._leave(index)  # bounded: forget once this entry is dispatched, then go on
            return
        prev: ProducerState | None = None
        try:
            self._topics.check(topic)  # the dispatcher's checks, alike
            if producer is not None:
                key = (producer.producer_id, topic, queue_id)
                held = self._windows.get(key, _UNREAD)
                if held is _UNREAD:
                    held = self._source.producer_state(*key)
                assert held is None or isinstance(held, ProducerState)
                verdict = window_verdict(
                    held, slot, topic, queue_id, count, producer, self._producer_ids
                )
                if isinstance(verdict, Refused):  # the dispatcher answers it, as it did
                    self._leave(index)
                    return
                prev = verdict[0]
        except InvalidArgumentError:  # refused by every dispatcher alike
            self._leave(index)
            return
        base = self._next.get((topic, queue_id))
        if base is None:
            head = self._source.queue_head(topic, queue_id)
            base = head.next_offset if head is not None else 0
        stored_batch.place_offset(chunk, base)
        self._next[topic, queue_id] = base + count
        if producer is not None:
            origin = BatchOrigin(producer.first_sequence, count, base, index, slot)
            self._windows[producer.producer_id, topic, queue_id] = next_producer_state(
                prev, producer, origin, header.store_timestamp_ms, self._recent
            )
        self.placed_batches += 1

    def _leave(self, index: int) -> None:
        """A produce batch whose offsets the dispatcher assigns: the book is stale until then."""
        self.left_batches += 1
        self._unsettle(index)

    def _unsettle(self, index: int) -> None:
        self._unsettled_until = max(self._unsettled_until, index)
        self._next.clear()
        self._windows.clear()
