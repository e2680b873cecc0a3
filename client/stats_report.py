"""Resource reports as the Admin returns them: every broker node's per-minute rows summed (each
batch is counted once, by the node that served it; leaders move, so every node is asked), with
the minutes without traffic filled in as zeros. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from raftmq.common.errors import InvalidArgumentError

MINUTE_MS = 60_000
UNITS_MS = {"s": 1000, "m": MINUTE_MS, "h": 60 * MINUTE_MS, "d": 24 * 60 * MINUTE_MS}
MAX_REPORT_MINUTES = 7 * 24 * 60 * 5  # the longest range one report spans (5 weeks of minutes)


@dataclass(frozen=True, slots=True)
class Series:
    topic: str
    group: str  # "" = produced to the topic
    counts: tuple[int, ...]  # one per minute of the report, oldest first

    @property
    def total(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True, slots=True)
class StatsReport:
    since_ms: int  # the first minute's start
    until_ms: int  # the end (exclusive) of the last minute
    series: tuple[Series, ...]  # sorted by topic, group
    unanswered: tuple[str, ...] = field(default=())  # "group/node: error": counts missing
    truncated: bool = False  # a node had more rows than one answer holds

    @property
    def minutes(self) -> int:
        return (self.until_ms - self.since_ms) // MINUTE_MS

    def minute_starts(self) -> list[int]:
        return list(range(self.since_ms, self.until_ms, MINUTE_MS))


def parse_duration_ms(text: str) -> int:
    """'90s', '15m', '1h', '7d' (or bare seconds) as milliseconds; '-1h' (the relative form
    `message list --from` takes) means the same as '1h', since a duration here always looks back."""
    t = text.strip().lower().removeprefix("-")
    try:
        unit = UNITS_MS.get(t[-1:], 0)
        value = float(t[:-1]) * unit if unit else float(t) * 1000
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InvalidArgumentError(
            f"duration {text!r}: write a positive number with s, m, h or d (e.g. 15m, 1h, 7d)"
        )
    return int(value)


def report_range(now_ms: int, since_ms: int, until_ms: int | None = None) -> tuple[int, int]:
    """Whole minutes: from the minute holding `now - since` to the end of the minute holding
    `until` (default now), so the current, partial minute is included."""
    end = now_ms if until_ms is None else until_ms
    start = now_ms - since_ms
    lo = start - start % MINUTE_MS
    hi = end - end % MINUTE_MS + MINUTE_MS
    if hi <= lo:
        raise InvalidArgumentError("the report's end is before its start")
    if (hi - lo) // MINUTE_MS > MAX_REPORT_MINUTES:
        raise InvalidArgumentError(
            f"a report spans at most {MAX_REPORT_MINUTES} minutes; ask for a shorter range"
        )
    return lo, hi


def merge(
    rows: Iterable[tuple[int, str, str, int]],
    since_ms: int,
    until_ms: int,
    *,
    unanswered: Iterable[str] = (),
    truncated: bool = False,
) -> StatsReport:
    """(minute_ms, topic, group, count) rows of any number of nodes, summed per minute."""
    n = (until_ms - since_ms) // MINUTE_MS
    acc: dict[tuple[str, str], list[int]] = {}
    for minute, topic, group, count in rows:
        if not since_ms <= minute < until_ms:
            continue
        acc.setdefault((topic, group), [0] * n)[(minute - since_ms) // MINUTE_MS] += count
    return StatsReport(
        since_ms,
        until_ms,
        tuple(Series(t, g, tuple(c)) for (t, g), c in sorted(acc.items())),
        tuple(unanswered),
        truncated,
    )
