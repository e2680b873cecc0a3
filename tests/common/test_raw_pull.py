"""A raw pull answer written in parts (common/raw_pull.py) is, joined, the same
PullMessageResponse protobuf builds: any batches, any head, lengths of one to three varint bytes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.common.pb import broker_pb2
from raftmq.common.raw_pull import answer_parts, varint


@dataclass(frozen=True)
class Batch:
    raft_index: int
    slot: int
    first_offset: int
    store_timestamp_ms: int
    chunk: bytes
    positions: list[int]
    byte_offsets: list[int]


def _built(head: broker_pb2.PullMessageResponse, batches: list[Batch]) -> bytes:
    whole = broker_pb2.PullMessageResponse()
    whole.CopyFrom(head)
    for b in batches:
        whole.batches.add(
            raft_index=b.raft_index,
            slot=b.slot,
            first_offset=b.first_offset,
            store_timestamp_ms=b.store_timestamp_ms,
            chunk=b.chunk,
            positions=b.positions,
            byte_offsets=b.byte_offsets,
        )
    return whole.SerializeToString()


ints32 = st.integers(0, 2**31 - 1)
batches = st.builds(
    Batch,
    st.integers(0, 2**63 - 1),
    ints32,
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**63 - 1),
    # up to 20 000 bytes: a chunk's length and its batch's take one, two or three varint bytes
    st.integers(0, 20_000).map(lambda n: bytes(i % 251 for i in range(n))),
    st.lists(ints32, max_size=40),
    st.lists(ints32, max_size=40),
)
heads = st.builds(
    broker_pb2.PullMessageResponse,
    status=st.sampled_from([broker_pb2.FOUND, broker_pb2.NO_NEW_MSG]),
    next_offset=st.integers(0, 2**63 - 1),
    min_offset=st.integers(0, 2**63 - 1),
    max_offset=st.integers(0, 2**63 - 1),
    node_id=st.text(max_size=12),
    throttle_ms=ints32,
)


@settings(max_examples=200, deadline=None)
@given(heads, st.lists(batches, max_size=5))
def test_the_parts_joined_are_the_answer_protobuf_builds(
    head: broker_pb2.PullMessageResponse, got: list[Batch]
) -> None:
    parts = answer_parts(head, got)
    joined = parts.join()
    assert len(parts) == len(joined)
    parsed = broker_pb2.PullMessageResponse.FromString(joined)
    assert parsed == broker_pb2.PullMessageResponse.FromString(_built(head, got))
    # the chunks are the parts themselves, not copies
    chunk_parts = parts.parts[2::2]
    assert all(a is b.chunk for a, b in zip(chunk_parts, got, strict=True))


@given(st.integers(1, 2**63 - 1))
def test_varint_is_protobufs(n: int) -> None:
    # QueueOffset holding only `offset` (field 3, int64): its tag byte, then n as a varint
    assert broker_pb2.QueueOffset(offset=n).SerializeToString() == b"\x18" + varint(n)


def test_a_head_with_batches_is_refused() -> None:
    head = broker_pb2.PullMessageResponse()
    head.batches.add(chunk=b"x")
    with pytest.raises(ValueError, match="carries no batches"):
        answer_parts(head, [])
