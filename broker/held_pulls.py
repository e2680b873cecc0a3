"""HeldPulls: long polls parked as asyncio futures, woken by the dispatcher thread (RocketMQ's
PullRequestHoldService without its thread). Per (topic, queue) waiters in a dict, bounded.

It decides nothing (broker/pull.py's generator does); it never blocks the dispatcher beyond one
uncontended lock, and wakes the loop through a LoopWaker: one wake-up per dispatch at most.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import threading
from collections.abc import Callable

from raftmq.broker.dispatcher_thread import DispatchProgress
from raftmq.broker.store import MessageStore
from raftmq.broker.wakeups import LoopWaker
from raftmq.common.errors import QueueFullError

_QueueKey = tuple[str, int]
# (offset it waits past, tag hashes that wake it or None: any, where to note rows checked)
_Waiter = tuple[int, frozenset[int] | None, list[int] | None]


def appended_tag_hashes(progress: DispatchProgress) -> dict[_QueueKey, set[int]]:
    """The tag hashes of the rows one dispatch appended, per queue: per batch (a set union of
    its column), never a row object per message."""
    out: dict[_QueueKey, set[int]] = {}
    for o in progress.outputs:
        for b in o.cq_batches:
            out.setdefault((b.topic, b.queue_id), set()).update(b.tag_hashes)
        for r in o.loose_rows:
            out.setdefault((r.topic, r.queue_id), set()).add(r.tag_hash)
    return out


class HeldPulls:
    """`wait_*` register a loop future (on the loop thread) that completes with True once the
    condition holds; `on_progress` is the dispatcher listener that completes them; the caller
    forgets its future when its own timer fires first. At most `max_waiters` at once."""

    def __init__(
        self,
        store: MessageStore,
        waker: LoopWaker,
        *,
        max_waiters: int,
        on_park: Callable[[], None] | None = None,
    ) -> None:
        if max_waiters < 1:
            raise ValueError("max_waiters must be >= 1")
        self._store = store
        # Told after each pull parks (the dispatcher's hurry: a follower's gathered round
        # ends, since someone now waits on this node's index).
        self._on_park = on_park
        self._waker = waker
        self.max_waiters = max_waiters
        # The lock orders a registration's check of the store against the dispatcher's
        # listener (which runs after the store is written): a pull either sees the message
        # or is registered before the listener looks. Never held across I/O but one lmdb read.
        self._lock = threading.Lock()
        # per queue: future -> (offset it waits past, tag hashes that wake it or None: any)
        self._by_queue: dict[_QueueKey, dict[asyncio.Future[bool], _Waiter]] = {}
        self._by_index: dict[asyncio.Future[bool], int] = {}
        self._count = 0
        self._dispatched = store.dispatched_index

    @property
    def held(self) -> int:
        return self._count

    def wait_message(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        fut: asyncio.Future[bool],
        tag_hashes: frozenset[int] | None = None,
        checked: list[int] | None = None,
    ) -> None:
        """Complete `fut` once the queue holds a message at `offset` (any message already
        there; after that, only a new one whose tag hash is in `tag_hashes`, unless None).
        `checked[0]` is raised to the queue's end each time rows it does not want go by."""
        with self._lock:
            if self._store.queue_bounds(topic, queue_id)[1] > offset:
                fut.set_result(True)
                return
            self._admit()
            self._by_queue.setdefault((topic, queue_id), {})[fut] = (offset, tag_hashes, checked)
            self._count += 1
        if self._on_park is not None:
            self._on_park()

    def wait_dispatched(self, index: int, dispatched: int, fut: asyncio.Future[bool]) -> None:
        """Complete `fut` once entry `index` is dispatched (`dispatched`: the index now)."""
        with self._lock:
            if max(dispatched, self._dispatched) >= index:
                fut.set_result(True)
                return
            self._admit()
            self._by_index[fut] = index
            self._count += 1
        if self._on_park is not None:
            self._on_park()

    def forget(self, fut: asyncio.Future[bool], topic: str = "", queue_id: int = -1) -> None:
        """Drop a waiter (its wait ended: woken, timed out or cancelled)."""
        with self._lock:
            if self._by_index.pop(fut, None) is not None:
                self._count -= 1
                return
            key = (topic, queue_id)
            waiters = self._by_queue.get(key)
            if waiters is not None and waiters.pop(fut, None) is not None:
                self._count -= 1
                if not waiters:
                    del self._by_queue[key]

    def on_progress(self, progress: DispatchProgress) -> None:
        """Dispatcher thread, after the store has the transaction: complete what it satisfies."""
        with self._lock:
            self._dispatched = max(self._dispatched, progress.dispatched_index)
            if not self._count:
                return
            for fut, index in list(self._by_index.items()):
                if index <= progress.dispatched_index:
                    del self._by_index[fut]
                    self._count -= 1
                    self._waker.set_result(fut, True)
            appended: dict[_QueueKey, set[int]] | None = None  # built once, if a filter asks
            for key, next_offset in progress.queue_next_offsets.items():
                waiters = self._by_queue.get(key)
                if waiters is None:
                    continue
                for fut, (offset, hashes, checked) in list(waiters.items()):
                    if offset >= next_offset:
                        continue
                    if hashes is not None:
                        if appended is None:
                            appended = appended_tag_hashes(progress)
                        got = appended.get(key)  # None: rows of no kind known here: wake
                        if got is not None and hashes.isdisjoint(got):
                            # Nothing it wants arrived: it stays held, and its pull goes on
                            # past these rows when it ends (every row appended since it was
                            # registered passed through here: no rescan of them).
                            if checked is not None:
                                checked[0] = next_offset
                            continue
                    del waiters[fut]
                    self._count -= 1
                    self._waker.set_result(fut, True)
                if not waiters:
                    del self._by_queue[key]

    def wake_all(self) -> None:
        """Loop thread: complete every waiter now (the server is closing; pulls re-plan)."""
        with self._lock:
            futs = [*self._by_index, *(f for w in self._by_queue.values() for f in w)]
            self._by_index.clear()
            self._by_queue.clear()
            self._count = 0
        for fut in futs:
            if not fut.done():
                fut.set_result(True)

    def _admit(self) -> None:
        if self._count >= self.max_waiters:
            raise QueueFullError(
                f"{self._count} pulls are held on this node (the limit); retry later or "
                "pull with a shorter max_wait_ms"
            )


EXPIRE_SLICE = 8  # held pulls whose wait ends, at most, per loop iteration


class HoldTimers:
    """The ends of held pulls' waits on one loop (loop thread only): one timer for the earliest,
    and at most `slice_size` waits ended per loop iteration, the rest in the next ones. Idle
    consumers started together re-poll in step, so a thousand waits end in the same millisecond;
    one timer each ran a thousand re-plans and answers before the loop read the next request,
    and a send arriving then waited behind them all (issue 14). Sliced, the loop reads its
    sockets between slices."""

    def __init__(self, loop: asyncio.AbstractEventLoop, slice_size: int = EXPIRE_SLICE) -> None:
        if slice_size < 1:
            raise ValueError("slice_size must be >= 1")
        self._loop = loop
        self._slice = slice_size
        self._heap: list[tuple[float, int, asyncio.Future[bool]]] = []
        self._seq = itertools.count()
        self._handle: asyncio.Handle | None = None
        self._armed_at = math.inf
        self._compact_at = 4096  # woken pulls leave entries behind: dropped when it doubles

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, delay_s: float, fut: asyncio.Future[bool]) -> None:
        """Complete `fut` with False after `delay_s` unless it is done by then."""
        at = self._loop.time() + max(0.0, delay_s)
        heap = self._heap
        if len(heap) >= self._compact_at:
            heap[:] = [e for e in heap if not e[2].done()]
            heapq.heapify(heap)
            self._compact_at = max(4096, 2 * len(heap))
        heapq.heappush(heap, (at, next(self._seq), fut))
        if at < self._armed_at:
            self._arm(at)

    def _arm(self, at: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_at = at
        self._handle = self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._handle, self._armed_at = None, math.inf
        heap, now, ended = self._heap, self._loop.time(), 0
        while heap and heap[0][0] <= now and ended < self._slice:
            fut = heapq.heappop(heap)[2]
            if not fut.done():  # done: woken (or its connection went) before its time
                fut.set_result(False)
                ended += 1
        if not heap:
            return
        if heap[0][0] <= now:
            self._armed_at = now  # more are due: after the loop has looked at its sockets
            self._handle = self._loop.call_soon(self._fire)
        else:
            self._arm(heap[0][0])
