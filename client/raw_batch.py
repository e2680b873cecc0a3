"""Decoding of the record batches a pull answers with `raw_batches` (PullMessageResponse.batches):
the broker sends stored batches untouched (v1 record batches or v2 stored batches, issue 24) and
the client decodes only the messages named; a v2 batch's CRCs are checked here.

Sans-I/O; it checks that each batch is what the answer says and raises MalformedBatchError if not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from raftmq.client.messages import ReceivedMessage
from raftmq.common import produce_chunk
from raftmq.common.message import POSITION_HEX, Message, StoredMessage, msg_id_prefix
from raftmq.common.pb import broker_pb2
from raftmq.common.record_batch import MalformedBatchError
from raftmq.common.stored_batch import BatchHeader


def _named_positions(
    b: broker_pb2.RawBatch, header: produce_chunk.ChunkHeader, queue_id: int, topic: str | None
) -> list[int]:
    """The positions the answer names in batch `b`, checked against its header (queue, and
    topic if given) before any of it is decoded."""
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
    positions = list(b.positions)
    for position in positions:
        if not 0 <= position < header.count:
            raise MalformedBatchError(
                f"batch {b.raft_index}/{b.slot} has no position {position} ({header.count})"
            )
    if positions != sorted(positions):
        raise MalformedBatchError(f"batch {b.raft_index}/{b.slot}: positions out of order")
    return positions


class _OffsetCheck:
    """With `offsets` = (offset asked for, next offset answered): every queue offset an answer
    names lies inside them, in order, so a broker's wrong row is a MalformedBatchError, never
    data (issue 25: checked on both sides). None checks nothing."""

    def __init__(self, queue_id: int, offsets: tuple[int, int] | None) -> None:
        self.queue_id, self.offsets = queue_id, offsets
        self.last = offsets[0] - 1 if offsets is not None else -1

    def check(self, b: broker_pb2.RawBatch, positions: list[int]) -> None:
        if self.offsets is None:
            return
        for position in positions:
            at = b.first_offset + position
            if not self.last < at < self.offsets[1]:
                raise MalformedBatchError(
                    f"batch {b.raft_index}/{b.slot} holds offset {at} of queue {self.queue_id} "
                    f"after {self.last}, in an answer from {self.offsets[0]} to {self.offsets[1]}"
                )
            self.last = at


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
    in_range = _OffsetCheck(queue_id, offsets)
    for b in batches:
        chunk = b.chunk
        header = produce_chunk.read_header(chunk)
        positions = _named_positions(b, header, queue_id, topic)
        in_range.check(b, positions)
        id_prefix = msg_id_prefix(broker_group, b.raft_index, b.slot)
        messages = produce_chunk.messages_at(
            chunk, header, positions, b.byte_offsets, strings, verify=True
        )
        for position, msg in zip(positions, messages, strict=True):
            yield b, position, id_prefix + format(position, POSITION_HEX), msg


def received_messages(
    batches: Iterable[broker_pb2.RawBatch],
    broker_group: str,
    queue_id: int,
    *,
    offsets: tuple[int, int] | None = None,
) -> list[ReceivedMessage]:
    """The messages of a pull answer as a consumer gets them, in queue-offset order. A v2
    batch's CRCs and named record heads are checked here (and the offsets, as named_messages
    does), and each message decodes its fields only when they are read
    (ReceivedMessage.lazy); a v1 batch is decoded here."""
    out: list[ReceivedMessage] = []
    strings: dict[bytes, str] = {}
    in_range = _OffsetCheck(queue_id, offsets)
    for b in batches:
        chunk = b.chunk
        header = produce_chunk.read_header(chunk)
        positions = _named_positions(b, header, queue_id, None)
        in_range.check(b, positions)
        id_prefix = msg_id_prefix(broker_group, b.raft_index, b.slot)
        first, store_ms = b.first_offset, b.store_timestamp_ms
        if isinstance(header, BatchHeader):
            records = produce_chunk.records_at(chunk, header, positions, verify=True)
            for position, record in zip(positions, records, strict=True):
                out.append(
                    ReceivedMessage.lazy(
                        record, broker_group, first + position, store_ms, id_prefix, position
                    )
                )
            continue
        messages = produce_chunk.messages_at(chunk, header, positions, b.byte_offsets, strings)
        for position, m in zip(positions, messages, strict=True):
            out.append(
                ReceivedMessage(
                    m.topic,
                    m.body,
                    m.tags,
                    m.keys,
                    m.properties,
                    broker_group,
                    queue_id,
                    first + position,
                    id_prefix + format(position, POSITION_HEX),
                    store_ms,
                    m.born_timestamp_ms,
                    m.born_host,
                )
            )
    return out


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
