"""The producer's retry rule and outcome classification, pure: what a failed attempt leads to
(retry, move to another broker group, fail), how long to wait, and whether it may be stored.
Values in, values out: no clocks, no threads, no network (time left is passed in).
"""

from __future__ import annotations

import enum

from raftmq.common.errors import (
    Fault,
    NotLeaderError,
    OutcomeUnknownError,
    OutOfOrderSequenceError,
    RaftMQError,
)

MAX_RETRY_BACKOFF_S = 0.1  # failover takes ~1 s: retry often within the send timeout


class Next(enum.Enum):
    """What the producer does after a failed attempt."""

    RETRY = "retry"  # the same request (same queue, same sequences) again, maybe another node
    MOVE = "move"  # to another broker group's queue: only if no attempt can have stored it
    FAIL = "fail"


def after_failure(
    err: RaftMQError,
    *,
    attempts: int,
    max_attempts: int,
    time_left_s: float,
    maybe_stored: bool,
    movable: bool,
) -> Next:
    """The retry rule, pure. System faults are retried until the attempts or the send timeout
    run out; caller faults fail at once. A request moves to another group only when its items
    may move (no key, no chosen queue) and no attempt of it can have been stored, since the
    other group's broker cannot deduplicate what this one may hold. A leader hint is followed
    at once instead: the group has a leader, so its queue (and the order in it) is kept."""
    retryable = err.retryable or isinstance(err, OutcomeUnknownError)
    if not retryable or attempts >= max_attempts or time_left_s <= 0:
        return Next.FAIL
    hinted = isinstance(err, NotLeaderError) and bool(err.leader_hint)
    # Out of order: an earlier batch of the queue is in flight; it stays behind that one.
    stay = hinted or isinstance(err, OutOfOrderSequenceError)
    if movable and not maybe_stored and not stay:
        return Next.MOVE
    return Next.RETRY


def final_error(err: RaftMQError, *, maybe_stored: bool, attempts: int, group: str) -> RaftMQError:
    """The error a failed send reports: whether it may be stored is what the caller must know."""
    if maybe_stored and err.fault is Fault.SYSTEM and not isinstance(err, OutcomeUnknownError):
        return OutcomeUnknownError(
            f"send to broker group {group} did not complete after {attempts} attempt(s) "
            f"({err.message}); it may or may not be stored",
            details={"broker_group": group},
        )
    return err


def retry_delay_s(err: RaftMQError, attempts: int, backoff_s: float) -> float:
    """At once on a leader hint; otherwise a linear back-off, capped (failover takes ~1 s)."""
    if isinstance(err, NotLeaderError) and err.leader_hint:
        return 0.0
    return min(backoff_s * attempts, MAX_RETRY_BACKOFF_S)
