"""Range planning of the raftmq Spark source: where reads start, how far one micro-batch goes.

Pure: offsets, queue bounds and times (now_ms) come in as values, plans and typed errors go out.
Never reads a clock or the network, and never drops a queue it once knew from the offsets (a
broker group that is down keeps its position until it is back).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from raftmq.common.types import QueueRef
from raftmq.spark_source.offsets import EARLIEST, LATEST
from raftmq.spark_source.options import FAIL_ON_DATA_LOSS, OptionError, Position, PositionKind


class DataLossError(RuntimeError):
    """Offsets the query planned to read are no longer (or never were) stored."""


@dataclass(frozen=True, slots=True)
class QueueBounds:
    min_offset: int  # first offset still stored
    max_offset: int  # offset the next message will get

    def __post_init__(self) -> None:
        if not 0 <= self.min_offset <= self.max_offset:
            raise ValueError(f"bad queue bounds [{self.min_offset}, {self.max_offset})")


@dataclass(frozen=True, slots=True)
class QueueRange:
    """Offsets [begin, end) of one queue: what one Spark input partition reads."""

    queue: QueueRef
    begin: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.begin


def time_lookups(position: Position, queues: Sequence[QueueRef]) -> dict[QueueRef, int]:
    """Queue -> store time whose first offset the position needs (SearchOffsetByTimestamp)."""
    if position.kind is PositionKind.TIMESTAMP:
        return {q: position.timestamp_ms for q in queues}
    if position.kind is PositionKind.TIMESTAMPS:
        per = position.values()
        return {q: per[q] for q in queues if q in per}
    return {}


def resolve_position(
    position: Position,
    bounds: Mapping[QueueRef, QueueBounds],
    found_by_time: Mapping[QueueRef, int],
    *,
    fallback: PositionKind,
) -> dict[QueueRef, int]:
    """Concrete offsets of every queue in `bounds`. Queues a per-queue position leaves out take
    `fallback` (EARLIEST or LATEST). Per-queue entries must name queues the route has."""
    if position.kind in (PositionKind.OFFSETS, PositionKind.TIMESTAMPS):
        unknown = sorted(set(position.values()) - set(bounds))
        if unknown:
            q = unknown[0]
            raise OptionError(
                f"{position.option} names {q.topic}/{q.broker_group}/{q.queue_id}, which the "
                f"route of topic {q.topic!r} does not have (or its broker group is down)"
            )
    out: dict[QueueRef, int] = {}
    per = position.values()
    for q in sorted(bounds):
        b = bounds[q]
        kind = position.kind
        if kind in (PositionKind.OFFSETS, PositionKind.TIMESTAMPS) and q not in per:
            kind = fallback
        if kind is PositionKind.EARLIEST:
            out[q] = b.min_offset
        elif kind is PositionKind.LATEST:
            out[q] = b.max_offset
        elif kind is PositionKind.OFFSETS:
            value = per[q]
            out[q] = (
                b.min_offset if value == EARLIEST else b.max_offset if value == LATEST else value
            )
        else:
            out[q] = found_by_time[q]
    return out


def proportional(available: Mapping[QueueRef, int], limit: int) -> dict[QueueRef, int]:
    """Split `limit` across queues in proportion to their backlog (largest remainder, ties in
    queue order): the shares add up to min(limit, total) and none exceeds its backlog."""
    if limit < 0:
        raise ValueError("limit must be >= 0")
    total = sum(max(0, a) for a in available.values())
    if total <= limit:
        return {q: max(0, a) for q, a in available.items()}
    shares: dict[QueueRef, int] = {}
    remainders: list[tuple[int, QueueRef]] = []
    for q in sorted(available):
        a = max(0, available[q])
        shares[q], rem = divmod(limit * a, total)
        remainders.append((rem, q))
    left = limit - sum(shares.values())
    # Largest remainder first; among equal remainders the queue that sorts first.
    remainders.sort(key=lambda item: (-item[0], item[1]))
    for _, q in remainders[:left]:
        shares[q] += 1
    return shares


def plan_end(
    start: Mapping[QueueRef, int],
    latest: Mapping[QueueRef, QueueBounds],
    *,
    max_rows: int | None,
    target: Mapping[QueueRef, int] | None = None,
) -> dict[QueueRef, int]:
    """The end offsets of the next micro-batch.

    - Every queue of `start` stays (one that is not in `latest` keeps its offset).
    - A queue new to the query enters at its first stored offset with no rows yet, so the range
      of every batch is fixed by its two offset documents alone (a replay reads the same rows).
    - `target` (Trigger.AvailableNow) caps each queue; queues not in it do not move.
    - `max_rows` is split across queues in proportion to their backlog.
    """
    end = dict(start)
    available: dict[QueueRef, int] = {}
    for q in sorted(latest):
        b = latest[q]
        if target is not None and q not in target:
            continue
        if q not in start:
            end[q] = b.min_offset
            continue
        ceiling = b.max_offset if target is None else min(b.max_offset, target[q])
        available[q] = max(0, ceiling - start[q])
    allot = available if max_rows is None else proportional(available, max_rows)
    for q, n in allot.items():
        end[q] = start[q] + n
    return end


def backlog(start: Mapping[QueueRef, int], end: Mapping[QueueRef, int]) -> int:
    return sum(max(0, e - start.get(q, e)) for q, e in end.items())


def hold_back(
    rows: int,
    *,
    min_rows: int | None,
    last_batch_ms: int,
    now_ms: int,
    max_trigger_delay_ms: int,
) -> bool:
    """minOffsetsPerTrigger: wait for more rows unless maxTriggerDelay has passed."""
    if min_rows is None or rows >= min_rows:
        return False
    return now_ms - last_batch_ms < max_trigger_delay_ms


def plan_ranges(start: Mapping[QueueRef, int], end: Mapping[QueueRef, int]) -> list[QueueRange]:
    """One range per queue that moves, in queue order (so partition ids are stable on replay).
    A queue absent from `start` entered at `end` and reads nothing in this batch."""
    out = []
    for q in sorted(end):
        begin = start.get(q, end[q])
        if end[q] > begin:
            out.append(QueueRange(q, begin, end[q]))
    return out


def task_rows(ranges: Sequence[QueueRange], floor: int, tasks: int) -> int:
    """How many rows ranges sharing one task may hold (group_ranges' min_rows): at least
    `floor`, and at least the batch's rows over `tasks`, so that a big micro-batch runs as
    about `tasks` tasks instead of one per queue (a task launch costs ~ what thousands of rows
    do) and a small one as one. Depends on the ranges alone (a replay plans the same)."""
    if floor < 1 or tasks < 1:
        raise ValueError("floor and tasks must be positive")
    total = sum(r.count for r in ranges)
    return max(floor, -(-total // tasks))


def group_ranges(ranges: Sequence[QueueRange], min_rows: int) -> list[tuple[QueueRange, ...]]:
    """Spark tasks for a batch's ranges: consecutive ranges (queue order) share one task while
    together they hold at most `min_rows`, so a small micro-batch does not pay a task launch per
    queue. Depends on the ranges alone, so a replayed batch gets the same partitions."""
    out: list[tuple[QueueRange, ...]] = []
    current: list[QueueRange] = []
    rows = 0
    for r in ranges:
        if current and rows + r.count > min_rows:
            out.append(tuple(current))
            current, rows = [], 0
        current.append(r)
        rows += r.count
    if current:
        out.append(tuple(current))
    return out


def check_start(
    queue: QueueRef, offset: int, bounds: QueueBounds, *, fail_on_data_loss: bool
) -> int:
    """Where a query whose position is `offset` may go on, given the queue's bounds now."""
    if bounds.min_offset <= offset <= bounds.max_offset:
        return offset
    where = f"{queue.topic}/{queue.broker_group}/{queue.queue_id}"
    if offset < bounds.min_offset:
        if fail_on_data_loss:
            raise DataLossError(
                f"{where}: offsets {offset}..{bounds.min_offset - 1} are no longer stored "
                f"(retention deleted them); set {FAIL_ON_DATA_LOSS}=false to skip them"
            )
        return bounds.min_offset
    if fail_on_data_loss:
        raise DataLossError(
            f"{where}: the query is at offset {offset} but the queue ends at "
            f"{bounds.max_offset} (was the topic deleted and created again?); "
            f"set {FAIL_ON_DATA_LOSS}=false to go on from the queue's end"
        )
    return bounds.max_offset


def split_ranges(
    ranges: Sequence[QueueRange], *, min_partitions: int | None, max_rows: int
) -> list[QueueRange]:
    """Cut ranges into more Spark tasks, so that both cores of a machine (or every executor)
    read a backlog that sits in few queues:
    - `min_partitions` (Kafka's minPartitions): when the ranges are fewer, each is cut into
      round(its share of the rows x min_partitions) pieces (at least 1), as Kafka's source does;
    - any piece still longer than `max_rows` is cut into equal pieces of at most `max_rows`.
    Depends on the ranges alone (a replayed batch gets the same tasks); pieces stay in queue
    and offset order, and together cover each range exactly."""
    if max_rows < 1:
        raise ValueError("max_rows must be >= 1")
    total = sum(r.count for r in ranges)
    out: list[QueueRange] = []
    for r in ranges:
        pieces = 1
        if min_partitions is not None and len(ranges) < min_partitions and total:
            # Kafka: math.round(size / total * minPartitions), at least 1 (half rounds up).
            pieces = max(1, (2 * r.count * min_partitions + total) // (2 * total))
        pieces = min(r.count, max(pieces, -(-r.count // max_rows)))
        for i in range(pieces):
            begin = r.begin + r.count * i // pieces
            end = r.begin + r.count * (i + 1) // pieces
            out.append(QueueRange(r.queue, begin, end))
    return out
