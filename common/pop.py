"""POP consumption (RocketMQ 5's SimpleConsumer) of one queue by one consumer group, as a pure
state machine: which offsets to hand out, which are invisible until when, which were acked, and
the offset that may be committed. No I/O, no clock: every call takes `now_ms`.

A delivery is (offset, token): the token changes with every hand-out and every change of the
invisible duration, so a receipt handle from before names a delivery that no longer exists and is
refused instead of acking a later one. Committed offset = the lowest offset still unacknowledged
(or the cursor when none is), as RocketMQ commits a pop queue's progress.

Replicated (docs/design.md, "POP state in the broker group's Raft log"): the broker group's
dispatcher applies each receive and ack batch with these transitions at the entry's time, with
the entry's tokens (broker/pop_apply.py), so every replica and a new leader hold the same state;
the proxy keeps a mirror of it to plan receives (proxy/service.py). Tokens: `token=` of a call,
or the injected counter (a mirror, tests).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(slots=True)
class Delivery:
    """One received, unacknowledged message: invisible until `visible_at_ms`."""

    offset: int
    attempt: int  # 1 for the first delivery (v2 delivery_attempt)
    token: int
    visible_at_ms: int


class AckOutcome(enum.Enum):
    DONE = "done"  # acknowledged now
    ALREADY = "already"  # acknowledged (or committed) before: nothing to do
    STALE = "stale"  # the handle's delivery was superseded (redelivered or changed)
    UNKNOWN = "unknown"  # never delivered by this state


@dataclass(frozen=True, slots=True)
class Plan:
    """What one receive should fetch from a queue: offsets to deliver again (expired, in order),
    then up to `new_max` messages from `new_from` (None: nothing new now)."""

    redeliver: tuple[int, ...]
    new_from: int | None
    new_max: int


class QueuePop:
    """One (consumer group, topic, broker group, queue). `fifo`: a queue with unacknowledged
    messages gives nothing new, and what expires comes back in order (RocketMQ's FIFO pop)."""

    def __init__(
        self,
        start_offset: int,
        *,
        fifo: bool,
        max_inflight: int,
        tokens: Iterator[int] | None = None,
    ) -> None:
        """`tokens`: shared by every queue of a process, so that a handle from a state that was
        dropped and made again can never match a new delivery."""
        assert start_offset >= 0 and max_inflight > 0
        self.cursor = start_offset  # the next offset never handed out
        self.fifo = fifo
        self.max_inflight = max_inflight
        self.inflight: dict[int, Delivery] = {}
        self._committed = start_offset  # what the broker group holds (as far as we know)
        self._tokens = tokens if tokens is not None else itertools.count(1)

    # ---- receive ------------------------------------------------------------------------------

    def plan(self, now_ms: int, max_count: int) -> Plan:
        assert max_count > 0
        expired = sorted(o for o, d in self.inflight.items() if d.visible_at_ms <= now_ms)
        if self.fifo:
            if self.inflight:
                first = min(self.inflight)
                # In order: only from the first unacknowledged message on, once it is visible.
                if self.inflight[first].visible_at_ms > now_ms:
                    return Plan((), None, 0)
                run = tuple(o for o in expired if o >= first)[:max_count]
                return Plan(run, None, 0)
            return Plan((), self.cursor, min(max_count, self.max_inflight))
        again = tuple(expired[:max_count])
        room = min(max_count - len(again), self.max_inflight - len(self.inflight) + len(again))
        return Plan(again, self.cursor if room > 0 else None, max(room, 0))

    def redeliver(
        self, offset: int, now_ms: int, invisible_ms: int, *, token: int | None = None
    ) -> Delivery | None:
        """Hand out `offset` again if it is still unacknowledged and visible (a concurrent
        receive may have taken it first: None)."""
        d = self.inflight.get(offset)
        if d is None or d.visible_at_ms > now_ms:
            return None
        d.attempt += 1
        d.token = self._token(token)
        d.visible_at_ms = now_ms + invisible_ms
        return d

    def exhausted(self, offset: int, max_attempts: int) -> bool:
        """`offset` is unacknowledged and was delivered `max_attempts` times already: it goes to
        the dead-letter topic instead of an attempt more."""
        d = self.inflight.get(offset)
        return d is not None and d.attempt >= max_attempts

    def drop(self, offset: int) -> None:
        """The message is gone from the broker (retention): stop waiting for its ack."""
        self.inflight.pop(offset, None)

    def claim_new(
        self,
        pulled_from: int,
        offsets: list[int],
        next_offset: int,
        now_ms: int,
        invisible_ms: int,
        take: int,
        *,
        token: int | None = None,
    ) -> list[Delivery]:
        """Messages pulled from `pulled_from` (their `offsets`, filter matches only, ascending;
        the pull ended at `next_offset`): hand out the first `take` of them. Nothing if another
        receive moved the cursor meanwhile (its pull got them)."""
        if pulled_from != self.cursor or next_offset < pulled_from or take <= 0:
            return []
        chosen = offsets[: max(take, 0)]
        out = []
        for o in chosen:
            assert o >= pulled_from, "a pull returned an offset before where it started"
            d = Delivery(o, 1, self._token(token), now_ms + invisible_ms)
            self.inflight[o] = d
            out.append(d)
        # Taken fewer than pulled: continue right after the last one taken.
        self.cursor = chosen[-1] + 1 if len(chosen) < len(offsets) else next_offset
        return out

    def skip_to(self, pulled_from: int, next_offset: int) -> None:
        """A pull from the cursor matched nothing up to `next_offset` (filter)."""
        if pulled_from == self.cursor and next_offset > self.cursor:
            self.cursor = next_offset

    def reset(self, offset: int) -> None:
        """The cursor's offset is outside the queue (retention, reset): go on from `offset`;
        unacknowledged messages before it can never be delivered again."""
        self.cursor = offset
        for o in [o for o in self.inflight if o < offset]:
            del self.inflight[o]

    # ---- ack / change invisible duration ------------------------------------------------------

    def ack(self, offset: int, token: int) -> AckOutcome:
        d = self.inflight.get(offset)
        if d is not None:
            if d.token != token:
                return AckOutcome.STALE
            del self.inflight[offset]
            return AckOutcome.DONE
        if offset < self.cursor:
            return AckOutcome.ALREADY
        return AckOutcome.UNKNOWN

    def change_invisible(
        self,
        offset: int,
        token: int,
        now_ms: int,
        invisible_ms: int,
        *,
        new_token: int | None = None,
    ) -> tuple[AckOutcome, Delivery | None]:
        """Make a delivery invisible for `invisible_ms` from now; the new delivery (new token)."""
        d = self.inflight.get(offset)
        if d is None:
            return (AckOutcome.ALREADY if offset < self.cursor else AckOutcome.UNKNOWN), None
        if d.token != token:
            return AckOutcome.STALE, None
        d.token = self._token(new_token)
        d.visible_at_ms = now_ms + invisible_ms
        return AckOutcome.DONE, d

    # ---- progress -----------------------------------------------------------------------------

    def low_watermark(self) -> int:
        """Every offset below this is acknowledged (or filtered out): what may be committed."""
        return min(self.inflight) if self.inflight else self.cursor

    def commit_due(self) -> int | None:
        """The offset to commit now, or None when the broker already has it."""
        low = self.low_watermark()
        return low if low > self._committed else None

    def committed(self, offset: int) -> None:
        self._committed = max(self._committed, offset)

    def next_visible_ms(self) -> int | None:
        """When the earliest unacknowledged message becomes visible again (long polls wake)."""
        return min((d.visible_at_ms for d in self.inflight.values()), default=None)

    def _token(self, given: int | None) -> int:
        return given if given is not None else next(self._tokens)
