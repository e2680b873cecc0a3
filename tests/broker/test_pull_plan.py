"""The pull decision as a table: bounds, dispatch progress, offset and clock in; a step out."""

from __future__ import annotations

import pytest

from raftmq.broker.pull_plan import (
    DISPATCH_CATCHUP_MS,
    LONG_POLL_SLICE_MS,
    CatchUp,
    NoNewMessage,
    OutOfRange,
    PullStep,
    Read,
    WaitForMessage,
    keep_polling_after_empty_scan,
    pull_plan,
)

NOW = 10_000


@pytest.mark.parametrize(
    ("case", "bounds", "dispatched", "committed", "offset", "deadline", "caught_up", "step"),
    [
        ("messages at the offset", (0, 10), 5, 5, 3, NOW + 500, False, Read()),
        ("first message", (0, 10), 5, 5, 0, NOW, False, Read()),
        ("last message, deadline gone", (4, 10), 5, 5, 9, NOW - 1, False, Read()),
        ("at the end, time left", (0, 10), 5, 5, 10, NOW + 300, False, WaitForMessage(300)),
        (
            "at the end, long wait sliced",
            (0, 10),
            5,
            5,
            10,
            NOW + 30_000,
            False,
            WaitForMessage(LONG_POLL_SLICE_MS),
        ),
        ("at the end, deadline now", (0, 10), 5, 5, 10, NOW, False, NoNewMessage()),
        ("at the end, deadline past", (0, 10), 5, 5, 10, NOW - 5, False, NoNewMessage()),
        (
            "at the end, out of time, unindexed (answered at commit)",
            (0, 10),
            5,
            9,
            10,
            NOW - 5,
            False,
            CatchUp(9, DISPATCH_CATCHUP_MS),
        ),
        ("at the end, out of time, caught up once", (0, 10), 8, 9, 10, NOW, True, NoNewMessage()),
        ("empty queue, time left", (0, 0), 5, 5, 0, NOW + 50, False, WaitForMessage(50)),
        ("below the start", (4, 10), 5, 5, 3, NOW + 500, False, OutOfRange(4, 10)),
        ("below the start, unindexed", (4, 10), 5, 9, 3, NOW + 500, False, OutOfRange(4, 10)),
        ("past the end, indexed", (0, 10), 9, 9, 12, NOW + 500, False, OutOfRange(0, 10)),
        (
            "past the end, unindexed",
            (0, 10),
            7,
            9,
            12,
            NOW + 500,
            False,
            CatchUp(9, DISPATCH_CATCHUP_MS),
        ),
        ("past the end, caught up once", (0, 10), 8, 9, 12, NOW + 500, True, OutOfRange(0, 10)),
        (
            "past the end, unindexed, deadline gone",
            (0, 10),
            7,
            9,
            12,
            NOW - 1,
            False,
            CatchUp(9, DISPATCH_CATCHUP_MS),
        ),
    ],
)
def test_pull_plan(
    case: str,
    bounds: tuple[int, int],
    dispatched: int,
    committed: int,
    offset: int,
    deadline: int,
    caught_up: bool,
    step: PullStep,
) -> None:
    got = pull_plan(bounds, dispatched, committed, offset, NOW, deadline, caught_up=caught_up)
    assert got == step, case


@pytest.mark.parametrize(
    ("next_offset", "high", "deadline", "keep"),
    [
        (10, 10, NOW + 100, True),  # scanned to the end with time left: long-poll
        (10, 10, NOW, False),  # out of time: NO_MATCHED_MSG
        (7, 10, NOW + 100, False),  # hit the scan limit below the end: answer, move on
    ],
)
def test_after_an_empty_filtered_scan(
    next_offset: int, high: int, deadline: int, keep: bool
) -> None:
    assert keep_polling_after_empty_scan(next_offset, high, NOW, deadline) is keep
