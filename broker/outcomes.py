"""OutcomeBook: the outcome of each chunk of recently dispatched entries, for answering the
request that submitted it (stored at these offsets, a duplicate, or refused).

A bounded window of entries; it never decides anything, it only hands the dispatcher's verdict
to the waiting request handler.
"""

from __future__ import annotations

import collections
import threading
import time

from raftmq.broker.dispatcher_thread import DispatchProgress
from raftmq.broker.rows import ChunkOutcome


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

    def fail(self, exc: BaseException) -> None:
        """The dispatcher stopped: wake every waiter with this error."""
        with self._lock:
            self._failed = exc
            for event in self._waiters.values():
                event.set()
            self._waiters.clear()

    def wait(self, raft_index: int, slot: int, timeout_s: float) -> ChunkOutcome | None:
        """The outcome of chunk `slot` of entry `raft_index`, once dispatched; None on timeout or
        when the entry has already been forgotten. Raises the dispatcher's failure, if any."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self._failed is not None:
                    raise self._failed
                if self._dispatched >= raft_index:
                    outcomes = self._by_index.get(raft_index)
                    break
                event = self._waiters.get(raft_index)
                if event is None:
                    event = self._waiters[raft_index] = threading.Event()
            left = deadline - time.monotonic()
            if left <= 0 or not event.wait(left):
                with self._lock:
                    if self._dispatched < raft_index:
                        return None
        if outcomes is None or slot >= len(outcomes):
            return None
        return outcomes[slot]
