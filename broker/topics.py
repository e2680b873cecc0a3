"""TopicProcessor: topic administration (create, update, delete) and the topic checks the other
processors share (a readable topic and queue; a writable topic, auto-created on first send).

Decides on the node's topic table; writes go through the node's leader gate and replication.
Never writes the store directly: a topic change is a replicated entry like any other.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from raftmq.broker.rows import Applied
from raftmq.common.errors import (
    InvalidArgumentError,
    PermissionDeniedError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
)
from raftmq.common.message import is_system_topic, validate_topic
from raftmq.common.record_batch import TopicConfigChange, TopicOp
from raftmq.common.topic_config import TopicConfig, validate_topic_config

if TYPE_CHECKING:
    from raftmq.broker.node import BrokerNode

log = logging.getLogger("broker.topics")


class TopicProcessor:
    def __init__(self, node: BrokerNode) -> None:
        self._node = node
        self._store = node.store
        self._settings = node.settings

    def create_topic(self, cfg: TopicConfig) -> TopicConfig:
        _check_topic_config(cfg)
        self._node.require_leader()
        existing = self._store.topic(cfg.name)
        if existing is not None:
            if same_topic(existing, cfg):
                return existing
            raise TopicAlreadyExistsError.for_topic(cfg.name)
        self._change_topic(TopicOp.CREATE, cfg)
        return self._topic_or_missing(cfg.name)

    def update_topic(self, cfg: TopicConfig) -> TopicConfig:
        _check_topic_config(cfg)
        self._node.require_leader()
        if self._store.topic(cfg.name) is None:
            raise TopicNotFoundError.for_topic(cfg.name, auto_create=True)
        self._change_topic(TopicOp.UPDATE, cfg)
        return self._topic_or_missing(cfg.name)

    def delete_topic(self, name: str) -> None:
        validate_topic(name, allow_system=True)
        self._node.require_leader()
        if self._store.topic(name) is None:
            raise TopicNotFoundError.for_topic(name, auto_create=True)
        self._change_topic(TopicOp.DELETE, TopicConfig(name))

    # ---- shared checks (the node's leader gate already passed for writes) ---------------------

    def topic_for_write(self, name: str) -> TopicConfig:
        """The topic's config, creating it (default queue count) when auto-create allows."""
        cfg = self._store.topic(name)
        if cfg is not None:
            return cfg
        if not self._settings.auto_create_topic and not is_system_topic(name):
            raise TopicNotFoundError.for_topic(name, auto_create=False)
        n = self._settings.default_queue_nums
        self._change_topic(TopicOp.CREATE, TopicConfig(name, n, n, auto_created=True))
        cfg = self._store.topic(name)
        if cfg is None:  # deleted again in between
            raise TopicNotFoundError.for_topic(name, auto_create=True)
        log.info("broker.topic_auto_created topic=%s queues=%d", name, n)
        return cfg

    def readable_topic(self, name: str, queue_id: int) -> TopicConfig:
        """The topic's config if it may be read, and `queue_id` exists (-1: any queue)."""
        validate_topic(name, allow_system=True)
        cfg = self._store.topic(name)
        if cfg is None:
            raise TopicNotFoundError.for_topic(name, auto_create=True)
        if not cfg.readable:
            raise PermissionDeniedError.for_topic(name, "read", str(cfg.perm))
        if queue_id >= 0 and queue_id >= cfg.read_queue_nums:
            raise InvalidArgumentError(
                f"queue {queue_id} does not exist: topic {name!r} has {cfg.read_queue_nums} "
                f"read queues on {self._node.group}"
            )
        if queue_id < -1:
            raise InvalidArgumentError(f"queue id {queue_id} is negative")
        return cfg

    def _change_topic(self, op: TopicOp, cfg: TopicConfig) -> str:
        outcome = self._node.replicate_record(TopicConfigChange(op, cfg), "topic change")
        return outcome.detail if isinstance(outcome, Applied) else ""

    def _topic_or_missing(self, name: str) -> TopicConfig:
        cfg = self._store.topic(name)
        if cfg is None:
            raise TopicNotFoundError.for_topic(name, auto_create=True)
        return cfg


def _check_topic_config(cfg: TopicConfig) -> None:
    validate_topic(cfg.name, allow_system=False)
    validate_topic_config(cfg)


def same_topic(a: TopicConfig, b: TopicConfig) -> bool:
    return (a.read_queue_nums, a.write_queue_nums, a.perm, a.ordered) == (
        b.read_queue_nums,
        b.write_queue_nums,
        b.perm,
        b.ordered,
    )
