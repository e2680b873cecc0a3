"""QueryProcessor: a message by its id, messages by key (RocketMQ's QueryMessageProcessor).

Reads this node's indexes and CommitLog; changes nothing. A message id names the same message
on every node of its group (invariant 2), so any node may answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from raftmq.broker.errors import StoreError
from raftmq.broker.rows import CQRow
from raftmq.broker.topics import TopicProcessor
from raftmq.common.errors import InternalError, InvalidArgumentError, MessageNotFoundError
from raftmq.common.message import StoredMessage, decode_msg_id

if TYPE_CHECKING:
    from raftmq.broker.node import BrokerNode

ID_CATCHUP_S = 1.0  # a query by id of an entry committed but not indexed here waits this long


class QueryProcessor:
    def __init__(self, node: BrokerNode, topics: TopicProcessor) -> None:
        self._node = node
        self._topics = topics
        self._store = node.store
        self._settings = node.settings

    def message_by_id(self, msg_id: str) -> StoredMessage:
        mid = decode_msg_id(msg_id)
        group = self._node.group
        if mid.broker_group != group:
            raise MessageNotFoundError(
                f"message {msg_id} belongs to broker group {mid.broker_group}, not {group}; "
                "ask that group",
                details={"msg_id": msg_id, "broker_group": mid.broker_group},
            )
        node = self._node
        dispatched = node.dispatcher.dispatched_index  # before the read: its rows are there
        row = self._store.cq_row_at(mid.raft_index, mid.slot, mid.position)
        if row is None and dispatched < mid.raft_index <= node.rlog.committed_index:
            # Answered at its commit, not indexed here yet (issue 29): wait for it, bounded.
            node.wait_dispatched(mid.raft_index, ID_CATCHUP_S)
            row = self._store.cq_row_at(mid.raft_index, mid.slot, mid.position)
        if row is None:
            raise MessageNotFoundError.for_id(msg_id)
        return self._read_rows([row])[0]

    def messages_by_key(
        self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> list[StoredMessage]:
        """Messages of `topic` carrying `key`, stored within [begin_ms, end_ms] (0: unbounded)."""
        self._topics.readable_topic(topic, -1)
        if not key:
            raise InvalidArgumentError("the key to look up is empty")
        max_count = min(max(max_count, 1), self._settings.pull_max_messages)
        hits = self._store.lookup_key(
            topic, key, max_count, begin_ms=begin_ms or None, end_ms=end_ms or None
        )
        rows: list[CQRow] = []
        for hit in hits:
            rows.extend(self._store.read_queue(topic, hit.queue_id, hit.queue_offset, 1))
        return self._read_rows(rows)

    def _read_rows(self, rows: Sequence[CQRow]) -> list[StoredMessage]:
        try:
            return self._node.reader.read(rows)
        except StoreError as exc:
            raise InternalError(
                f"node {self._node.me.node_id} cannot read a message: {exc}"
            ) from exc
