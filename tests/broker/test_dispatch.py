"""The pure dispatcher: offsets it assigns, idempotent duplicates, errors, determinism."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.broker.dispatch import Dispatcher, DispatchOutput, PendingState, _EntryWork
from raftmq.broker.errors import DispatchGapError
from raftmq.broker.rows import (
    Appended,
    Applied,
    Duplicate,
    KeyRow,
    OffsetRow,
    ProducerState,
    QueueHead,
    Rejected,
    SequenceGap,
    StoredRange,
    TimeRow,
)
from raftmq.broker.schedule import ScheduleEntry
from raftmq.common.filter.tag import tag_hash
from raftmq.common.record_batch import Kind, TopicConfigChange, TopicOp, encode
from raftmq.common.topic_config import TopicConfig
from raftmq.raftlog.record import Entry

from .support import commit, produce, reset


class EmptyState:
    """A store that has dispatched nothing."""

    dispatched_index = 0

    def queue_head(self, topic: str, queue_id: int) -> QueueHead | None:
        return None

    def producer_state(self, producer_id: str, topic: str, queue_id: int) -> ProducerState | None:
        return None

    def topic(self, name: str) -> TopicConfig | None:
        return None

    def pop_state(self, group: str, topic: str, queue_id: int) -> bytes | None:
        return None


class Run:
    """Feeds entries to one dispatcher over an overlay, as the dispatcher thread does."""

    def __init__(self) -> None:
        self.dispatcher = Dispatcher()
        self.state = PendingState(EmptyState())
        self.index = 0

    def entry(self, *chunks: bytes, term: int = 1) -> DispatchOutput:
        self.index += 1
        out = self.dispatcher.apply(Entry(self.index, term, tuple(chunks)), self.state)
        self.state.absorb(out)
        return out


def test_offsets_are_dense_per_queue_across_chunks_and_entries() -> None:
    run = Run()
    out1 = run.entry(produce("T", 0, 3), produce("T", 1, 2), produce("T", 0, 2))
    out2 = run.entry(produce("T", 0, 1))
    firsts = [(o.queue_id, o.stored.first_offset) for o in out1.outcomes if isinstance(o, Appended)]
    assert firsts == [(0, 0), (1, 0), (0, 3)]
    assert [(r.queue_id, r.queue_offset, r.slot, r.position) for r in out1.cq_rows()] == [
        (0, 0, 0, 0), (0, 1, 0, 1), (0, 2, 0, 2), (1, 0, 1, 0), (1, 1, 1, 1), (0, 3, 2, 0),
        (0, 4, 2, 1),
    ]  # fmt: skip
    assert out1.queue_heads == (QueueHead("T", 0, 5, 1000), QueueHead("T", 1, 2, 1000))
    assert out2.cq_rows()[0].queue_offset == 5
    assert out2.cq_rows()[0].raft_index == 2


def test_rows_carry_size_tag_hash_keys_and_time() -> None:
    run = Run()
    out = run.entry(produce("T", 2, 2, ts_ms=5_000, tags="TagA", keys=["k1", "k1", "k2"]))
    rows = out.cq_rows()
    assert {r.tag_hash for r in rows} == {tag_hash("TagA")}
    assert {r.body_bytes for r in rows} == {6}
    assert {r.store_timestamp_ms for r in rows} == {5_000}
    assert out.key_rows() == (
        KeyRow("T", "k1", 2, 0, 5_000),
        KeyRow("T", "k2", 2, 0, 5_000),
        KeyRow("T", "k1", 2, 1, 5_000),
        KeyRow("T", "k2", 2, 1, 5_000),
    )
    assert out.time_rows == (TimeRow("T", 2, 5_000, 0),)


def test_time_index_stays_monotonic_when_a_leader_clock_is_behind() -> None:
    run = Run()
    assert run.entry(produce("T", 0, 2, ts_ms=5_000)).time_rows == (TimeRow("T", 0, 5_000, 0),)
    late = run.entry(produce("T", 0, 1, ts_ms=4_000))  # new leader, clock 1 s behind
    assert late.time_rows == ()
    assert late.queue_heads == (QueueHead("T", 0, 3, 5_000),)
    assert late.cq_rows()[0].store_timestamp_ms == 4_000  # the row keeps the stamped time
    same = run.entry(produce("T", 0, 1, ts_ms=5_000))
    assert same.time_rows == ()
    assert run.entry(produce("T", 0, 1, ts_ms=6_000)).time_rows == (TimeRow("T", 0, 6_000, 4),)


def test_idempotent_retry_is_not_dispatched_and_gets_the_first_answer() -> None:
    run = Run()
    run.entry(produce("T", 0, 2))  # someone else's messages first
    first = run.entry(produce("T", 0, 3, producer=("p1", 0)))
    assert first.outcomes == (Appended(0, "T", 0, StoredRange(2, 3, 2, 0, 0)),)
    retry = run.entry(produce("T", 1, 1), produce("T", 0, 3, producer=("p1", 0)))
    assert retry.outcomes[1] == Duplicate(1, "T", 0, StoredRange(2, 3, 2, 0, 0))
    assert all(b.queue_id == 1 for b in retry.cq_batches)  # nothing appended to queue 0
    assert retry.producer_rows == ()
    # a retry of the tail of the batch: the originals' offsets and positions
    part = run.entry(produce("T", 0, 2, producer=("p1", 1)))
    assert part.outcomes == (Duplicate(0, "T", 0, StoredRange(3, 2, 2, 0, 1)),)
    nxt = run.entry(produce("T", 0, 1, producer=("p1", 3)))
    assert nxt.outcomes == (Appended(0, "T", 0, StoredRange(5, 1, 5, 0, 0)),)


def test_duplicate_within_one_entry() -> None:
    run = Run()
    out = run.entry(produce("T", 0, 2, producer=("p", 7)), produce("T", 0, 2, producer=("p", 7)))
    assert out.outcomes == (
        Appended(0, "T", 0, StoredRange(0, 2, 1, 0, 0)),
        Duplicate(1, "T", 0, StoredRange(0, 2, 1, 0, 0)),
    )
    assert len(out.cq_rows()) == 2


def test_duplicates_older_than_remembered_have_no_offsets() -> None:
    run = Run()
    for seq in range(0, 12, 2):
        run.entry(produce("T", 0, 2, producer=("p", seq)))
    old = run.entry(produce("T", 0, 2, producer=("p", 0)))
    assert old.outcomes == (Duplicate(0, "T", 0, None),)
    # five batches are remembered
    assert run.entry(produce("T", 0, 2, producer=("p", 2))).outcomes[0] == Duplicate(
        0, "T", 0, StoredRange(2, 2, 2, 0, 0)
    )


def test_sequence_gap_is_accepted_and_reported_overlap_is_rejected() -> None:
    run = Run()
    run.entry(produce("T", 0, 2, producer=("p", 0)))
    gap = run.entry(produce("T", 0, 1, producer=("p", 5)))
    assert gap.outcomes == (Appended(0, "T", 0, StoredRange(2, 1, 2, 0, 0), SequenceGap(2, 5)),)
    overlap = run.entry(produce("T", 0, 3, producer=("p", 4)))
    (rej,) = overlap.outcomes
    assert isinstance(rej, Rejected) and "overlap the last stored sequence 5" in rej.reason
    assert overlap.cq_batches == ()
    # sequences are per (producer, topic, queue)
    other = run.entry(produce("T", 1, 1, producer=("p", 0)), produce("U", 0, 1, producer=("p", 0)))
    assert all(isinstance(o, Appended) for o in other.outcomes)


def test_control_entries_only_advance_the_index() -> None:
    run = Run()
    assert run.entry() == DispatchOutput(1, 1)
    assert run.state.dispatched_index == 1


def test_undecodable_and_invalid_chunks_are_reported_and_skipped() -> None:
    run = Run()
    out = run.entry(
        b"\x01\x01garbage",
        produce("bad topic", 0, 1),
        produce("T", 0, 1),
        commit("bad group", "T", 0, 1),
        produce("T", 0, 1, producer=("", 0)),
    )
    kinds = [type(o).__name__ for o in out.outcomes]
    assert kinds == ["Rejected", "Rejected", "Appended", "Rejected", "Rejected"]
    assert [e.slot for e in out.errors] == [0, 1, 3, 4]
    assert "undecodable" in out.errors[0].reason
    assert len(out.cq_rows()) == 1 and out.cq_rows()[0].slot == 2


def test_offset_commits_move_anywhere_and_resets_are_marked() -> None:
    run = Run()
    out = run.entry(commit("g", "T", 0, 10), commit("g", "T", 0, 3), reset("g", "T", {2: 1, 0: 0}))
    assert out.offset_rows == (
        OffsetRow("g", "T", 0, 10),
        OffsetRow("g", "T", 0, 3),
        OffsetRow("g", "T", 0, 0, reset=True),
        OffsetRow("g", "T", 2, 1, reset=True),
    )
    assert out.outcomes[2] == Applied(2, Kind.RESET_OFFSETS, "2 queues")


def test_topic_config_changes() -> None:
    run = Run()
    cfg = TopicConfig("T", 8, 8)

    def change(op: TopicOp, c: TopicConfig) -> bytes:
        return encode(TopicConfigChange(op, c))

    out = run.entry(
        change(TopicOp.CREATE, cfg),
        change(TopicOp.CREATE, TopicConfig("T", 2, 2, auto_created=True)),
        change(TopicOp.UPDATE, TopicConfig("T", 16, 16)),
    )
    assert [o.detail for o in out.outcomes if isinstance(o, Applied)] == [
        "created",
        "exists; unchanged",
        "updated",
    ]
    assert run.state.topic("T") == TopicConfig("T", 16, 16)
    out = run.entry(change(TopicOp.DELETE, cfg), change(TopicOp.DELETE, cfg))
    assert [o.detail for o in out.outcomes if isinstance(o, Applied)] == [
        "deleted",
        "absent; nothing deleted",
    ]
    assert run.state.topic("T") is None
    bad = run.entry(change(TopicOp.UPDATE, TopicConfig("T", 0, 4)))
    assert isinstance(bad.outcomes[0], Rejected)


def test_entries_must_come_in_order() -> None:
    d = Dispatcher()
    with pytest.raises(DispatchGapError):
        d.apply(Entry(2, 1, ()), EmptyState())
    state = PendingState(EmptyState())
    with pytest.raises(DispatchGapError):
        state.absorb(DispatchOutput(3, 1))


# ---- determinism ---------------------------------------------------------------------------------

chunk_strategy = st.one_of(
    st.builds(
        lambda t, q, n, ts, tag, seq: produce(
            t, q, n, ts_ms=ts, tags=tag, keys=[f"k{n}"], producer=seq
        ),
        st.sampled_from(["A", "B"]),
        st.integers(0, 2),
        st.integers(1, 4),
        st.integers(0, 3_000),
        st.sampled_from([None, "x", "y"]),
        st.none() | st.tuples(st.sampled_from(["p", "q"]), st.integers(0, 12)),
    ),
    st.builds(
        commit, st.just("g"), st.sampled_from(["A", "B"]), st.integers(0, 2), st.integers(0, 50)
    ),
    st.builds(
        reset, st.just("g"), st.just("A"), st.dictionaries(st.integers(0, 2), st.integers(0, 9))
    ),
    st.binary(max_size=12),
)
entries_strategy = st.lists(st.lists(chunk_strategy, max_size=4), min_size=1, max_size=12)


@given(entries_strategy, st.data())
@settings(max_examples=60, deadline=None)
def test_same_entries_same_outputs_however_they_are_batched(
    chunk_lists: list[list[bytes]], data: st.DataObject
) -> None:
    entries = [Entry(i + 1, 1, tuple(chunks)) for i, chunks in enumerate(chunk_lists)]
    one = Run()
    outputs_a = [one.entry(*e.chunks) for e in entries]
    # a second replica, whose overlay is rebuilt at arbitrary batch boundaries (as the thread
    # does per lmdb transaction) over a base holding everything absorbed before
    base = PendingState(EmptyState())
    dispatcher = Dispatcher()
    state = PendingState(base)
    outputs_b = []
    for e in entries:
        out = dispatcher.apply(e, state)
        state.absorb(out)
        outputs_b.append(out)
        if data.draw(st.booleans()):
            for o in outputs_b[len(outputs_b) - (state.dispatched_index - base.dispatched_index) :]:
                base.absorb(o)
            state = PendingState(base)
    assert outputs_a == outputs_b
    assert repr(outputs_a) == repr(outputs_b)


def test_an_entry_output_keeps_every_kind_of_row() -> None:
    """_EntryWork.output builds a produce-only entry's output (the common one) from its four
    produce fields; an entry with any other row must get the full output. A field added to
    DispatchOutput needs a line here (the first assert), and one that output() forgets to
    look at fails the second."""
    sentinel, key = object(), object()

    def put(attr: str, value: object = sentinel) -> Callable[[Any], None]:
        def feed(work: Any) -> None:
            target = getattr(work, attr)
            if isinstance(target, list):
                target.append(value)
            else:
                target[key] = value

        return feed

    def retention(work: Any) -> None:
        work.retention = sentinel

    feeds: dict[str, Callable[[Any], None]] = {
        "outcomes": put("outcomes"), "cq_batches": put("cq_batches"),
        "time_rows": put("time_rows"), "queue_heads": put("heads"),
        "offset_rows": put("offset_rows"), "deleted_groups": put("deleted_groups"),
        "group_configs": put("group_configs"), "purges": put("purges"),
        "producer_rows": put("producers"), "topic_rows": put("topics"),
        "txn_rows": put("txn_rows"), "loose_rows": put("loose_rows"),
        "loose_key_rows": put("loose_key_rows"), "schedule_puts": put("schedule"),
        "schedule_deletes": put("schedule", None), "retention": retention,
        "lock_rows": put("locks"), "pop_rows": put("pops"),
    }  # fmt: skip
    fields = {f.name for f in dataclasses.fields(DispatchOutput)} - {"raft_index", "term"}
    assert set(feeds) == fields
    for name, feed in feeds.items():
        work = _EntryWork(EmptyState())
        feed(work)
        got = getattr(work.output(7, 2), name)
        if name == "retention":
            assert got is sentinel
        elif name == "schedule_puts":
            assert got == (ScheduleEntry(key, sentinel),)  # type: ignore[arg-type]  # a sentinel object stands for the value
        elif name == "schedule_deletes":
            assert got == (key,)
        else:
            assert got == (sentinel,), name
