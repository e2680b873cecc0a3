"""Conversions between wire types (client/pb) and the broker's values (Message, StoredMessage,
TopicConfig). No checks beyond what a conversion needs: validation lives in broker.message."""

from __future__ import annotations

from raftmq.common.message import Message, StoredMessage
from raftmq.common.pb import common_pb2
from raftmq.common.topic_config import PERM_READ_WRITE, Permission, TopicConfig

_PERM_FROM_PB = {
    common_pb2.PERM_UNSPECIFIED: PERM_READ_WRITE,
    common_pb2.PERM_READ_WRITE: PERM_READ_WRITE,
    common_pb2.PERM_READ_ONLY: Permission.READ,
    common_pb2.PERM_WRITE_ONLY: Permission.WRITE,
    common_pb2.PERM_NONE: Permission(0),
}


def perm_to_pb(perm: Permission) -> common_pb2.Permission:
    readable, writable = Permission.READ in perm, Permission.WRITE in perm
    if readable and writable:
        return common_pb2.PERM_READ_WRITE
    if readable:
        return common_pb2.PERM_READ_ONLY
    if writable:
        return common_pb2.PERM_WRITE_ONLY
    return common_pb2.PERM_NONE


def topic_from_pb(cfg: common_pb2.TopicConfig, *, default_queues: int) -> TopicConfig:
    """A TopicConfig from the wire; 0 queue counts mean the broker default."""
    return TopicConfig(
        name=cfg.topic,
        read_queue_nums=cfg.read_queue_nums or default_queues,
        write_queue_nums=cfg.write_queue_nums or default_queues,
        perm=_PERM_FROM_PB.get(cfg.perm, PERM_READ_WRITE),
        ordered=cfg.ordered,
    )


def topic_to_pb(cfg: TopicConfig) -> common_pb2.TopicConfig:
    return common_pb2.TopicConfig(
        topic=cfg.name,
        read_queue_nums=cfg.read_queue_nums,
        write_queue_nums=cfg.write_queue_nums,
        perm=perm_to_pb(cfg.perm),
        ordered=cfg.ordered,
    )


def message_from_pb(topic: str, m: common_pb2.Message) -> Message:
    # Copying an empty protobuf map or list costs more than asking for its length first.
    props = m.properties
    keys = m.keys
    return Message(
        topic,
        m.body,
        m.tags or None,
        tuple(keys) if len(keys) else (),
        dict(props) if len(props) else {},
        m.flag,
        m.born_timestamp_ms,
        m.born_host,
    )


def stored_to_pb(sm: StoredMessage) -> common_pb2.StoredMessage:
    m = sm.message
    return common_pb2.StoredMessage(
        message=common_pb2.Message(
            body=m.body,
            tags=m.tags or "",
            keys=m.keys,
            properties=m.properties,
            flag=m.flag,
            born_timestamp_ms=m.born_timestamp_ms,
            born_host=m.born_host,
        ),
        topic=m.topic,
        broker_group=sm.broker_group,
        queue_id=sm.queue_id,
        queue_offset=sm.queue_offset,
        msg_id=sm.msg_id,
        store_timestamp_ms=sm.store_timestamp_ms,
    )
