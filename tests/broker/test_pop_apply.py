"""POP state as replicated state (broker/pop_apply.py) with a real lmdb store and the real
Dispatcher: records round-trip; a receive hands out at the record's time with tokens named by the
entry; acks, stale handles and changes of the invisible duration; the low watermark committed to
the consumer offsets; two replicas applying the same entries hold the same bytes; a retention
base carries the table. And a Hypothesis property over random receive / ack / change / time
sequences through the records: an acknowledged message is never handed out again, nothing is
handed out again before its invisible-until time, attempts go up by one per delivery, and the
committed offset never passes an unacknowledged message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.broker.pop_apply import PopAckResult, PopReceiveResult, decode_state, token_of
from raftmq.broker.retention import Reason, RetentionRecord, encode_record
from raftmq.broker.rows import Applied
from raftmq.broker.store import MessageStore
from raftmq.common.message import Message
from raftmq.common.pop import AckOutcome
from raftmq.common.record_batch import (
    NO_OFFSET,
    PopAck,
    PopAckEntry,
    PopQueuePart,
    PopReceive,
    ProduceBatch,
    ResetOffsets,
    decode,
    encode,
)

from .test_delivery_apply import Node

G, T = "g", "T"


def receive(ts: int, *parts: PopQueuePart, invisible: int = 1_000) -> bytes:
    return encode(PopReceive(G, T, ts, invisible, 100, parts))


def new(qid: int, cursor: int, offsets: list[int], nxt: int, take: int = 10) -> PopQueuePart:
    return PopQueuePart(qid, cursor, False, (), (), cursor, nxt, take, tuple(offsets))


def again(qid: int, *offsets: int, drops: tuple[int, ...] = ()) -> PopQueuePart:
    return PopQueuePart(qid, 0, False, tuple(offsets), drops)


def ack(ts: int, *entries: tuple[int, int, int], invisible: int = 0) -> bytes:
    return encode(PopAck(G, T, ts, invisible, tuple(PopAckEntry(*e) for e in entries)))


def result(node: Node, chunk: bytes) -> PopReceiveResult | PopAckResult:
    [out] = node.entries((chunk,))
    [outcome] = out.outcomes
    assert isinstance(outcome, Applied) and outcome.pop is not None, outcome
    return outcome.pop


def handed(node: Node, chunk: bytes) -> list[tuple[int, int, int, int]]:
    r = result(node, chunk)
    assert isinstance(r, PopReceiveResult)
    return [(h.offset, h.attempt, h.token, h.visible_at_ms) for p in r.parts for h in p.handed]


def acked(node: Node, chunk: bytes) -> list[AckOutcome]:
    r = result(node, chunk)
    assert isinstance(r, PopAckResult)
    return [o for o, _ in r.outcomes]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "store")
    yield n
    n.store.close()


def test_records_round_trip() -> None:
    rec = PopReceive(
        G,
        T,
        5,
        1_000,
        100,
        (
            PopQueuePart(0, 3, True, (3, 4), (1,), 7, 9, 2, (7, 8), NO_OFFSET),
            PopQueuePart(1 << 31, 0, False, reset_to=12, pulled_from=0),
        ),
    )
    assert decode(encode(rec)) == rec
    a = PopAck(G, T, 9, 0, (PopAckEntry(0, 1, 2), PopAckEntry(3, 1 << 60, 1 << 63)))
    assert decode(encode(a)) == a


def test_receive_ack_and_redeliver_at_record_times(node: Node) -> None:
    got = handed(node, receive(1_000, new(0, 0, [0, 1, 2], 3)))  # entry 1, slot 0
    assert got == [(o, 1, token_of(1, 0), 2_000) for o in (0, 1, 2)]
    assert acked(node, ack(1_100, (0, 1, token_of(1, 0)))) == [AckOutcome.DONE]
    assert acked(node, ack(1_100, (0, 1, token_of(1, 0)))) == [AckOutcome.ALREADY]
    assert acked(node, ack(1_100, (0, 0, 12345), (0, 9, 1))) == [
        AckOutcome.STALE,
        AckOutcome.UNKNOWN,
    ]
    # Before 2_000 nothing comes back (the record's time decides, not a clock).
    assert handed(node, receive(1_999, again(0, 0, 2))) == []
    got = handed(node, receive(2_000, again(0, 0, 2)))  # entry 6
    assert got == [(0, 2, token_of(6, 0), 3_000), (2, 2, token_of(6, 0), 3_000)]
    assert acked(node, ack(2_001, (0, 0, token_of(1, 0)))) == [AckOutcome.STALE]
    assert node.store.committed_offset(G, T, 0) is None  # 0 still unacknowledged
    assert acked(node, ack(2_002, (0, 0, token_of(6, 0)))) == [AckOutcome.DONE]
    assert node.store.committed_offset(G, T, 0) == 2  # below 2: all done
    # Change the invisible duration: a new token, invisible from the record's time.
    r = result(node, ack(2_100, (0, 2, token_of(6, 0)), invisible=5_000))
    assert isinstance(r, PopAckResult)
    [(outcome, d)] = r.outcomes
    assert outcome is AckOutcome.DONE and d is not None
    assert (d.token, d.visible_at_ms, d.attempt) == (token_of(9, 0), 7_100, 2)
    assert handed(node, receive(7_000, again(0, 2))) == []
    assert handed(node, receive(7_100, again(0, 2)))[0][:2] == (2, 3)


def test_a_moved_cursor_refuses_a_second_claim_and_drops_are_done(node: Node) -> None:
    assert len(handed(node, receive(0, new(0, 0, [0, 1], 2)))) == 2
    assert handed(node, receive(0, new(0, 0, [0, 1], 2))) == []  # another receive's pull
    handed(node, receive(5, again(0, drops=(0,))))  # dead-lettered
    raw = node.store.pop_state(G, T, 0)
    assert raw is not None
    p, _ = decode_state(raw)
    assert sorted(p.inflight) == [1] and p.cursor == 2
    assert node.store.committed_offset(G, T, 0) == 1


def test_an_offset_reset_moves_the_pop_cursor(node: Node) -> None:
    assert len(handed(node, receive(0, new(0, 0, [0, 1, 2], 3)))) == 3
    node.entries((encode(ResetOffsets(G, T, {0: 10})),))
    p, _ = decode_state(node.store.pop_state(G, T, 0) or b"")
    assert p.cursor == 10 and not p.inflight
    assert acked(node, ack(5, (0, 1, token_of(1, 0)))) == [AckOutcome.ALREADY]
    assert handed(node, receive(9_000, again(0, 0, 1, 2))) == []  # forgotten, not redelivered
    assert [h[0] for h in handed(node, receive(9_000, new(0, 10, [10], 11)))] == [10]


def test_replicas_agree_and_a_base_carries_pop_state(tmp_path: Path) -> None:
    a, b = Node(tmp_path / "a"), Node(tmp_path / "b")
    c = MessageStore(tmp_path / "c", map_size_bytes=64 << 20)
    try:
        chunks = [
            encode(ProduceBatch(T, 0, 1, (Message(T, b"x"),))),
            receive(10, new(0, 0, [0], 1), new(1, 4, [4, 6], 9, take=1)),
            ack(20, (1, 4, token_of(2, 0))),
            receive(2_000, again(0, 0)),
        ]
        for chunk in chunks:
            a.entries((chunk,))
            b.entries((chunk,))
        for qid in (0, 1):
            assert a.store.pop_state(G, T, qid) == b.store.pop_state(G, T, qid) is not None
        mark = a.entries((encode_record(RetentionRecord(0, Reason.MARK, 7)),))[0].raft_index
        blob = a.store.base(mark)
        assert blob is not None
        c.install_base(blob)
        for qid in (0, 1):
            assert c.pop_state(G, T, qid) == a.store.pop_state(G, T, qid)
        p, _ = decode_state(c.pop_state(G, T, 0) or b"")
        assert p.inflight[0].attempt == 2  # the restored node knows the attempt count
    finally:
        a.store.close()
        b.store.close()
        c.close()


ops = st.lists(
    st.tuples(
        st.sampled_from(["take", "ack", "stale_ack", "change", "tick", "drop"]),
        st.integers(0, 30),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops, fifo=st.booleans())
def test_replicated_pop_never_redelivers_acked_or_early(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]], fifo: bool
) -> None:
    node = Node(tmp_path_factory.mktemp("pop"))
    try:
        now = 0
        queue_end = 25
        acked_: set[int] = set()
        current: dict[int, tuple[int, int, int]] = {}  # offset -> (attempt, token, visible at)
        attempts: dict[int, int] = {}
        for op, n in ops:
            raw = node.store.pop_state(G, T, 0)
            cursor = decode_state(raw)[0].cursor if raw else 0
            if op == "take":
                due = sorted(o for o, (_, _, v) in current.items() if v <= now)
                part = PopQueuePart(
                    0, cursor, fifo, tuple(due), (), cursor, queue_end, 1 + n % 5,
                    tuple(range(cursor, queue_end)),
                )  # fmt: skip
                before = set(current)
                for off, attempt, token, visible in handed(node, receive(now, part, invisible=50)):
                    if fifo and before:
                        assert off in before, "FIFO: a new message while one is unacknowledged"
                    assert off not in acked_, "an acknowledged message was handed out again"
                    if off in current:
                        assert current[off][2] <= now, "handed out again while invisible"
                    assert attempt == attempts.get(off, 0) + 1, "attempts skip or repeat"
                    attempts[off] = attempt
                    current[off] = (attempt, token, visible)
            elif op in ("ack", "stale_ack", "change", "drop") and current:
                off = sorted(current)[n % len(current)]
                attempt, token, _ = current[off]
                if op == "drop":
                    handed(node, receive(now, PopQueuePart(0, cursor, fifo, (), (off,))))
                    del current[off]
                    acked_.add(off)
                    continue
                tok = token - 1 if op == "stale_ack" else token
                inv = 10 + n if op == "change" else 0
                r = result(node, ack(now, (0, off, tok), invisible=inv))
                assert isinstance(r, PopAckResult)
                [(outcome, d)] = r.outcomes
                if op == "stale_ack":
                    assert outcome is AckOutcome.STALE
                elif op == "ack":
                    assert outcome is AckOutcome.DONE
                    del current[off]
                    acked_.add(off)
                else:
                    assert outcome is AckOutcome.DONE and d is not None
                    assert d.visible_at_ms == now + inv and d.attempt == attempt
                    current[off] = (attempt, d.token, d.visible_at_ms)
            else:
                now += 5 * n
            committed = node.store.committed_offset(G, T, 0)
            if committed is not None:
                assert not any(o < committed for o in current), "committed past an unacked one"
    finally:
        node.store.close()
