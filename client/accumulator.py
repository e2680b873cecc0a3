"""The producer's record accumulator (Kafka's RecordAccumulator) as a pure value holder: messages
wait per queue and leave as batches carrying the queue's idempotent sequence numbers.

Time comes in as `now_ms`; no threads, no I/O, no clock. Up to `max_inflight_per_queue` batches
per queue are in flight (Kafka keeps 5 under the idempotent producer); a retried batch keeps its
sequence numbers, and the broker refuses a batch that would land before an earlier one of its
queue (strict sequences), so the queue's order holds.

An item may stand for several messages (`count_of`: the batch-first call's bodies travel as one
item, issue 24): the limits, the buffer bounds and the sequence numbers count messages, and an
item is never split (the caller cuts items to fit a batch).

With `seal_on_send`, a batch cut for sending stays open until the caller seals it right before
it goes on the wire: messages arriving meanwhile join it instead of waiting behind it (the
fast data path cuts on the caller's thread and sends from the I/O loop a moment later).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from raftmq.common.types import QueueRef

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Batch(Generic[T]):
    """One send request of `count` messages: they carry producer sequences `first_sequence` on,
    in the order of `items` (an item of n messages takes n consecutive sequences)."""

    queue: QueueRef
    items: tuple[T, ...]
    first_sequence: int
    size_bytes: int
    count: int

    @property
    def next_sequence(self) -> int:
        return self.first_sequence + self.count


@dataclass(frozen=True, slots=True)
class Appended(Generic[T]):
    """What the caller does after append(): send `batch` now, and/or arm a timer for `wake_at_ms`
    (a linger started) that calls due()."""

    batch: Batch[T] | None
    wake_at_ms: int | None


@dataclass(slots=True)
class _QueueState(Generic[T]):
    pending: collections.deque[tuple[T, int, int]] = field(default_factory=collections.deque)
    pending_bytes: int = 0
    pending_messages: int = 0
    inflight: list[Batch[T]] = field(default_factory=list)  # in sequence order
    open: Batch[T] | None = None  # cut, not sealed yet (seal_on_send): the newest in flight
    next_sequence: int = 0
    linger_until_ms: int | None = None


class Accumulator(Generic[T]):
    """Per-queue buffers with Kafka's batching rules.

    A queue's batch leaves when it is full (batch_max_messages or batch_max_bytes), when its
    linger ends (the first waiting message arrived linger_ms ago), or at once when the queue's
    previous batch completes (what waited behind a request has waited long enough). Buffered
    counts include in-flight batches until they complete: that is the producer's memory bound.
    """

    def __init__(
        self,
        *,
        linger_ms: int,
        batch_max_messages: int,
        batch_max_bytes: int,
        max_buffered_messages: int,
        max_buffered_bytes: int,
        max_inflight_per_queue: int = 1,
        seal_on_send: bool = False,
        count_of: Callable[[T], int] | None = None,
    ) -> None:
        if linger_ms < 0:
            raise ValueError(f"linger_ms must not be negative, got {linger_ms}")
        if batch_max_messages < 1 or batch_max_bytes < 1:
            raise ValueError("batch_max_messages and batch_max_bytes must be at least 1")
        if max_buffered_messages < 1 or max_buffered_bytes < 1:
            raise ValueError("max_buffered_messages and max_buffered_bytes must be at least 1")
        if not 1 <= max_inflight_per_queue <= 5:
            # the broker remembers the last 5 batches per producer and queue (Kafka's window):
            # a retried batch older than that could no longer be answered with its offsets
            raise ValueError("max_inflight_per_queue must be within 1..5")
        self.max_inflight_per_queue = max_inflight_per_queue
        self.seal_on_send = seal_on_send
        self._count_of = count_of  # messages per item; None: one each
        self.linger_ms = linger_ms
        self.batch_max_messages = batch_max_messages
        self.batch_max_bytes = batch_max_bytes
        self.max_buffered_messages = max_buffered_messages
        self.max_buffered_bytes = max_buffered_bytes
        self._queues: dict[QueueRef, _QueueState[T]] = {}
        self.buffered_messages = 0
        self.buffered_bytes = 0

    # ---- admission ------------------------------------------------------------------------------

    def has_room(self, count: int, size_bytes: int) -> bool:
        """Whether `count` more messages of `size_bytes` in all fit the buffer. An empty buffer
        takes anything, so one request larger than the bound is refused by the broker with a
        clear error instead of blocking forever here."""
        if self.buffered_messages == 0:
            return True
        return (
            self.buffered_messages + count <= self.max_buffered_messages
            and self.buffered_bytes + size_bytes <= self.max_buffered_bytes
        )

    # ---- transitions ----------------------------------------------------------------------------

    def append(self, queue: QueueRef, items: Sequence[tuple[T, int]], now_ms: int) -> Appended[T]:
        """Buffer `items` ((item, size in bytes), in order) for `queue`. The caller checked
        has_room(); a batch given to the caller must be sent, then complete()d or abandon()ed."""
        st = self._queues.get(queue)
        if st is None:
            st = self._queues[queue] = _QueueState()
        count_of = self._count_of
        for item, size in items:
            if size < 0:
                raise ValueError(f"item size {size} is negative")
            count = 1 if count_of is None else count_of(item)
            if not 1 <= count <= self.batch_max_messages:
                raise ValueError(f"an item of {count} messages does not fit a batch")
            st.pending.append((item, size, count))
            st.pending_bytes += size
            st.pending_messages += count
            self.buffered_messages += count
            self.buffered_bytes += size
        armed = st.linger_until_ms
        batch = self._ready(queue, st, now_ms, waited=False)
        wake = st.linger_until_ms if batch is None and armed is None else None
        return Appended(batch, wake)

    def due(self, queue: QueueRef, now_ms: int) -> Batch[T] | None:
        """The linger timer of `queue` fired: its waiting messages leave unless a batch of the
        queue is in flight (then they leave when it completes)."""
        st = self._queues.get(queue)
        if st is None:
            return None
        st.linger_until_ms = None
        return self._ready(queue, st, now_ms, waited=True)

    def complete(self, batch: Batch[T], now_ms: int) -> Batch[T] | None:
        """`batch` has its outcome (stored, or failed for good); the queue's next batch, if any.
        Its sequence numbers stay used: the broker may have stored it."""
        st = self._release(batch)
        return self._ready(batch.queue, st, now_ms, waited=True)

    def abandon(self, batch: Batch[T], now_ms: int) -> Batch[T] | None:
        """`batch` surely never reached a broker and its items go elsewhere (another broker
        group): its sequence numbers are handed out again, so the queue's sequence has no gap."""
        st = self._release(batch)
        if batch.next_sequence == st.next_sequence:
            # the newest batch of the queue: hand its sequences out again. An older one leaves
            # a gap that the queue's next oldest batch skips (it is sent not strict).
            st.next_sequence = batch.first_sequence
        return self._ready(batch.queue, st, now_ms, waited=True)

    def seal(self, batch: Batch[T], now_ms: int) -> tuple[Batch[T], Batch[T] | None]:
        """`batch` goes on the wire now: what waits for its queue joins it (up to the batch
        limits), and it can no longer grow. Returns (the batch to send, the queue's next batch
        if one is ready now because this one filled). A batch that is not open (sealed before,
        or seal_on_send off) comes back unchanged."""
        st = self._queues.get(batch.queue)
        if st is None or st.open is not batch:
            return batch, None
        st.open = None
        items = list(batch.items)
        size, count = batch.size_bytes, batch.count
        while st.pending:
            item, item_size, item_count = st.pending[0]
            if count + item_count > self.batch_max_messages:
                break
            if size + item_size > self.batch_max_bytes:
                break
            st.pending.popleft()
            st.pending_bytes -= item_size
            st.pending_messages -= item_count
            items.append(item)
            size += item_size
            count += item_count
        if len(items) == len(batch.items):
            return batch, None
        sealed = Batch(batch.queue, tuple(items), batch.first_sequence, size, count)
        assert st.inflight[-1] is batch, "the open batch is the newest in flight"
        st.inflight[-1] = sealed
        st.next_sequence = sealed.next_sequence
        if not st.pending:
            st.linger_until_ms = None
        return sealed, self._ready(batch.queue, st, now_ms, waited=False)

    def inflight(self, queue: QueueRef) -> Batch[T] | None:
        """The oldest batch of `queue` in flight."""
        st = self._queues.get(queue)
        return st.inflight[0] if st is not None and st.inflight else None

    def inflight_count(self, queue: QueueRef) -> int:
        st = self._queues.get(queue)
        return len(st.inflight) if st is not None else 0

    def is_oldest(self, batch: Batch[T]) -> bool:
        """Every earlier batch of its queue has its outcome (stored, or given up): a gap before
        it is final, so it may be sent not strict."""
        st = self._queues.get(batch.queue)
        return st is not None and bool(st.inflight) and st.inflight[0] is batch

    def pending_count(self, queue: QueueRef) -> int:
        """Messages of `queue` waiting to be cut into a batch."""
        st = self._queues.get(queue)
        return st.pending_messages if st is not None else 0

    def next_sequence(self, queue: QueueRef) -> int:
        st = self._queues.get(queue)
        return st.next_sequence if st is not None else 0

    # ---- internals ------------------------------------------------------------------------------

    def _release(self, batch: Batch[T]) -> _QueueState[T]:
        st = self._queues.get(batch.queue)
        at = -1
        if st is not None:
            at = next((i for i, b in enumerate(st.inflight) if b is batch), -1)
        if st is None or at < 0:
            raise ValueError(f"batch {batch.first_sequence} of {batch.queue} is not in flight")
        del st.inflight[at]
        if st.open is batch:
            st.open = None
        self.buffered_messages -= batch.count
        self.buffered_bytes -= batch.size_bytes
        return st

    def _ready(
        self, queue: QueueRef, st: _QueueState[T], now_ms: int, *, waited: bool
    ) -> Batch[T] | None:
        if not st.pending or st.open is not None or len(st.inflight) >= self.max_inflight_per_queue:
            return None
        full = (
            st.pending_messages >= self.batch_max_messages
            or st.pending_bytes >= self.batch_max_bytes
        )
        if not (full or waited) and self.linger_ms > 0:
            if st.linger_until_ms is None:
                st.linger_until_ms = now_ms + self.linger_ms
            if now_ms < st.linger_until_ms:
                return None
        items: list[T] = []
        size = count = 0
        while st.pending:
            item, item_size, item_count = st.pending[0]
            if count + item_count > self.batch_max_messages:
                break
            if items and size + item_size > self.batch_max_bytes:
                break
            st.pending.popleft()
            items.append(item)
            size += item_size
            count += item_count
        st.pending_bytes -= size
        st.pending_messages -= count
        st.linger_until_ms = None
        batch = Batch(queue, tuple(items), st.next_sequence, size, count)
        st.next_sequence = batch.next_sequence
        st.inflight.append(batch)
        if self.seal_on_send:
            st.open = batch
        return batch
