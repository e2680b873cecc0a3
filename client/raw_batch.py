"""Decoding of the record batches a pull answers with `raw_batches` (PullMessageResponse.batches):
the broker sends stored batches untouched (v1 record batches or v2 stored batches, issue 24) and
the client decodes only the messages named; a v2 batch's CRCs are checked here.

Sans-I/O; it checks that each batch is what the answer says and raises MalformedBatchError if not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from raftmq.common import produce_chunk
from raftmq.common.message import POSITION_HEX, Message, StoredMessage, msg_id_prefix
from raftmq.common.pb import broker_pb2
from raftmq.common.record_batch import MalformedBatchError


def named_messages(
    batches: Iterable[broker_pb2.RawBatch],
    broker_group: str,
    queue_id: int,
    topic: str | None = None,
    *,
    offsets: tuple[int, int] | None = None,
) -> Iterator[tuple[broker_pb2.RawBatch, int, str, Message]]:
    """(raw batch, position, message id, message) for each message the answer names, in
    queue-offset order (the queue offset is the batch's first_offset + position). Each batch
    is checked against the request and the answer (queue, topic if given, and with `offsets`
    = (offset asked for, next offset answered) every queue offset in order inside them)
    before any of it is decoded: a broker's wrong row is a MalformedBatchError, never data."""
    strings: dict[bytes, str] = {}  # tags and hosts repeat: decode each once per answer
    last = offsets[0] - 1 if offsets is not None else -1
    for b in batches:
        chunk = b.chunk
        header = produce_chunk.read_header(chunk)
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
        positions = list(b.positions)
        for position in positions:
            if not 0 <= position < header.count:
                raise MalformedBatchError(
                    f"batch {b.raft_index}/{b.slot} has no position {position} ({header.count})"
                )
        if positions != sorted(positions):
            raise MalformedBatchError(f"batch {b.raft_index}/{b.slot}: positions out of order")
        if offsets is not None:
            for position in positions:
                at = b.first_offset + position
                if not last < at < offsets[1]:
                    raise MalformedBatchError(
                        f"batch {b.raft_index}/{b.slot} holds offset {at} of queue {queue_id} "
                        f"after {last}, in an answer from {offsets[0]} to {offsets[1]}"
                    )
                last = at
        messages = produce_chunk.messages_at(
            chunk, header, positions, b.byte_offsets, strings, verify=True
        )
        for position, msg in zip(positions, messages, strict=True):
            yield b, position, id_prefix + format(position, POSITION_HEX), msg


def decode_batches(
    batches: Iterable[broker_pb2.RawBatch],
    broker_group: str,
    queue_id: int,
    *,
    offsets: tuple[int, int] | None = None,
) -> list[StoredMessage]:
    """The messages of a pull answer, in queue-offset order (`offsets`: see named_messages)."""
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
        for b, position, msg_id, msg in named_messages(
            batches, broker_group, queue_id, offsets=offsets
        )
    ]
