"""Retry back-off and dead letters: RocketMQ's level schedule (3 + reconsume count, capped), the
limit, and the reserved properties a sent-back message carries across retries and the DLQ."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.common.delay import DelayPolicy
from raftmq.common.group_config import USE_CONSUMER_LIMIT, max_delivery_attempts
from raftmq.common.message import SYSTEM_PROPERTY_NAMES, Message, StoredMessage
from raftmq.common.retry import (
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    RetryKind,
    RetryPolicy,
    original_topic,
    reconsume_times,
    resend_from_dlq,
    send_back,
)

S, M, H = 1_000, 60_000, 3_600_000


def stored(msg: Message, msg_id: str = "broker-a-00") -> StoredMessage:
    return StoredMessage(msg, "broker-a", 0, 0, msg_id, 0, 1, 0, 0)


def test_rocketmq_back_off_schedule() -> None:
    policy = RetryPolicy()
    delays = [policy.decide("g", n).delay_ms for n in range(16)]
    assert delays[:6] == [10 * S, 30 * S, 1 * M, 2 * M, 3 * M, 4 * M]
    assert delays[-3:] == [30 * M, 1 * H, 2 * H], "the 16th retry waits the last level"
    assert RetryPolicy(max_reconsume_times=30).decide("g", 25).delay_ms == 2 * H, "capped"
    assert [policy.delay_level(n) for n in (0, 1, 15, 100)] == [3, 4, 18, 18]
    dead = policy.decide("g", 16)
    assert dead.kind is RetryKind.DEAD_LETTER and dead.topic == "%DLQ%g"
    assert policy.decide("g", 15).topic == "%RETRY%g"


def test_configurable_limit_and_levels() -> None:
    policy = RetryPolicy(
        max_reconsume_times=2, start_level=1, delay=DelayPolicy.from_text("10ms 20ms")
    )
    assert [policy.decide("g", n).delay_ms for n in (0, 1)] == [10, 20]
    assert policy.decide("g", 2).kind is RetryKind.DEAD_LETTER
    assert RetryPolicy(max_reconsume_times=0).decide("g", 0).kind is RetryKind.DEAD_LETTER
    with pytest.raises(ValueError, match="start_level"):
        RetryPolicy(start_level=19)
    with pytest.raises(ValueError, match="max_reconsume_times"):
        RetryPolicy(max_reconsume_times=-1)


def test_retried_message_carries_origin_count_and_level() -> None:
    original = Message("orders", b"x", tags="t", keys=("k",), properties={"a": "1"})
    back, decision = send_back(stored(original, "broker-a-01"), "g", RetryPolicy())
    assert back.topic == "%RETRY%g" and back.body == b"x" and back.keys == ("k",)
    assert back.properties[PROPERTY_RETRY_TOPIC] == "orders"
    assert back.properties[PROPERTY_ORIGIN_MESSAGE_ID] == "broker-a-01"
    assert back.properties[PROPERTY_RECONSUME_TIME] == "1"
    assert back.properties["DELAY"] == "3" and back.properties["a"] == "1"
    assert decision.delay_ms == 10 * S
    assert set(back.properties) - {"a"} <= SYSTEM_PROPERTY_NAMES, "reserved names only"
    assert original_topic(back) == "orders"

    # delivered again from %RETRY%g under a new id: the origin id and topic stay the first ones
    again, decision = send_back(stored(back, "broker-a-02"), "g", RetryPolicy())
    assert again.properties[PROPERTY_ORIGIN_MESSAGE_ID] == "broker-a-01"
    assert again.properties[PROPERTY_RETRY_TOPIC] == "orders"
    assert reconsume_times(again.properties) == 2 and decision.delay_level == 4


@given(st.integers(0, 40), st.integers(0, 20))
def test_chain_of_failures_ends_in_the_dlq_once(limit: int, extra: int) -> None:
    policy = RetryPolicy(max_reconsume_times=limit)
    msg = Message("orders", b"body", properties={"user": "v"})
    topics = []
    for n in range(limit + 1 + extra):
        msg, decision = send_back(stored(msg, f"broker-a-{n:02d}"), "g", policy)
        topics.append(msg.topic)
        if decision.kind is RetryKind.DEAD_LETTER:
            break
    assert topics == ["%RETRY%g"] * limit + ["%DLQ%g"]
    assert msg.properties[PROPERTY_DLQ_ORIGIN_TOPIC] == "orders"
    assert msg.properties[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] == "broker-a-00"
    assert reconsume_times(msg.properties) == limit + 1
    assert "DELAY" not in msg.properties
    resent = resend_from_dlq(msg)
    assert resent.topic == "orders" and resent.body == b"body"
    assert reconsume_times(resent.properties) == 0 and resent.properties["user"] == "v"
    assert PROPERTY_RETRY_TOPIC not in resent.properties


def test_unreadable_count_is_zero() -> None:
    assert reconsume_times({PROPERTY_RECONSUME_TIME: "x"}) == 0
    assert reconsume_times({PROPERTY_RECONSUME_TIME: "-3"}) == 0


def test_dead_letter_now_ignores_the_limit() -> None:
    """The proxy's POP dead letters (DEAD_LETTER_NOW): the group's limit was applied already by
    counting deliveries, and the message's own count is 0, so the policy must not weigh it."""
    msg = Message("orders", b"x")
    policy = RetryPolicy(max_reconsume_times=5)
    assert send_back(stored(msg), "g", policy, counted=2)[1].kind is RetryKind.RETRY
    back, decision = send_back(stored(msg), "g", policy, counted=2, dead_letter=True)
    assert decision.kind is RetryKind.DEAD_LETTER and back.topic == "%DLQ%g"
    assert back.properties[PROPERTY_RECONSUME_TIME] == "3"
    assert back.properties[PROPERTY_DLQ_ORIGIN_TOPIC] == "orders"


def test_pop_max_delivery_attempts_is_retry_limit_plus_one() -> None:
    """RocketMQ 5's proxy: max attempts = the group's retryMaxTimes + 1; unset, the fallback."""
    assert max_delivery_attempts(0, 16) == 1
    assert max_delivery_attempts(3, 16) == 4
    assert max_delivery_attempts(USE_CONSUMER_LIMIT, 16) == 16
