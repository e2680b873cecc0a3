"""The native Raft wire: every message round-trips, garbage raises only BadMessageError, and a
sealed stream refuses a frame that was altered, replayed or sealed under another password."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.raftlog import raft_codec
from raftmq.raftlog.election import LogPosition, PreVoteReply, PreVoteRequest
from raftmq.raftlog.raft_messages import (
    AppendEntries,
    AppendResponse,
    Entry,
    InstallSnapshot,
    Message,
    PreVote,
    PreVoteResponse,
    RequestVote,
    TimeoutNow,
    VoteResponse,
)
from raftmq.raftlog.snapshot import Snapshot

A, B = "127.0.0.1:1", "127.0.0.1:2"
u64 = st.integers(min_value=0, max_value=(1 << 63) - 1)


def roundtrip(m: raft_codec.Frame) -> raft_codec.Frame:
    return raft_codec.decode(b"".join(raft_codec.encode(m)), A, B)


@given(
    term=u64,
    prev=st.integers(min_value=0, max_value=1 << 40),
    prev_term=u64,
    commit=u64,
    entries=st.lists(st.tuples(st.binary(max_size=64), u64), max_size=8),
)
def test_an_append_round_trips_with_its_entries(
    term: int, prev: int, prev_term: int, commit: int, entries: list[tuple[bytes, int]]
) -> None:
    es = tuple(Entry(d, prev + 1 + k, t) for k, (d, t) in enumerate(entries))
    m = AppendEntries(A, B, term, prev, prev_term, commit, es)
    assert roundtrip(m) == m


@pytest.mark.parametrize(
    "m",
    [
        AppendResponse(A, B, 7, True, 42, 0, True),
        AppendResponse(A, B, 7, False, 3, 41, False),
        InstallSnapshot(A, B, 5, Snapshot(100, 4, b"state")),
        RequestVote(A, B, 9, LogPosition(8, 77), True),
        VoteResponse(A, B, 9, False),
        PreVote(A, B, PreVoteRequest(A, 3, 10, LogPosition(9, 5))),
        PreVoteResponse(A, B, PreVoteReply(A, 3, True, 9)),
        TimeoutNow(A, B, 12),
        raft_codec.FetchRecord(17),
        raft_codec.RecordCopy(17, 3, b"copy"),
        raft_codec.RecordCopy(17, 0, None),
    ],
)
def test_every_message_kind_round_trips(m: Message | raft_codec.Frame) -> None:
    assert roundtrip(m) == m


@given(st.binary(max_size=200))
def test_garbage_raises_only_bad_message(body: bytes) -> None:
    with contextlib.suppress(raft_codec.BadMessageError):
        raft_codec.decode(body, A, B)


def test_a_truncated_append_is_refused() -> None:
    body = b"".join(raft_codec.encode(AppendEntries(A, B, 1, 0, 0, 0, (Entry(b"x" * 10, 1, 1),))))
    with pytest.raises(raft_codec.BadMessageError):
        raft_codec.decode(body[:-1], A, B)


def test_a_hello_from_something_else_is_refused() -> None:
    hello = raft_codec.decode_hello(raft_codec.encode_hello(A, raft_codec.SEALED, b"n" * 16))
    assert hello == raft_codec.Hello(A, raft_codec.SEALED, b"n" * 16)
    with pytest.raises(raft_codec.BadMessageError, match="not a raftmq"):
        raft_codec.decode_hello(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")


def test_a_hello_under_tls_carries_a_proof_bound_to_its_nonce_and_sender() -> None:
    key, nonce = raft_codec.derive_key("s3cret"), b"n" * 16
    proof = raft_codec.hello_proof(key, nonce, A)
    hello = raft_codec.decode_hello(raft_codec.encode_hello(A, raft_codec.PROVED, nonce, proof))
    assert hello == raft_codec.Hello(A, raft_codec.PROVED, nonce, proof)
    # The proof holds for this nonce and sender under this password only.
    assert proof != raft_codec.hello_proof(key, b"m" * 16, A)
    assert proof != raft_codec.hello_proof(key, nonce, B)
    assert proof != raft_codec.hello_proof(raft_codec.derive_key("other"), nonce, A)
    with pytest.raises(raft_codec.BadMessageError, match="truncated"):
        raft_codec.decode_hello(raft_codec.encode_hello(A, raft_codec.PROVED, nonce, proof)[:30])


def test_a_sealed_stream_refuses_altered_replayed_and_foreign_frames() -> None:
    key, nonce = raft_codec.derive_key("s3cret"), b"k" * 16
    sender = raft_codec.Sealer(key, nonce)
    frames = [sender.seal(f"frame {i}".encode()) for i in range(3)]
    receiver = raft_codec.Sealer(key, nonce)
    assert receiver.open(frames[0]) == b"frame 0"
    with pytest.raises(raft_codec.BadMessageError, match="same on every node"):
        receiver.open(frames[0])  # replayed inside the stream
    altered = bytearray(frames[1])
    altered[3] ^= 1
    with pytest.raises(raft_codec.BadMessageError):
        raft_codec.Sealer(key, nonce).open(bytes(altered))
    with pytest.raises(raft_codec.BadMessageError):
        raft_codec.Sealer(raft_codec.derive_key("other"), nonce).open(frames[0])
