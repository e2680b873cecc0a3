"""OffsetProcessor: consumer offsets (commit, query, reset to a time) and queue bounds by offset
and timestamp (RocketMQ's ConsumerManageProcessor and the offset half of its admin processor).

Committed offsets are replicated state (invariant 5): commits and resets go through the node's
leader gate and the log; queries read this node's store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftmq.broker.rows import ChunkOutcome, Rejected
from raftmq.broker.topics import TopicProcessor
from raftmq.common import record_batch
from raftmq.common.errors import InvalidArgumentError
from raftmq.common.message import validate_group, validate_topic
from raftmq.common.record_batch import CommitOffset, ResetOffsets
from raftmq.common.types import MAX_QUEUE_ID

if TYPE_CHECKING:
    from raftmq.broker.node import BrokerNode

MAX_OFFSETS_PER_COMMIT = 4096


@dataclass(frozen=True, slots=True)
class QueueInfo:
    queue_id: int
    min_offset: int
    max_offset: int
    min_store_timestamp_ms: int  # 0 = empty
    max_store_timestamp_ms: int  # 0 = empty


class OffsetProcessor:
    def __init__(self, node: BrokerNode, topics: TopicProcessor) -> None:
        self._node = node
        self._topics = topics
        self._store = node.store
        self._settings = node.settings

    def commit_offsets(self, group: str, offsets: Sequence[tuple[str, int, int]]) -> None:
        """Store (topic, queue id, offset) triples of a consumer group, one entry each."""
        payloads = self.commit_payloads(group, offsets)
        if payloads:
            self.check_commit(self._node.replicate(payloads, self.commit_timeout_s))

    @property
    def commit_timeout_s(self) -> float:
        return self._settings.send_timeout_ms / 1000

    def check_commit(self, outcomes: Sequence[ChunkOutcome]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Rejected):
                raise InvalidArgumentError(f"offset commit refused: {outcome.reason}")

    def commit_payloads(self, group: str, offsets: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """The checks of a commit and its entries to replicate (none for no offsets); passes
        the leader gate (which may wait: see `BrokerNode.leader_gate_open`)."""
        validate_group(group)
        if not offsets:
            return []
        if len(offsets) > MAX_OFFSETS_PER_COMMIT:
            raise InvalidArgumentError(
                f"{len(offsets)} offsets in one commit; the limit is {MAX_OFFSETS_PER_COMMIT}"
            )
        for topic, queue_id, offset in offsets:
            validate_topic(topic, allow_system=True)
            if not 0 <= queue_id <= MAX_QUEUE_ID or offset < 0:
                raise InvalidArgumentError(
                    f"offset {offset} of {topic}/{queue_id}: queue id and offset must be >= 0"
                )
        self._node.require_leader()
        # An offset this node already stores is not logged again (issue 14: a thousand idle
        # consumers committing unchanged offsets every second made a thousand Raft entries a
        # second). A commit is answered once the dispatcher has applied it, so a committer's
        # own earlier commits are in this store; one racing it from another client could land
        # either side of it anyway.
        stored = self._store.committed_offsets_of(group, [(t, q) for t, q, _ in offsets])
        return [
            record_batch.encode(CommitOffset(group, t, q, o))
            for (t, q, o), now in zip(offsets, stored, strict=True)
            if now != o
        ]

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset of the queue; -1 when it has none."""
        validate_group(group)
        validate_topic(topic, allow_system=True)
        if not 0 <= queue_id <= MAX_QUEUE_ID:
            raise InvalidArgumentError(
                f"queue id {queue_id} is outside 0..{MAX_QUEUE_ID}; take queue ids from the "
                "topic's route",
                details={"argument": "queue_id"},
            )
        found = self._store.committed_offset(group, topic, queue_id)
        return -1 if found is None else found

    def queue_info(self, topic: str, queue_id: int) -> QueueInfo:
        self._topics.readable_topic(topic, queue_id)
        low, high = self._store.queue_bounds(topic, queue_id)
        first_ts = last_ts = 0
        if high > low:
            first = self._store.read_queue(topic, queue_id, low, 1)
            last = self._store.read_queue(topic, queue_id, high - 1, 1)
            first_ts = first[0].store_timestamp_ms if first else 0
            last_ts = last[0].store_timestamp_ms if last else 0
        return QueueInfo(queue_id, low, high, first_ts, last_ts)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        self._topics.readable_topic(topic, queue_id)
        return self._store.offset_for_timestamp(topic, queue_id, timestamp_ms)

    def reset_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> dict[int, int]:
        """An administrative reset of some queues of `topic` to explicit offsets, each kept within
        its queue's bounds (an offset past the end means the end, before the start the start).
        Replicated as a reset, so running consumers of the group are told (broker/offset_resets)."""
        validate_group(group)
        cfg = self._topics.readable_topic(topic, -1)
        if not offsets:
            raise InvalidArgumentError("a reset names at least one queue")
        for queue_id, offset in offsets.items():
            if not 0 <= queue_id < cfg.read_queue_nums:
                raise InvalidArgumentError(
                    f"queue {queue_id} does not exist: topic {topic!r} has "
                    f"{cfg.read_queue_nums} read queues on {self._node.group}"
                )
            if offset < 0:
                raise InvalidArgumentError(f"offset {offset} of queue {queue_id} is negative")
        self._node.require_leader()
        clamped = {}
        for queue_id, offset in sorted(offsets.items()):
            low, high = self._store.queue_bounds(topic, queue_id)
            clamped[queue_id] = min(max(offset, low), high)
        outcome = self._node.replicate(
            [record_batch.encode(ResetOffsets(group, topic, clamped))],
            self._settings.send_timeout_ms / 1000,
        )[0]
        if isinstance(outcome, Rejected):
            raise InvalidArgumentError(f"offset reset refused: {outcome.reason}")
        return clamped

    def reset_offsets_to_timestamp(
        self, group: str, topic: str, timestamp_ms: int
    ) -> dict[int, int]:
        """RocketMQ's message backtracking: every queue of `topic` on this group goes to the first
        offset stored at or after `timestamp_ms`."""
        validate_group(group)
        cfg = self._topics.readable_topic(topic, -1)
        self._node.require_leader()
        offsets = {
            q: self._store.offset_for_timestamp(topic, q, timestamp_ms)
            for q in range(cfg.read_queue_nums)
        }
        outcome = self._node.replicate(
            [record_batch.encode(ResetOffsets(group, topic, offsets))],
            self._settings.send_timeout_ms / 1000,
        )[0]
        if isinstance(outcome, Rejected):
            raise InvalidArgumentError(f"offset reset refused: {outcome.reason}")
        return offsets
