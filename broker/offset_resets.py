"""Recent administrative offset resets of a node, so that running consumers learn of them
(RocketMQ's broker tells the group's clients to reset; here each heartbeat answer carries them).

Soft state, like consumer membership: filled from dispatched reset rows (every node of a group
dispatches the same entries, so every node answers the same resets with the same ids), bounded
in count and age, forgotten on restart. Pure: time is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from raftmq.broker.rows import OffsetRow

DEFAULT_KEEP_MS = 180_000  # longer than any consumer's heartbeat interval (10 s by default)
DEFAULT_MAX_RESETS = 1024  # (group, topic, reset) entries kept; the oldest goes first


@dataclass(frozen=True, slots=True)
class ResetOrder:
    reset_id: int  # raft index of the reset entry
    group: str
    topic: str
    offsets: tuple[tuple[int, int], ...]  # (queue id, offset), sorted
    recorded_ms: int


class ResetBook:
    def __init__(
        self, *, keep_ms: int = DEFAULT_KEEP_MS, max_resets: int = DEFAULT_MAX_RESETS
    ) -> None:
        if keep_ms <= 0 or max_resets <= 0:
            raise ValueError("keep_ms and max_resets must be > 0")
        self._keep_ms = keep_ms
        self._max = max_resets
        self._orders: OrderedDict[tuple[int, str, str], ResetOrder] = OrderedDict()

    def record(self, raft_index: int, rows: Iterable[OffsetRow], now_ms: int) -> None:
        """The reset rows of one dispatched entry (commit rows are ignored)."""
        by_key: dict[tuple[str, str], list[tuple[int, int]]] = {}
        for row in rows:
            if row.reset:
                by_key.setdefault((row.group, row.topic), []).append((row.queue_id, row.offset))
        for (group, topic), offsets in by_key.items():
            key = (raft_index, group, topic)
            self._orders[key] = ResetOrder(raft_index, group, topic, tuple(sorted(offsets)), now_ms)
            self._orders.move_to_end(key)
        while len(self._orders) > self._max:
            self._orders.popitem(last=False)

    def pending(self, group: str, topics: Iterable[str], now_ms: int) -> list[ResetOrder]:
        """The kept resets of `group` on any of `topics`, oldest first."""
        self._expire(now_ms)
        wanted = set(topics)
        return [o for o in self._orders.values() if o.group == group and o.topic in wanted]

    def __len__(self) -> int:
        return len(self._orders)

    def _expire(self, now_ms: int) -> None:
        while self._orders:
            oldest = next(iter(self._orders.values()))
            if now_ms - oldest.recorded_ms < self._keep_ms:
                return
            self._orders.popitem(last=False)
