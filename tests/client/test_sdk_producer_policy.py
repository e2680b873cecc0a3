"""The producer's retry rule, pure: what may move to another broker group (only what surely was
never stored), what is retried with the same sequences, what fails and with which error."""

from __future__ import annotations

import pytest

from raftmq.client import data_pool
from raftmq.client.producer.retry import (
    MAX_RETRY_BACKOFF_S,
    Next,
    after_failure,
    final_error,
    retry_delay_s,
)
from raftmq.common.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    MessageTooLargeError,
    NoRouteError,
    NotLeaderError,
    OutcomeUnknownError,
    OutOfOrderSequenceError,
    QueueFullError,
    RaftMQError,
    RequestTimeoutError,
    TopicNotFoundError,
)


def decide(err: RaftMQError, *, maybe_stored: bool = False, movable: bool = True) -> Next:
    return after_failure(
        err, attempts=1, max_attempts=5, time_left_s=5.0, maybe_stored=maybe_stored, movable=movable
    )


def test_only_a_request_that_surely_never_left_moves() -> None:
    assert decide(NotLeaderError("x")) is Next.MOVE, "a group in election: go elsewhere"
    assert decide(BrokerUnavailableError("x")) is Next.MOVE
    assert decide(RequestTimeoutError("x"), maybe_stored=True) is Next.RETRY
    assert decide(OutcomeUnknownError("x"), maybe_stored=True) is Next.RETRY
    # Once any attempt may have stored it, it stays on its queue with its sequences, even when
    # a later attempt is refused before sending: only that broker can deduplicate it.
    assert decide(NotLeaderError("x"), maybe_stored=True) is Next.RETRY
    # A leader hint is followed on the same queue at once.
    hinted = NotLeaderError("x", leader_hint="127.0.0.1:5")
    assert decide(hinted) is Next.RETRY
    assert retry_delay_s(hinted, attempts=3, backoff_s=0.05) == 0.0
    # Keyed, selected and batch sends never move: their queue is their order.
    assert decide(NotLeaderError("x"), movable=False) is Next.RETRY


def test_an_out_of_order_batch_waits_on_its_queue() -> None:
    """Refused unstored because an earlier batch of its queue is still in flight: retried on
    the same queue (never moved: it would leave its order) and it stored nothing."""
    err = OutOfOrderSequenceError("x")
    assert err.retryable and err.code == "OUT_OF_ORDER_SEQUENCE"
    assert decide(err) is Next.RETRY
    assert not data_pool.may_have_stored(err)


@pytest.mark.parametrize(
    "err",
    [
        InvalidArgumentError("x"),
        MessageTooLargeError("x"),
        TopicNotFoundError("x"),
    ],
)
def test_caller_faults_fail_at_once(err: RaftMQError) -> None:
    assert decide(err) is Next.FAIL
    assert final_error(err, maybe_stored=False, attempts=1, group="g") is err


def test_attempts_and_time_bound_the_retries() -> None:
    err = QueueFullError("busy")
    assert (
        after_failure(
            err, attempts=4, max_attempts=5, time_left_s=1, maybe_stored=True, movable=False
        )
        is Next.RETRY
    )
    assert (
        after_failure(
            err, attempts=5, max_attempts=5, time_left_s=1, maybe_stored=True, movable=False
        )
        is Next.FAIL
    )
    assert (
        after_failure(
            err, attempts=1, max_attempts=5, time_left_s=0, maybe_stored=True, movable=False
        )
        is Next.FAIL
    )
    assert retry_delay_s(err, attempts=1, backoff_s=0.05) == pytest.approx(0.05)
    assert retry_delay_s(err, attempts=1000, backoff_s=0.05) == MAX_RETRY_BACKOFF_S


def test_the_final_error_says_whether_it_may_be_stored() -> None:
    gave_up = final_error(
        RequestTimeoutError("slow"), maybe_stored=True, attempts=7, group="broker-a"
    )
    assert isinstance(gave_up, OutcomeUnknownError)
    assert "broker-a" in gave_up.message and "7 attempt" in gave_up.message
    not_sent = NoRouteError("no route")
    assert final_error(not_sent, maybe_stored=False, attempts=7, group="g") is not_sent
    refused = BrokerUnavailableError("down")
    assert final_error(refused, maybe_stored=False, attempts=3, group="g") is refused
