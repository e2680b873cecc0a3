"""Offsets by the leader (issue 29): the leader's book places base offsets in log order, and every
replica's dispatcher, counting on its own, finds the same ones. A Hypothesis state machine
proposes entries (plain and idempotent v2 batches, retries, gaps, strict batches, chunks whose
offsets the dispatcher assigns, neutral records, new terms) while dispatch lags behind by any
amount, with the dispatcher's own state as the store the book reads; the dispatcher must agree
with every placed offset, and answer each placed batch where it was placed."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from raftmq.broker.delivery import PROPERTY_TIMER_OUT_MS
from raftmq.broker.dispatch import Dispatcher, PendingState, placement_disagreement
from raftmq.broker.errors import OffsetDisagreementError
from raftmq.broker.leader_offsets import LeaderOffsets
from raftmq.broker.rows import Appended
from raftmq.broker.transaction import TxnSettings
from raftmq.broker.txn_apply import TxnApplier
from raftmq.broker.txn_records import (
    HALF_PRODUCER_ID,
    PROP_PRODUCER_GROUP,
    PROP_TRAN_MSG,
    PROP_TRANSACTION_ID,
)
from raftmq.common import stored_batch
from raftmq.common.message import Message
from raftmq.common.record_batch import ProducerSequence, TopicConfigChange, TopicOp, encode
from raftmq.common.topic_config import TopicConfig
from raftmq.raftlog.record import Entry

from .support import commit, produce
from .test_dispatch import EmptyState

HOST = "127.0.0.1:1"


def v2(
    topic: str, queue_id: int, n: int, producer: ProducerSequence | None = None, ts: int = 5
) -> bytearray:
    """A v2 batch as the leader holds it before proposal: checked and stamped (state 1)."""
    messages = [Message(topic, b"m%d" % i, "t", (), {}, 0, 1, HOST) for i in range(n)]
    buf = bytearray(stored_batch.encode_batch(topic, queue_id, messages, producer, HOST))
    stored_batch.stamp(buf, 0, ts)
    return buf


@pytest.mark.parametrize(
    ("placed", "counted", "disagrees"),
    [
        (None, 7, False),  # not placed: the dispatcher assigns
        (None, None, False),
        (7, 7, False),
        (7, 8, True),  # the leader's count and this replica's differ
        (8, 7, True),
        (7, None, True),  # placed, but this replica appends nothing (refused, delayed, half)
        (0, 0, False),
    ],
)
def test_placement_disagreement(placed: int | None, counted: int | None, disagrees: bool) -> None:
    assert (placement_disagreement(placed, counted) is not None) is disagrees


def test_a_forged_placed_offset_stops_dispatch() -> None:
    dispatcher, state = Dispatcher(), PendingState(EmptyState())
    first = v2("T", 0, 2)
    stored_batch.place_offset(first, 0)
    out = dispatcher.apply(Entry(1, 1, (bytes(first),)), state)
    state.absorb(out)
    forged = v2("T", 0, 1)
    stored_batch.place_offset(forged, 5)  # the queue's count is 2
    with pytest.raises(OffsetDisagreementError) as info:
        dispatcher.apply(Entry(2, 1, (bytes(forged),)), state)
    err = info.value
    assert (err.topic, err.queue_id, err.placed, err.counted, err.raft_index, err.slot) == (
        "T",
        0,
        5,
        2,
        2,
        0,
    )


def test_a_placed_retry_that_the_window_refuses_stops_dispatch() -> None:
    dispatcher, state = Dispatcher(), PendingState(EmptyState())
    p = ProducerSequence("p", 0)
    batch = v2("T", 0, 1, p)
    stored_batch.place_offset(batch, 0)
    state.absorb(dispatcher.apply(Entry(1, 1, (bytes(batch),)), state))
    again = v2("T", 0, 1, p)
    stored_batch.place_offset(again, 1)  # a duplicate: this replica appends nothing
    with pytest.raises(OffsetDisagreementError, match="does not append"):
        dispatcher.apply(Entry(2, 1, (bytes(again),)), state)


def test_place_offset_keeps_the_batch_verifiable_in_both_codecs() -> None:
    for name, codec in stored_batch.implementations().items():
        buf = bytearray(codec.encode_batch("T", 1, [Message("T", b"x")], None, HOST))
        codec.stamp(buf, 0, 9)
        assert stored_batch.placed_offset(buf) is None
        stored_batch.place_offset(buf, 41)
        header = codec.verify_stamped(bytes(buf))
        assert (header.base_offset, header.store_timestamp_ms, header.stamped) == (41, 9, True)
        assert stored_batch.placed_offset(buf) == 41, name
        with pytest.raises(ValueError):
            stored_batch.place_offset(buf, 42)  # placed once
        buf[20] ^= 1  # a placed offset changed afterwards fails the stamp CRC
        with pytest.raises(stored_batch.MalformedBatchError):
            codec.verify_stamped(bytes(buf))


def _scheduled(queue_id: int) -> bytearray:
    props = {PROPERTY_TIMER_OUT_MS: "9000"}
    message = Message("T", b"d", None, (), props, 0, 1, HOST)
    buf = bytearray(stored_batch.encode_batch("T", queue_id, [message], None, HOST))
    stored_batch.mark_scheduled(buf)
    stored_batch.stamp(buf, 0, 5)
    return buf


@pytest.mark.parametrize(
    "between",
    [
        "v1 batch",
        "delayed batch",
        "window refusal",
        "immutable batch",
        "read-only view",
        "topic change",
    ],
)
def test_a_chunk_the_dispatcher_counts_holds_placing_until_it_is_dispatched(between: str) -> None:
    """Each rule that unsettles the book, on its own: after a chunk whose effect on the queue
    the dispatcher decides, the next batch is not placed until that chunk is dispatched here,
    and the dispatcher then agrees with every offset placed before and after."""
    dispatcher = Dispatcher(transactions=TxnApplier(TxnSettings()))
    state = PendingState(EmptyState())
    book = LeaderOffsets(state)
    p = ProducerSequence("p", 0)
    chunk: bytes | bytearray | memoryview = {
        "v1 batch": produce("T", 0, 2),
        "delayed batch": _scheduled(0),
        "window refusal": v2("T", 0, 1, p),  # the same sequence again: a duplicate
        "immutable batch": bytes(v2("T", 0, 1)),
        "read-only view": memoryview(bytes(v2("T", 0, 1))),
        "topic change": encode(TopicConfigChange(TopicOp.UPDATE, TopicConfig("T", 4, 4))),
    }[between]
    log = [[v2("T", 0, 2, p)], [chunk], [v2("T", 0, 1)]]
    for index, chunks in enumerate(log, start=1):
        book.place(1, index, 0, 0, [chunks])
    assert stored_batch.placed_offset(log[0][0]) == 0
    assert stored_batch.placed_offset(log[2][0]) is None  # after the chunk: left
    for index, chunks in enumerate(log, start=1):
        state.absorb(dispatcher.apply(Entry(index, 1, tuple(bytes(c) for c in chunks)), state))
    after = v2("T", 0, 1)
    book.place(1, len(log) + 1, len(log), 0, [[after]])  # dispatched: placed again
    head = state.queue_head("T", 0)
    assert stored_batch.placed_offset(after) == (head.next_offset if head else 0)
    dispatcher.apply(Entry(len(log) + 1, 1, (bytes(after),)), state)  # agrees


def test_a_batch_in_place_in_its_request_buffer_is_placed_there() -> None:
    """The data server hands a large request's batches on as writable views of the request's
    own buffer (broker/produce.py): the book places their offsets in place, as in a bytearray,
    and touches nothing of the buffer around them."""
    dispatcher = Dispatcher(transactions=TxnApplier(TxnSettings()))
    state = PendingState(EmptyState())
    book = LeaderOffsets(state)
    first, second = v2("T", 0, 3), v2("T", 0, 2)
    request = bytearray(b"head" + first + b"mid" + second + b"tail")
    views = [
        memoryview(request)[4 : 4 + len(first)],
        memoryview(request)[7 + len(first) : 7 + len(first) + len(second)],
    ]
    book.place(1, 1, 0, 0, [views])
    assert [stored_batch.placed_offset(v) for v in views] == [0, 3]
    assert (request[:4], request[4 + len(first) : 7 + len(first)], request[-4:]) == (
        b"head",
        b"mid",
        b"tail",
    )
    stored_batch.verify_stamped(views[1])
    dispatcher.apply(Entry(1, 1, tuple(bytes(v) for v in views)), state)  # agrees


class Placing(RuleBasedStateMachine):
    """The leader proposes; dispatch follows at its own pace; both must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.dispatcher = Dispatcher(transactions=TxnApplier(TxnSettings()))
        self.state = PendingState(EmptyState())  # the node's index store
        self.book = LeaderOffsets(self.state)
        self.log: list[Entry] = []
        self.placed: dict[tuple[int, int], int] = {}  # (index, slot) -> placed base offset
        self.term = 1
        self.sequences: dict[tuple[str, int], int] = {}  # the producer's next sequence
        self.halves = 0

    def _propose(self, chunks: Sequence[bytes | bytearray]) -> None:
        index = len(self.log) + 1
        self.book.place(self.term, index, self.state.dispatched_index, 0, [chunks])
        for slot, chunk in enumerate(chunks):
            if stored_batch.is_stored(chunk):
                base = stored_batch.placed_offset(chunk)
                if base is not None:
                    self.placed[index, slot] = base
        self.log.append(Entry(index, self.term, tuple(bytes(c) for c in chunks)))

    @rule(queue=st.integers(0, 1), n=st.integers(1, 3), k=st.integers(1, 3))
    def plain(self, queue: int, n: int, k: int) -> None:
        caught_up = self.state.dispatched_index == len(self.log)
        batches = [v2("T", queue, n) for _ in range(k)]
        self._propose(batches)
        if caught_up:  # liveness: a book whose node has dispatched everything places
            assert all(stored_batch.placed_offset(b) is not None for b in batches)

    @rule(
        queue=st.integers(0, 1),
        n=st.integers(1, 3),
        how=st.sampled_from(["next", "retry", "gap", "strict-gap", "overlap"]),
    )
    def idempotent(self, queue: int, n: int, how: str) -> None:
        nxt = self.sequences.get(("p", queue), 0)
        first = {"next": nxt, "gap": nxt + 2, "strict-gap": nxt + 2}.get(how)
        if first is None:  # a retry of the last batch, or one that overlaps it
            first = max(nxt - n, 0) if how == "retry" else max(nxt - 1, 0)
        seq = ProducerSequence("p", first, how == "strict-gap")
        self._propose([v2("T", queue, n, seq)])
        if how in ("next", "gap"):
            self.sequences["p", queue] = max(nxt, first + n)

    @rule(queue=st.integers(0, 1))
    def dispatcher_assigned(self, queue: int) -> None:
        """A v1 batch (stores written before): its offsets are the dispatcher's."""
        self._propose([produce("T", queue, 2)])

    @rule(queue=st.integers(0, 1))
    def immutable_chunk(self, queue: int) -> None:
        """A v2 batch the leader cannot rewrite in place (bytes): left to the dispatcher."""
        self._propose([bytes(v2("T", queue, 1))])

    @rule(queue=st.integers(0, 1))
    def half(self, queue: int) -> None:
        """A transaction's half message: no queue row, no window; the book stays settled."""
        self.halves += 1
        props = {PROP_TRAN_MSG: "true", PROP_TRANSACTION_ID: f"tx{self.halves}"}
        props[PROP_PRODUCER_GROUP] = "pg"
        message = Message("T", b"h", None, (), props, 0, 1, HOST)
        buf = bytearray(
            stored_batch.encode_batch(
                "T", queue, [message], ProducerSequence(HALF_PRODUCER_ID, 0), HOST
            )
        )
        stored_batch.stamp(buf, 0, 5)
        caught_up = self.state.dispatched_index == len(self.log)
        after = v2("T", queue, 1)
        self._propose([buf, after])
        assert stored_batch.placed_offset(buf) is None
        if caught_up:
            assert stored_batch.placed_offset(after) is not None

    @rule()
    def neutral(self) -> None:
        self._propose([commit("g", "T", 0, 1), v2("T", 0, 1)])

    @rule()
    def new_term(self) -> None:
        self.term += 1

    @precondition(lambda self: self.state.dispatched_index < len(self.log))
    @rule(k=st.integers(1, 4))
    def dispatch(self, k: int) -> None:
        for entry in self.log[self.state.dispatched_index : self.state.dispatched_index + k]:
            out = self.dispatcher.apply(entry, self.state)  # raises on a disagreement
            self.state.absorb(out)
            for slot, outcome in enumerate(out.outcomes):
                base = self.placed.get((entry.index, slot))
                if base is not None:
                    assert isinstance(outcome, Appended), outcome
                    assert outcome.stored.first_offset == base


Placing.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_placing = Placing.TestCase
