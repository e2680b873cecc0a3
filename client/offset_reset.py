"""Offset resets as kafka-consumer-groups and mqadmin's resetOffsetByTime offer them: where
each queue of a group goes for a target (earliest, latest, an offset, a shift, a time), as a
plan shown with --dry-run before --execute. Pure: bounds, committed offsets and time lookups
are passed in; the Admin does the calls.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from raftmq.common.errors import InvalidArgumentError
from raftmq.common.pb import broker_pb2
from raftmq.common.types import QueueRef


class ResetTo(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    OFFSET = "offset"  # value: the offset
    SHIFT = "shift"  # value: added to the committed offset (negative: back)
    TIME = "time"  # value: ms since the epoch; the first message stored at or after it


@dataclass(frozen=True, slots=True)
class ResetTarget:
    kind: ResetTo
    value: int = 0

    def __post_init__(self) -> None:
        if self.kind in (ResetTo.OFFSET, ResetTo.TIME) and self.value < 0:
            raise InvalidArgumentError(
                f"a reset to {self.kind.value} {self.value}: the value must be >= 0"
            )

    def describe(self) -> str:
        if self.kind in (ResetTo.EARLIEST, ResetTo.LATEST):
            return str(self.kind.value)
        if self.kind is ResetTo.SHIFT:
            return f"shift by {self.value:+d}"
        return f"{self.kind.value} {self.value}"


@dataclass(frozen=True, slots=True)
class QueueReset:
    """One row of a plan: the queue, its committed offset now (None: never committed), its
    bounds, and where the reset puts it."""

    queue: QueueRef
    current: int | None
    min_offset: int
    max_offset: int
    new: int

    @property
    def change(self) -> int | None:
        return None if self.current is None else self.new - self.current


def target_offset(
    target: ResetTarget,
    committed: int | None,
    low: int,
    high: int,
    time_offset: int | None = None,
) -> int:
    """Where one queue goes, always within [low, high] (high: the next message's offset). A
    shift of a queue the group never committed on starts from `low`, as its lag does.
    `time_offset` is the broker's answer for a TIME target (first offset at or after it)."""
    if low > high:
        raise ValueError(f"bounds [{low}, {high}] are inverted")
    if target.kind is ResetTo.EARLIEST:
        want = low
    elif target.kind is ResetTo.LATEST:
        want = high
    elif target.kind is ResetTo.OFFSET:
        want = target.value
    elif target.kind is ResetTo.SHIFT:
        want = (low if committed is None else committed) + target.value
    else:
        if time_offset is None:
            raise ValueError("a TIME target needs the broker's offset for the time")
        want = time_offset
    return min(max(want, low), high)


MAX_SEEN_RESETS = 1024  # reset ids remembered by one consumer


class SeenResets:
    """Which administrative resets a running consumer has already followed. Heartbeat answers
    repeat a reset for minutes and every node of a broker group answers it: each (broker group,
    reset id) is taken once. Resets already announced in the consumer's first answer predate it
    (its start offsets include them) and are only marked seen."""

    def __init__(self, max_seen: int = MAX_SEEN_RESETS) -> None:
        self._seen: dict[tuple[str, int], None] = {}  # insertion order: oldest first
        self._max = max_seen
        self._primed = False

    def take(self, resets: Iterable[broker_pb2.OffsetReset]) -> dict[QueueRef, int]:
        """The queue -> offset moves to make now (a later reset of a queue wins)."""
        moves: dict[QueueRef, int] = {}
        fresh: list[tuple[str, int]] = []
        for r in sorted(resets, key=lambda r: r.reset_id):
            key = (r.broker_group, r.reset_id)
            if key in self._seen:
                continue
            if key not in fresh:
                fresh.append(key)
            if self._primed:
                moves[QueueRef(r.topic, r.broker_group, r.queue_id)] = r.offset
        for key in fresh:
            self._seen[key] = None
        while len(self._seen) > self._max:
            del self._seen[next(iter(self._seen))]
        return moves

    def prime(self) -> None:
        """From now on new resets are followed (call after the first answered heartbeat)."""
        self._primed = True
