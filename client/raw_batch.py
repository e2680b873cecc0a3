"""Decoding of the record batches a pull answers with `raw_batches` (PullMessageResponse.batches):
the broker sends stored batches untouched and the client decodes only the messages named.

Sans-I/O; it checks that each batch is what the answer says and raises MalformedBatchError if not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from raftmq.common.message import POSITION_HEX, Message, StoredMessage, msg_id_prefix
from raftmq.common.pb import broker_pb2
from raftmq.common.record_batch import MalformedBatchError, decode_message_at, decode_produce_header


def named_messages(
    batches: Iterable[broker_pb2.RawBatch],
    broker_group: str,
    queue_id: int,
    topic: str | None = None,
) -> Iterator[tuple[broker_pb2.RawBatch, int, str, Message]]:
    """(raw batch, position, message id, message) for each message the answer names, in
    queue-offset order (the queue offset is the batch's first_offset + position). Each batch
    is checked against the answer (queue, and topic if given) before any of it is decoded."""
    strings: dict[bytes, str] = {}  # tags and hosts repeat: decode each once per answer
    for b in batches:
        chunk = b.chunk
        header = decode_produce_header(chunk)
        if header.queue_id != queue_id or (topic is not None and header.topic != topic):
            raise MalformedBatchError(
                f"batch {b.raft_index}/{b.slot} is for {header.topic}/{header.queue_id}, "
                f"not {topic or header.topic}/{queue_id}"
            )
        if len(b.positions) != len(b.byte_offsets):
            raise MalformedBatchError(
                f"batch {b.raft_index}/{b.slot}: {len(b.positions)} positions but "
                f"{len(b.byte_offsets)} byte offsets"
            )
        id_prefix = msg_id_prefix(broker_group, b.raft_index, b.slot)
        for position, at in zip(b.positions, b.byte_offsets, strict=True):
            if not 0 <= position < header.count:
                raise MalformedBatchError(
                    f"batch {b.raft_index}/{b.slot} has no position {position} ({header.count})"
                )
            msg = decode_message_at(chunk, header, at, strings)
            yield b, position, id_prefix + format(position, POSITION_HEX), msg


def decode_batches(
    batches: Iterable[broker_pb2.RawBatch], broker_group: str, queue_id: int
) -> list[StoredMessage]:
    """The messages of a pull answer, in queue-offset order."""
    return [
        StoredMessage(
            msg,
            broker_group,
            queue_id,
            b.first_offset + position,
            msg_id,
            b.store_timestamp_ms,
            b.raft_index,
            b.slot,
            position,
        )
        for b, position, msg_id, msg in named_messages(batches, broker_group, queue_id)
    ]
