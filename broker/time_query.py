"""Query by topic and time range (issue 16, item 6): a topic's messages stored within
[begin_ms, end_ms], one page at a time, queue by queue in offset order, through the time index.

`page_of` is the decision (which rows make the page and where the next one starts) over a
QueueRows seam; `TimeQueryProcessor` reads the store and the CommitLog around it. Changes
nothing. Store times are taken as monotonic per queue (the leader stamps them; the dispatcher's
time index keeps the running maximum), so a queue's scan ends at its first row stored after
end_ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from raftmq.broker.errors import StoreError
from raftmq.broker.rows import CQRow
from raftmq.broker.topics import TopicProcessor
from raftmq.common.errors import InternalError, InvalidArgumentError
from raftmq.common.message import StoredMessage

if TYPE_CHECKING:
    from raftmq.broker.node import BrokerNode

SCAN_ROWS_PER_PAGE = 16_000  # rows one page may look at before it answers (bounded work)


class QueueRows(Protocol):
    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]: ...

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int: ...

    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[CQRow]: ...


@dataclass(frozen=True, slots=True)
class Cursor:
    queue_id: int
    offset: int  # -1: where begin_ms falls in that queue


@dataclass(frozen=True, slots=True)
class RowPage:
    rows: list[CQRow]
    next: Cursor | None  # None: the range is exhausted on this broker group


def page_of(
    rows: QueueRows,
    topic: str,
    queue_count: int,
    begin_ms: int,
    end_ms: int,
    max_count: int,
    start: Cursor,
    *,
    max_scan_rows: int = SCAN_ROWS_PER_PAGE,
) -> RowPage:
    """Up to max_count rows stored within [begin_ms, end_ms], from `start` on."""
    if end_ms < begin_ms:
        raise InvalidArgumentError(f"the range ends ({end_ms}) before it begins ({begin_ms})")
    if max_count < 1:
        raise InvalidArgumentError(f"page size {max_count} must be >= 1")
    if start.queue_id < 0:
        raise InvalidArgumentError(f"page cursor queue {start.queue_id} is negative")
    out: list[CQRow] = []
    scanned = 0
    q, offset = start.queue_id, start.offset
    while q < queue_count:
        low, high = rows.queue_bounds(topic, q)
        at = offset if offset >= 0 else rows.offset_for_timestamp(topic, q, begin_ms)
        at = max(at, low)
        done_with_queue = False
        while at < high:
            if len(out) >= max_count or scanned >= max_scan_rows:
                return RowPage(out, Cursor(q, at))
            want = min(max_count - len(out), max_scan_rows - scanned, 1024)
            batch = rows.read_queue(topic, q, at, want)
            if not batch:
                break
            for row in batch:
                scanned += 1
                at = row.queue_offset + 1
                if row.store_timestamp_ms > end_ms:
                    done_with_queue = True
                    break
                if row.store_timestamp_ms >= begin_ms:
                    out.append(row)
            if done_with_queue:
                break
        q, offset = q + 1, -1
        if len(out) >= max_count and q < queue_count:
            return RowPage(out, Cursor(q, -1))
    return RowPage(out, None)


@dataclass(frozen=True, slots=True)
class MessagePage:
    messages: list[StoredMessage]
    next: Cursor | None


class TimeQueryProcessor:
    def __init__(self, node: BrokerNode, topics: TopicProcessor) -> None:
        self._node = node
        self._topics = topics

    def messages_by_time(
        self, topic: str, begin_ms: int, end_ms: int, max_count: int, start: Cursor
    ) -> MessagePage:
        cfg = self._topics.readable_topic(topic, -1)
        max_count = min(max(max_count, 1), self._node.settings.pull_max_messages)
        page = page_of(
            self._node.store, topic, cfg.read_queue_nums, begin_ms, end_ms, max_count, start
        )
        return MessagePage(self._read(page.rows), page.next)

    def _read(self, rows: Sequence[CQRow]) -> list[StoredMessage]:
        try:
            return self._node.reader.read(rows)
        except StoreError as exc:
            raise InternalError(
                f"node {self._node.me.node_id} cannot read a message: {exc}"
            ) from exc
