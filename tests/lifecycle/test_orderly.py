"""The orderly process queue: one message at a time in queue order, only under a valid lock,
suspend and retry the same message on failure, dead-letter past the limit; and a property test
over random listener outcomes and clock steps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.client.orderly import OrderlyProcessQueue, Verdict


def queue(**kw: int) -> OrderlyProcessQueue[str]:
    pq: OrderlyProcessQueue[str] = OrderlyProcessQueue(10, **kw)
    pq.lock_granted(0)
    return pq


def test_one_at_a_time_in_order() -> None:
    pq = queue()
    pq.add([(10, "a"), (11, "b"), (13, "c")], next_offset=14)
    assert pq.take(0) == (10, "a")
    assert pq.take(0) is None, "a is still in the listener"
    assert pq.consumed_offset() == 10
    assert pq.succeeded(10).verdict is Verdict.NEXT
    assert pq.consumed_offset() == 11
    assert pq.take(0) == (11, "b")
    pq.succeeded(11)
    assert pq.take(0) == (13, "c")
    pq.succeeded(13)
    assert pq.consumed_offset() == 14 and pq.take(0) is None
    with pytest.raises(ValueError, match="not the message in the listener"):
        pq.succeeded(13)


def test_failure_suspends_and_retries_the_same_message_then_dead_letters() -> None:
    pq = queue(max_reconsume_times=2, suspend_ms=1_000)
    pq.add([(10, "a"), (11, "b")], 12)
    assert pq.take(0) == (10, "a")
    step = pq.failed(10, now_ms=5)
    assert step.verdict is Verdict.RETRY and step.retry_at_ms == 1_005 and step.attempts == 1
    assert pq.take(1_004) is None and pq.wake_at_ms() == 1_005
    assert pq.take(1_005) == (10, "a"), "the same message, not the next"
    assert pq.failed(10, 1_005).verdict is Verdict.RETRY
    assert pq.take(2_005) == (10, "a")
    dead = pq.failed(10, 2_005)
    assert dead.verdict is Verdict.DEAD_LETTER and dead.attempts == 3
    assert pq.take(9_999) is None, "held until the DLQ send is done"
    assert pq.dead_letter_failed(10, 3_000).verdict is Verdict.RETRY
    assert pq.take(4_000) == (10, "a")
    assert pq.failed(10, 4_000).verdict is Verdict.DEAD_LETTER
    assert pq.dead_lettered(10).verdict is Verdict.NEXT
    assert pq.attempts() == 0 and pq.take(4_000) == (11, "b")


def test_nothing_without_a_valid_lock_or_after_drop() -> None:
    pq: OrderlyProcessQueue[str] = OrderlyProcessQueue(0, lock_live_ms=30_000)
    pq.add([(0, "a")], 1)
    assert pq.take(0) is None, "never locked"
    pq.lock_granted(100)
    assert not pq.lock_renew_due(100 + 19_999) and pq.lock_renew_due(100 + 20_000)
    assert pq.take(30_099) == (0, "a")
    pq.succeeded(0)
    pq.add([(1, "b")], 2)
    assert pq.take(30_100) is None, "the client's lock view expired (broker lease is longer)"
    pq.lock_granted(30_100)
    pq.lock_lost()
    assert pq.take(30_100) is None
    pq.lock_granted(30_200)
    pq.drop()
    assert pq.take(30_200) is None and pq.consumed_offset() == 1


def test_fetches_move_forward() -> None:
    pq = queue()
    pq.add([], next_offset=20)
    assert pq.consumed_offset() == 20, "filtered out: nothing to wait for"
    with pytest.raises(ValueError, match="forward"):
        pq.add([(19, "x")], 21)
    with pytest.raises(ValueError, match="above"):
        pq.add([(25, "x")], 25)
    with pytest.raises(ValueError):
        OrderlyProcessQueue(-1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=30),  # gaps between offsets
    st.lists(st.sampled_from(["ok", "fail", "dlq_fail"]), max_size=200),
    st.integers(0, 4),
)
def test_order_kept_each_message_finished_once(
    gaps: list[int], outcomes: list[str], limit: int
) -> None:
    offsets: list[int] = []
    off = 10
    for g in gaps:
        off += g
        offsets.append(off)
        off += 1
    pq = queue(max_reconsume_times=limit, suspend_ms=100)
    pq.add([(o, f"m{o}") for o in offsets], next_offset=off)
    now = 0
    finished: list[int] = []
    handed: list[int] = []
    script = iter(outcomes)
    for _ in range(len(offsets) * (limit + 3) * 2 + 10):
        item = pq.take(now)
        if item is None:
            now = max(now, pq.wake_at_ms())
            item = pq.take(now)
            if item is None:
                break
        offset = item[0]
        assert not handed or offset >= handed[-1], "never backwards"
        handed.append(offset)
        assert pq.busy and pq.take(now) is None, "never two at once"
        outcome = next(script, "ok")
        step = pq.succeeded(offset) if outcome == "ok" else pq.failed(offset, now)
        if step.verdict is Verdict.DEAD_LETTER:
            assert step.attempts >= limit + 1
            step = (
                pq.dead_letter_failed(offset, now)
                if next(script, "ok") == "dlq_fail"
                else pq.dead_lettered(offset)
            )
        if step.verdict is Verdict.NEXT:
            finished.append(offset)
        assert pq.consumed_offset() == (
            offsets[len(finished)] if len(finished) < len(offsets) else off
        )
    assert finished == offsets, "each message finished once, in order"
