"""OutcomeBook: the outcome of each chunk of recently dispatched entries, for answering the
request that submitted it (stored at these offsets, a duplicate, or refused).

A bounded window of entries; it never decides anything, it only hands the dispatcher's verdict
to the waiting request handler.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from raftmq.broker.dispatcher_thread import DispatchProgress
from raftmq.broker.rows import ChunkOutcome

# Called with (the chunk's outcome or None when forgotten, the dispatcher's failure or None).
OutcomeCallback = Callable[[ChunkOutcome | None, BaseException | None], None]
MAX_CALLBACKS = 1 << 20  # registered and not yet answered; a leak would show here first


class OutcomeBook:
    """Listener of the DispatcherThread. A request that knows its (raft index, slot) waits here
    until that entry is dispatched. Entries older than the last `max_entries` are forgotten: a
    request that waits that late gets None (its outcome is then unknown, which is safe to
    retry with the same producer sequence)."""

    def __init__(self, dispatched_index: int, *, max_entries: int = 8192) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self._dispatched = dispatched_index
        self._by_index: collections.OrderedDict[int, tuple[ChunkOutcome, ...]] = (
            collections.OrderedDict()
        )
        self._failed: BaseException | None = None
        # One event per awaited raft index: a dispatch wakes only the requests it answers (a
        # shared condition woke every waiting handler thread on every transaction).
        self._waiters: dict[int, threading.Event] = {}
        # Requests that wait without a thread (the data server): raft index -> (slot, callback)
        self._callbacks: dict[int, list[tuple[int, OutcomeCallback]]] = {}
        self._callback_count = 0
        # release(): every request waiting at that moment ends with this error, once.
        self._release_gen = 0
        self._released: BaseException | None = None
        # Called (outside the lock) when a request starts waiting for an entry not dispatched
        # yet: the dispatcher's hurry(), which ends a gathered round.
        self.on_wait: Callable[[], None] | None = None

    @property
    def pending_callbacks(self) -> int:
        return self._callback_count

    @property
    def waiting(self) -> int:
        """Requests waiting for an outcome now (threads and callbacks): while there are any,
        the dispatcher gathers no round (DispatcherThread.add_readers)."""
        return len(self._waiters) + self._callback_count

    def record(self, progress: DispatchProgress) -> None:
        with self._lock:
            for out in progress.outputs:
                if out.outcomes:
                    self._by_index[out.raft_index] = out.outcomes
            while len(self._by_index) > self._max_entries:
                self._by_index.popitem(last=False)
            self._dispatched = max(self._dispatched, progress.dispatched_index)
            ready = [i for i in self._waiters if i <= self._dispatched]
            for i in ready:
                self._waiters.pop(i).set()
            due: list[tuple[OutcomeCallback, ChunkOutcome | None]] = []
            if self._callbacks:
                for i in [i for i in self._callbacks if i <= self._dispatched]:
                    outcomes = self._by_index.get(i)
                    for slot, callback in self._callbacks.pop(i):
                        found = (
                            outcomes[slot]
                            if outcomes is not None and slot < len(outcomes)
                            else None
                        )
                        due.append((callback, found))
                self._callback_count -= len(due)
        for callback, found in due:  # outside the lock: a callback may register again
            callback(found, None)

    def fail(self, exc: BaseException) -> None:
        """The dispatcher stopped: wake every waiter with this error."""
        with self._lock:
            self._failed = exc
            for event in self._waiters.values():
                event.set()
            self._waiters.clear()
            callbacks = [cb for entries in self._callbacks.values() for _, cb in entries]
            self._callbacks.clear()
            self._callback_count = 0
        for callback in callbacks:
            callback(None, exc)

    def release(self, exc: BaseException) -> None:
        """Dispatch stalls (the disk refuses writes): end every request waiting now with `exc`
        rather than hold it to its deadline; later requests wait as usual."""
        with self._lock:
            self._released = exc
            self._release_gen += 1
            for event in self._waiters.values():
                event.set()
            self._waiters.clear()
            callbacks = [cb for entries in self._callbacks.values() for _, cb in entries]
            self._callbacks.clear()
            self._callback_count = 0
        for callback in callbacks:
            callback(None, exc)

    def on_outcome(self, raft_index: int, slot: int, callback: OutcomeCallback) -> None:
        """`wait` without a thread: `callback(outcome, failure)` runs once, on the dispatcher
        thread when the entry is dispatched (or the dispatcher fails), or at once on the calling
        thread when it already is. It must be quick and must not raise (a LoopWaker post)."""
        with self._lock:
            failed = self._failed
            if failed is None and self._dispatched < raft_index:
                if self._callback_count >= MAX_CALLBACKS:
                    raise RuntimeError(f"{self._callback_count} outcome callbacks pending")
                self._callbacks.setdefault(raft_index, []).append((slot, callback))
                self._callback_count += 1
                waits = True
            else:
                waits = False
                outcomes = self._by_index.get(raft_index)
        if waits:
            if self.on_wait is not None:
                self.on_wait()
            return
        if failed is not None:
            callback(None, failed)
            return
        callback(outcomes[slot] if outcomes is not None and slot < len(outcomes) else None, None)

    def wait(self, raft_index: int, slot: int, timeout_s: float) -> ChunkOutcome | None:
        """The outcome of chunk `slot` of entry `raft_index`, once dispatched; None on timeout or
        when the entry has already been forgotten. Raises the dispatcher's failure, if any."""
        deadline = time.monotonic() + timeout_s
        gen = self._release_gen
        while True:
            with self._lock:
                if self._failed is not None:
                    raise self._failed
                if self._dispatched < raft_index and self._release_gen != gen:
                    assert self._released is not None
                    raise self._released
                if self._dispatched >= raft_index:
                    outcomes = self._by_index.get(raft_index)
                    break
                event = self._waiters.get(raft_index)
                if event is None:
                    event = self._waiters[raft_index] = threading.Event()
            if self.on_wait is not None:
                self.on_wait()
            left = deadline - time.monotonic()
            if left <= 0 or not event.wait(left):
                with self._lock:
                    if self._dispatched < raft_index:
                        return None
        if outcomes is None or slot >= len(outcomes):
            return None
        return outcomes[slot]
