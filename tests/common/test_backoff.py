"""KeyedBackoff: doubling per key up to the cap, forgotten on success, bounded in keys."""

from __future__ import annotations

import pytest

from raftmq.common.backoff import KeyedBackoff


def test_a_failed_key_waits_doubling_up_to_the_cap_and_others_do_not() -> None:
    b = KeyedBackoff(1.0, 4.0, 10)
    assert b.ready("a", 0.0)
    waits = []
    now = 0.0
    for _ in range(5):
        waits.append(b.failed("a", now))
        assert not b.ready("a", now + waits[-1] - 0.01)
        now += waits[-1]
        assert b.ready("a", now)
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.ready("b", 0.0)  # another key is not held back


def test_success_forgets_the_key_and_the_next_failure_starts_over() -> None:
    b = KeyedBackoff(1.0, 30.0, 10)
    b.failed("a", 0.0)
    b.failed("a", 1.0)
    b.succeeded("a")
    assert b.ready("a", 1.0) and len(b) == 0
    assert b.failed("a", 2.0) == 1.0


def test_keys_are_bounded_oldest_failure_forgotten_first() -> None:
    b = KeyedBackoff(10.0, 10.0, 3)
    for k in "abcd":
        b.failed(k, 0.0)
    assert len(b) == 3
    assert b.ready("a", 0.0)  # forgotten: tried again early, never kept without bound
    assert not any(b.ready(k, 0.0) for k in "bcd")


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        KeyedBackoff(0.0, 1.0, 1)
    with pytest.raises(ValueError):
        KeyedBackoff(2.0, 1.0, 1)
