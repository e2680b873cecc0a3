"""RocketMQ's ProcessQueue for a concurrent listener, as a pure value holder: which offsets of
one queue were handed to listeners and are not done yet, and so which offset may be committed.

The committable offset never passes a message whose listener has not finished (a crash then
redelivers, never skips). No threads, no I/O; the consumer guards it with its own lock.
"""

from __future__ import annotations

from collections.abc import Sequence


class ProcessQueue:
    def __init__(self, start_offset: int, max_inflight: int) -> None:
        if start_offset < 0:
            raise ValueError(f"start_offset {start_offset} is negative")
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be at least 1, got {max_inflight}")
        self.max_inflight = max_inflight
        self._inflight: set[int] = set()  # offsets handed out and not done yet
        self._last_added = -1
        self.fetched_until = start_offset  # where the next fetch starts
        self.dropped = False  # given up by a rebalance: late results are ignored

    @property
    def inflight_count(self) -> int:
        return len(self._inflight)

    def has_room(self) -> bool:
        return len(self._inflight) < self.max_inflight

    def add(self, offsets: Sequence[int], next_offset: int) -> None:
        """Messages at `offsets` (ascending; a filter may skip some) were fetched and handed
        out; the fetch continues at `next_offset`."""
        last = self._last_added
        for off in offsets:
            if off <= last:
                raise ValueError(f"offset {off} is not above {last}: fetches must move forward")
            last = off
        if next_offset <= last:
            raise ValueError(f"next_offset {next_offset} must be above the last offset {last}")
        self._inflight.update(offsets)
        self._last_added = last
        self.fetched_until = next_offset

    def done(self, offset: int) -> bool:
        """The listener of `offset` finished (or gave up on it); False if it was not in flight."""
        if offset not in self._inflight:
            return False
        self._inflight.discard(offset)
        return True

    def reset(self, offset: int) -> None:
        """The fetch position moved (its offset fell outside the queue): continue at `offset`.
        Messages still in flight keep the committed offset below them until they are done."""
        if offset < 0:
            raise ValueError(f"offset {offset} is negative")
        self.fetched_until = offset
        self._last_added = offset - 1

    def consumed_offset(self) -> int:
        """The offset to commit: the lowest one not done, or the fetch position if all are."""
        # min() over at most max_inflight offsets, once per commit: cheaper than keeping order.
        # (fetched_until is the lower one only after reset() moved the fetch back.)
        return min(min(self._inflight, default=self.fetched_until), self.fetched_until)
