"""The pull decision: given a queue's bounds, this node's dispatch progress, the offset asked for
and the clock, what a pull does next (read, long-poll, catch up, answer, or out of range).

Pure: values in, a value out. It never reads a clock, a store or a thread; the pull processor
(broker/pull.py) does the waiting and reading the plan names.
"""

from __future__ import annotations

from dataclasses import dataclass

DISPATCH_CATCHUP_MS = 1_000  # a pull past a queue's end waits this long for this node's indexing
LONG_POLL_SLICE_MS = 1_000  # a long poll re-plans at least this often (closing, a deadline)


@dataclass(frozen=True, slots=True)
class Read:
    """The queue holds messages at the offset: scan from it."""


@dataclass(frozen=True, slots=True)
class WaitForMessage:
    """At the queue's end with time left: hold the request until a message arrives."""

    wait_ms: int


@dataclass(frozen=True, slots=True)
class CatchUp:
    """Past the queue's end while committed entries are not indexed here yet: they may hold the
    offset, so wait for the dispatcher to reach `index` before deciding."""

    index: int
    wait_ms: int


@dataclass(frozen=True, slots=True)
class NoNewMessage:
    """At the queue's end and out of time: answer NO_NEW_MSG."""


@dataclass(frozen=True, slots=True)
class OutOfRange:
    """The offset is outside [low, high]: answer OFFSET_OUT_OF_RANGE with the bounds."""

    low: int
    high: int


PullStep = Read | WaitForMessage | CatchUp | NoNewMessage | OutOfRange


def pull_plan(
    bounds: tuple[int, int],
    dispatched: int,
    committed: int,
    offset: int,
    now_ms: int,
    deadline_ms: int,
    *,
    caught_up: bool,
) -> PullStep:
    """The next step of a pull at `offset` of a queue holding [low, high) here. `caught_up`: this
    pull already waited for the dispatcher once (it catches up at most once)."""
    low, high = bounds
    if offset < low or offset > high:
        if not caught_up and past_end_may_be_unindexed(offset, high, dispatched, committed):
            return CatchUp(committed, DISPATCH_CATCHUP_MS)
        return OutOfRange(low, high)
    if offset < high:
        return Read()
    left_ms = deadline_ms - now_ms
    if left_ms <= 0:
        if not caught_up and dispatched < committed:
            # A send is answered at its commit, before this node indexes it (issue 29): a pull
            # at the end right after one catches up once, so a client reads its own writes.
            return CatchUp(committed, DISPATCH_CATCHUP_MS)
        return NoNewMessage()
    return WaitForMessage(min(left_ms, LONG_POLL_SLICE_MS))


def keep_polling_after_empty_scan(
    next_offset: int, high: int, now_ms: int, deadline_ms: int
) -> bool:
    """A filtered scan matched nothing. It answers NO_MATCHED_MSG (the client moves on to
    `next_offset`) unless the scan reached the queue's end with time left: then it long-polls.
    Rows left unscanned below `high` mean the scan hit its row limit: answer, so one request
    never scans a whole queue."""
    return next_offset >= high and deadline_ms - now_ms > 0


def past_end_may_be_unindexed(offset: int, high: int, dispatched: int, committed: int) -> bool:
    """A pull at `offset` beyond a queue's end (`high`, exclusive) on a node that has committed
    entries it has not indexed yet: they may hold `offset`. Another node of the group that
    indexed them first can have served the messages before it (a consumer that read from a
    follower, then returned to the leader), so this node catches up before it calls the offset
    out of range; a consumer told "out of range" resets its position (to the queue's start with
    earliest), which would redeliver the whole queue."""
    return offset > high and dispatched < committed
