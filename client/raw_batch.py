"""Decoding of the record batches a pull answers with `raw_batches` (PullMessageResponse.batches):
the broker sends stored batches untouched and the client decodes only the messages named.

Sans-I/O; it checks that each batch is what the answer says and raises MalformedBatchError if not.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.errors import MalformedBatchError
from broker.message import StoredMessage, encode_msg_id
from broker.record_batch import decode_message_at, decode_produce_header
from client.pb import broker_pb2


def decode_batches(
    batches: Iterable[broker_pb2.RawBatch], broker_group: str, queue_id: int
) -> list[StoredMessage]:
    """The messages of a pull answer, in queue-offset order."""
    out: list[StoredMessage] = []
    for b in batches:
        chunk = b.chunk
        header = decode_produce_header(chunk)
        if header.queue_id != queue_id:
            raise MalformedBatchError(
                f"batch {b.raft_index}/{b.slot} is for queue {header.queue_id}, not {queue_id}"
            )
        if len(b.positions) != len(b.byte_offsets):
            raise MalformedBatchError(
                f"batch {b.raft_index}/{b.slot}: {len(b.positions)} positions but "
                f"{len(b.byte_offsets)} byte offsets"
            )
        for position, at in zip(b.positions, b.byte_offsets, strict=True):
            if not 0 <= position < header.count:
                raise MalformedBatchError(
                    f"batch {b.raft_index}/{b.slot} has no position {position} ({header.count})"
                )
            out.append(
                StoredMessage(
                    decode_message_at(chunk, header, at),
                    broker_group,
                    queue_id,
                    b.first_offset + position,
                    encode_msg_id(broker_group, b.raft_index, b.slot, position),
                    b.store_timestamp_ms,
                    b.raft_index,
                    b.slot,
                    position,
                )
            )
    return out
