"""The orderly push consumer's process queue (RocketMQ's MessageListenerOrderly): one message at a
time per queue in queue order, only while this client holds the queue's broker lock; a failure
suspends the queue and retries the same message, and past max_reconsume_times it is dead-lettered.

A pure value holder: time comes in as now_ms, the consumer's threads and lock renewals sit around
it. It never hands out a message while another of its queue is in a listener.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

DEFAULT_SUSPEND_MS = 1_000  # RocketMQ suspendCurrentQueueTimeMillis
DEFAULT_MAX_RECONSUME_TIMES = 16
DEFAULT_LOCK_RENEW_INTERVAL_MS = 20_000  # RocketMQ REBALANCE_LOCK_INTERVAL
# The client trusts its lock for 30 s after the last grant (RocketMQ's client-side
# REBALANCE_LOCK_MAX_LIVE_TIME), half the broker's 60 s lease: it stops before another may start.
DEFAULT_CLIENT_LOCK_LIVE_MS = 30_000

T = TypeVar("T")


class Verdict(enum.Enum):
    NEXT = "next"  # done: the next message of the queue may go
    RETRY = "retry"  # same message again after `retry_at_ms`
    DEAD_LETTER = "dead_letter"  # send it to %DLQ%<group>, then call dead_lettered()


@dataclass(frozen=True, slots=True)
class Step:
    verdict: Verdict
    offset: int
    attempts: int  # failed attempts so far
    retry_at_ms: int = 0


class OrderlyProcessQueue(Generic[T]):
    def __init__(
        self,
        start_offset: int,
        *,
        max_buffered: int = 1_000,
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
        suspend_ms: int = DEFAULT_SUSPEND_MS,
        lock_live_ms: int = DEFAULT_CLIENT_LOCK_LIVE_MS,
    ) -> None:
        if start_offset < 0:
            raise ValueError(f"start_offset {start_offset} is negative")
        if max_buffered < 1 or max_reconsume_times < 0 or suspend_ms < 0 or lock_live_ms <= 0:
            raise ValueError("max_buffered >= 1, max_reconsume_times >= 0, suspend_ms >= 0 and "
                             "lock_live_ms > 0 are required")  # fmt: skip
        self.max_buffered = max_buffered
        self.max_reconsume_times = max_reconsume_times
        self.suspend_ms = suspend_ms
        self.lock_live_ms = lock_live_ms
        self._buffer: deque[tuple[int, T]] = deque()
        self._consumed = start_offset  # every offset below is done (or filtered out)
        self.fetched_until = start_offset
        self._busy: int | None = None  # the offset in a listener now
        self._attempts = 0  # failures of the head message
        self._suspended_until = 0
        self._lock_granted_ms: int | None = None
        self.dropped = False

    # ---- the broker lock -------------------------------------------------------------------------

    def lock_granted(self, now_ms: int) -> None:
        self._lock_granted_ms = now_ms

    def lock_lost(self) -> None:
        self._lock_granted_ms = None

    def lock_valid(self, now_ms: int) -> bool:
        granted = self._lock_granted_ms
        return granted is not None and now_ms - granted < self.lock_live_ms

    def lock_renew_due(
        self, now_ms: int, interval_ms: int = DEFAULT_LOCK_RENEW_INTERVAL_MS
    ) -> bool:
        granted = self._lock_granted_ms
        return granted is None or now_ms - granted >= interval_ms

    # ---- fetched messages ------------------------------------------------------------------------

    def has_room(self) -> bool:
        return len(self._buffer) < self.max_buffered

    def add(self, messages: Sequence[tuple[int, T]], next_offset: int) -> None:
        """Messages (offset, message), ascending (a filter may skip offsets); the next fetch
        starts at `next_offset`."""
        last = self._buffer[-1][0] if self._buffer else self.fetched_until - 1
        for off, _ in messages:
            if off <= last:
                raise ValueError(f"offset {off} is not above {last}: fetches must move forward")
            last = off
        if next_offset <= last:
            raise ValueError(f"next_offset {next_offset} must be above the last offset {last}")
        self._buffer.extend(messages)
        self.fetched_until = next_offset
        if self._busy is None and not self._buffer:
            self._consumed = next_offset

    # ---- one at a time ---------------------------------------------------------------------------

    def take(self, now_ms: int) -> tuple[int, T] | None:
        """The head message if nothing of this queue is in a listener, the queue is not
        suspended, not dropped, and the lock is valid; else None (see `wake_at_ms`)."""
        if self.dropped or self._busy is not None or not self._buffer:
            return None
        if now_ms < self._suspended_until or not self.lock_valid(now_ms):
            return None
        head = self._buffer[0]
        self._busy = head[0]
        return head

    def wake_at_ms(self) -> int:
        """When a suspended queue may go again."""
        return self._suspended_until

    def succeeded(self, offset: int) -> Step:
        self._check_busy(offset)
        return self._finish(offset, Verdict.NEXT)

    def failed(self, offset: int, now_ms: int) -> Step:
        """The listener failed (or asked to suspend): retry the same message after the suspend
        interval, or, past max_reconsume_times, tell the caller to dead-letter it."""
        self._check_busy(offset)
        self._busy = None
        self._attempts += 1
        if self._attempts > self.max_reconsume_times:
            self._busy = offset  # stays the head until dead_lettered() or dead_letter_failed()
            return Step(Verdict.DEAD_LETTER, offset, self._attempts)
        self._suspended_until = now_ms + self.suspend_ms
        return Step(Verdict.RETRY, offset, self._attempts, self._suspended_until)

    def dead_lettered(self, offset: int) -> Step:
        """The DLQ send succeeded: the queue moves on."""
        self._check_busy(offset)
        return self._finish(offset, Verdict.NEXT)

    def dead_letter_failed(self, offset: int, now_ms: int) -> Step:
        """The DLQ send failed: suspend and retry the message locally (never skip it)."""
        self._check_busy(offset)
        self._busy = None
        self._suspended_until = now_ms + self.suspend_ms
        return Step(Verdict.RETRY, offset, self._attempts, self._suspended_until)

    def attempts(self) -> int:
        return self._attempts

    def consumed_offset(self) -> int:
        """The offset to commit: the head message's (not done yet), or the fetch position."""
        return self._buffer[0][0] if self._buffer else self._consumed

    def drop(self) -> None:
        """Given up by a rebalance: nothing more is handed out; the caller commits
        consumed_offset() and unlocks the queue once the listener in flight returns."""
        self.dropped = True

    @property
    def busy(self) -> bool:
        return self._busy is not None

    def __len__(self) -> int:
        return len(self._buffer)

    def _check_busy(self, offset: int) -> None:
        if self._busy != offset:
            raise ValueError(f"offset {offset} is not the message in the listener ({self._busy})")

    def _finish(self, offset: int, verdict: Verdict) -> Step:
        attempts = self._attempts
        self._buffer.popleft()
        self._busy = None
        self._attempts = 0
        self._suspended_until = 0
        if not self._buffer:
            self._consumed = self.fetched_until
        return Step(verdict, offset, attempts)
