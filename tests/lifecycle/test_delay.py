"""Delay levels, delivery times and the horizon: table tests for the rules and their error texts,
and properties of the due time (never before the store time, levels in order)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.common.delay import (
    DAY_MS,
    DEFAULT_DELAY_LEVELS_MS,
    DelayFor,
    DelayLevel,
    DelayPolicy,
    DeliverAt,
    delay_from_properties,
    delay_to_properties,
    format_ms,
    parse_delay_levels,
)
from raftmq.common.errors import InvalidArgumentError, InvalidDelayError

STORE = 1_700_000_000_000
POLICY = DelayPolicy()


def test_rocketmq_levels() -> None:
    s, m, h = 1000, 60_000, 3_600_000
    expected = (
        1 * s, 5 * s, 10 * s, 30 * s,
        1 * m, 2 * m, 3 * m, 4 * m, 5 * m, 6 * m, 7 * m, 8 * m, 9 * m, 10 * m, 20 * m, 30 * m,
        1 * h, 2 * h,
    )  # fmt: skip
    assert expected == DEFAULT_DELAY_LEVELS_MS
    assert POLICY.max_level == 18
    assert POLICY.describe_levels().startswith("1s 5s 10s 30s 1m")
    assert POLICY.max_delay_ms == 7 * DAY_MS


@pytest.mark.parametrize(
    ("spec", "due"),
    [
        (DelayLevel(1), STORE + 1_000),
        (DelayLevel(3), STORE + 10_000),
        (DelayLevel(18), STORE + 7_200_000),
        (DelayFor(0), STORE),
        (DelayFor(1), STORE + 1),
        (DelayFor(7 * DAY_MS), STORE + 7 * DAY_MS),
        (DeliverAt(STORE + 5), STORE + 5),
        (DeliverAt(STORE), STORE),
        (DeliverAt(STORE - 1_000), STORE),  # clock skew within tolerance: due now
        (DeliverAt(STORE + 7 * DAY_MS), STORE + 7 * DAY_MS),
    ],
)
def test_due_times(spec: DelayLevel | DelayFor | DeliverAt, due: int) -> None:
    assert POLICY.due_ms(spec, STORE) == due


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (DelayLevel(0), ["delay level 0 is out of range", "1..18", "1s 5s", "2h"]),
        (DelayLevel(19), ["delay level 19 is out of range", "1..18"]),
        (DelayLevel(-1), ["out of range"]),
        (DelayFor(-1), ["negative", "between now and now + 7d"]),
        (DelayFor(7 * DAY_MS + 1), ["horizon", "max_delay_ms=604800000"]),
        (DeliverAt(-5), ["negative"]),
        (DeliverAt(STORE - 1_001), ["1001 ms in the past", "between now and now + 7d"]),
        (DeliverAt(0), ["in the past"]),
        (DeliverAt(STORE + 7 * DAY_MS + 1), ["past the horizon"]),
    ],
)
def test_bad_delays_are_typed_errors_naming_the_range(
    spec: DelayLevel | DelayFor | DeliverAt, words: list[str]
) -> None:
    with pytest.raises(InvalidDelayError) as info:
        POLICY.due_ms(spec, STORE)
    assert isinstance(info.value, InvalidArgumentError)
    assert info.value.code == "INVALID_DELAY"
    for word in words:
        assert word in info.value.message


def test_configurable_table_and_horizon() -> None:
    fast = DelayPolicy.from_text("10ms 50ms 100ms", max_delay_ms=1_000, past_tolerance_ms=0)
    assert fast.levels_ms == (10, 50, 100)
    assert fast.due_ms(DelayLevel(2), 0) == 50
    with pytest.raises(InvalidDelayError, match=r"1\.\.3 \(10ms 50ms 100ms\)"):
        fast.due_ms(DelayLevel(4), 0)
    with pytest.raises(InvalidDelayError, match="in the past"):
        fast.due_ms(DeliverAt(99), 100)
    with pytest.raises(InvalidDelayError, match="horizon"):
        fast.due_ms(DelayFor(1_001), 0)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"levels_ms": ()}, "empty"),
        ({"levels_ms": (5, 5)}, "longer than level 1"),
        ({"levels_ms": (0,)}, "positive"),
        ({"levels_ms": (10,), "max_delay_ms": 5}, "passes max_delay_ms"),
        ({"max_delay_ms": 0}, "max_delay_ms"),
        ({"past_tolerance_ms": -1}, "past_tolerance_ms"),
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        DelayPolicy(**kwargs)  # type: ignore[arg-type]


def test_level_notation() -> None:
    assert parse_delay_levels("250ms 1s 2m 1h 1d") == (250, 1_000, 120_000, 3_600_000, DAY_MS)
    with pytest.raises(ValueError, match="unit"):
        parse_delay_levels("1s 5x")
    assert [format_ms(v) for v in (1500, 60_000, 7_200_000, 0)] == ["1500ms", "1m", "2h", "0ms"]


@pytest.mark.parametrize(
    ("props", "spec"),
    [
        ({}, None),
        ({"DELAY": "0"}, None),
        ({"DELAY": "3"}, DelayLevel(3)),
        ({"TIMER_DELIVER_MS": "123"}, DeliverAt(123)),
        ({"TIMER_DELAY_MS": "500"}, DelayFor(500)),
        ({"TIMER_DELAY_SEC": "2"}, DelayFor(2_000)),
    ],
)
def test_delay_properties(props: dict[str, str], spec: object) -> None:
    assert delay_from_properties(props) == spec


def test_bad_delay_properties() -> None:
    with pytest.raises(InvalidDelayError, match="more than one"):
        delay_from_properties({"DELAY": "3", "TIMER_DELAY_MS": "5"})
    with pytest.raises(InvalidDelayError, match="not an integer"):
        delay_from_properties({"TIMER_DELIVER_MS": "soon"})


specs = st.one_of(
    st.builds(DelayLevel, st.integers(1, 18)),
    st.builds(DelayFor, st.integers(0, 7 * DAY_MS)),
    st.builds(DeliverAt, st.integers(STORE - 1_000, STORE + 7 * DAY_MS)),
)


@given(specs)
def test_properties_round_trip(spec: DelayLevel | DelayFor | DeliverAt) -> None:
    assert delay_from_properties(delay_to_properties(spec)) == spec


@given(specs, st.integers(0, 1 << 45))
def test_valid_delays_are_never_due_before_store_or_past_horizon(
    spec: DelayLevel | DelayFor | DeliverAt, shift: int
) -> None:
    store = STORE + shift
    if isinstance(spec, DeliverAt):
        spec = DeliverAt(spec.deliver_at_ms + shift)
    due = POLICY.due_ms(spec, store)
    assert store <= due <= store + POLICY.max_delay_ms


@given(st.integers(-(1 << 50), 1 << 50))
def test_any_delivery_time_is_due_in_range_or_refused(at: int) -> None:
    try:
        due = POLICY.due_ms(DeliverAt(at), STORE)
    except InvalidDelayError:
        assert at < STORE - 1_000 or at > STORE + 7 * DAY_MS
    else:
        assert STORE <= due <= STORE + 7 * DAY_MS and due == max(at, STORE)
