"""Delayed delivery rules: RocketMQ 4's delay levels, RocketMQ 5's delivery at a time in ms, the
horizon, and the due time of a message. Pure: no clock is read (now_ms and the store time are
passed in), nothing is kept; a bad request raises InvalidDelayError naming the allowed range.

It lives in the floor because both sides use it: the SDK checks a delay before sending, the broker
checks it again at store time and computes the due time, and the retry back-off is a delay level.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from raftmq.common.errors import InvalidDelayError

SECOND_MS = 1_000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS

# RocketMQ's MessageStoreConfig.messageDelayLevel, in its own notation.
DEFAULT_DELAY_LEVELS_TEXT = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DEFAULT_MAX_DELAY_MS = 7 * DAY_MS  # RocketMQ 5 has timerMaxDelaySec (3 d); the issue asks for 7 d
DEFAULT_PAST_TOLERANCE_MS = 1_000  # a delivery time this little in the past is producer clock skew

# The reserved message properties that carry a delay (RocketMQ's MessageConst names).
PROPERTY_DELAY_LEVEL = "DELAY"
PROPERTY_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_DELAY_SEC = "TIMER_DELAY_SEC"

_UNIT_MS = {"ms": 1, "s": SECOND_MS, "m": MINUTE_MS, "h": HOUR_MS, "d": DAY_MS}
_LEVEL_RE = re.compile(r"([0-9]+)(ms|s|m|h|d)")


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """RocketMQ's messageDelayLevel notation ("1s 5s 10s ... 2h") as milliseconds per level."""
    levels: list[int] = []
    for item in text.split():
        match = _LEVEL_RE.fullmatch(item)
        if match is None:
            raise ValueError(
                f"delay level {item!r} is not a number with a unit (ms, s, m, h, d), e.g. '30s'"
            )
        levels.append(int(match.group(1)) * _UNIT_MS[match.group(2)])
    return tuple(levels)


def format_ms(ms: int) -> str:
    """The largest whole unit that fits: 7200000 -> '2h', 1500 -> '1500ms'."""
    for unit in ("d", "h", "m", "s"):
        size = _UNIT_MS[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


DEFAULT_DELAY_LEVELS_MS = parse_delay_levels(DEFAULT_DELAY_LEVELS_TEXT)


@dataclass(frozen=True, slots=True)
class DelayLevel:
    """RocketMQ 4: one of the configured levels, 1-based (level 3 is 10 s by default)."""

    level: int


@dataclass(frozen=True, slots=True)
class DelayFor:
    """RocketMQ 5 TIMER_DELAY_MS: deliver this long after the message is stored."""

    delay_ms: int


@dataclass(frozen=True, slots=True)
class DeliverAt:
    """RocketMQ 5 TIMER_DELIVER_MS: deliver at this absolute time (ms since the epoch)."""

    deliver_at_ms: int


DelaySpec = DelayLevel | DelayFor | DeliverAt


@dataclass(frozen=True, slots=True)
class DelayPolicy:
    """The level table and the horizon; one per broker (and a copy in the SDK for early checks).

    `levels_ms` must be positive and strictly increasing (the retry back-off relies on it) and
    none may pass `max_delay_ms`. A delivery time up to `past_tolerance_ms` before now is taken
    as now (the producer's clock is a little behind the broker's); further back it is refused.
    """

    levels_ms: tuple[int, ...] = DEFAULT_DELAY_LEVELS_MS
    max_delay_ms: int = DEFAULT_MAX_DELAY_MS
    past_tolerance_ms: int = DEFAULT_PAST_TOLERANCE_MS

    def __post_init__(self) -> None:
        if not self.levels_ms:
            raise ValueError("the delay level table is empty")
        if self.max_delay_ms <= 0:
            raise ValueError(f"max_delay_ms must be positive, got {self.max_delay_ms}")
        if self.past_tolerance_ms < 0:
            raise ValueError(f"past_tolerance_ms must be >= 0, got {self.past_tolerance_ms}")
        previous = 0
        for i, ms in enumerate(self.levels_ms, start=1):
            if ms <= previous:
                raise ValueError(
                    f"delay level {i} ({ms} ms) must be positive and longer than level {i - 1}"
                )
            previous = ms
        if previous > self.max_delay_ms:
            raise ValueError(
                f"the last delay level ({format_ms(previous)}) passes max_delay_ms "
                f"({format_ms(self.max_delay_ms)})"
            )

    @classmethod
    def from_text(cls, levels: str, **kwargs: int) -> DelayPolicy:
        return cls(levels_ms=parse_delay_levels(levels), **kwargs)

    @property
    def max_level(self) -> int:
        return len(self.levels_ms)

    def describe_levels(self) -> str:
        return " ".join(format_ms(ms) for ms in self.levels_ms)

    def level_delay_ms(self, level: int) -> int:
        """The delay of a level; InvalidDelayError outside 1..max_level."""
        if not 1 <= level <= self.max_level:
            raise InvalidDelayError(
                f"delay level {level} is out of range; the allowed levels are 1..{self.max_level} "
                f"({self.describe_levels()})",
                details={"level": str(level), "min_level": "1", "max_level": str(self.max_level)},
            )
        return self.levels_ms[level - 1]

    def due_ms(self, spec: DelaySpec, store_ms: int) -> int:
        """When a message stored at `store_ms` with delay `spec` falls due; raises
        InvalidDelayError for a request outside the rules (store_ms is "now" for the check).
        Deterministic: a replica applying the entry with its store time gets the same answer."""
        if isinstance(spec, DelayLevel):
            return store_ms + self.level_delay_ms(spec.level)
        if isinstance(spec, DelayFor):
            if spec.delay_ms < 0:
                raise self._range_error(f"delay {spec.delay_ms} ms is negative", spec.delay_ms)
            if spec.delay_ms > self.max_delay_ms:
                raise self._range_error(
                    f"delay {format_ms(spec.delay_ms)} passes the horizon", spec.delay_ms
                )
            return store_ms + spec.delay_ms
        at = spec.deliver_at_ms
        if at < 0:
            raise self._range_error(f"delivery time {at} is negative", at - store_ms)
        if at < store_ms - self.past_tolerance_ms:
            raise self._range_error(
                f"delivery time {at} is {store_ms - at} ms in the past (now is {store_ms})",
                at - store_ms,
            )
        if at - store_ms > self.max_delay_ms:
            raise self._range_error(
                f"delivery time {at} is {format_ms(at - store_ms)} ahead, past the horizon",
                at - store_ms,
            )
        return max(at, store_ms)

    def _range_error(self, what: str, delay_ms: int) -> InvalidDelayError:
        return InvalidDelayError(
            f"{what}; a delivery time must lie between now and now + "
            f"{format_ms(self.max_delay_ms)} (max_delay_ms={self.max_delay_ms})",
            details={"delay_ms": str(delay_ms), "max_delay_ms": str(self.max_delay_ms)},
        )


def delay_from_properties(properties: Mapping[str, str]) -> DelaySpec | None:
    """The delay a message asks for through its reserved properties, or None (not delayed).

    Level 0 means "not delayed", as in RocketMQ. More than one delay property, or a value that is
    not an integer, is an InvalidDelayError: the broker must not guess which one was meant.
    """
    present = [
        name
        for name in (
            PROPERTY_DELAY_LEVEL,
            PROPERTY_DELIVER_MS,
            PROPERTY_DELAY_MS,
            PROPERTY_DELAY_SEC,
        )
        if name in properties
    ]
    if not present:
        return None
    if len(present) > 1:
        raise InvalidDelayError(
            f"a message carries more than one delay property ({', '.join(present)}); set one",
            details={"properties": ",".join(present)},
        )
    name = present[0]
    text = properties[name]
    try:
        value = int(text)
    except ValueError:
        raise InvalidDelayError(
            f"delay property {name}={text!r} is not an integer", details={"property": name}
        ) from None
    if name == PROPERTY_DELAY_LEVEL:
        return DelayLevel(value) if value != 0 else None
    if name == PROPERTY_DELIVER_MS:
        return DeliverAt(value)
    if name == PROPERTY_DELAY_MS:
        return DelayFor(value)
    return DelayFor(value * SECOND_MS)


def delay_to_properties(spec: DelaySpec) -> dict[str, str]:
    """The reserved property that carries `spec` (the SDK sets it; the inverse of the above)."""
    if isinstance(spec, DelayLevel):
        return {PROPERTY_DELAY_LEVEL: str(spec.level)}
    if isinstance(spec, DelayFor):
        return {PROPERTY_DELAY_MS: str(spec.delay_ms)}
    return {PROPERTY_DELIVER_MS: str(spec.deliver_at_ms)}
