"""MessageStore (lmdb) and MessageReader: queue reads, tag filter, time and key lookups, offsets,
resume after reopen, and message bytes fetched from the log once per entry."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.broker import store as store_mod
from raftmq.broker.dispatch import Dispatcher, DispatchOutput, PendingState
from raftmq.broker.errors import DispatchGapError, StoreError, StoreFullError
from raftmq.broker.rows import Appended, BatchOrigin, ProducerState
from raftmq.broker.store import KeyHit, MessageReader, MessageStore
from raftmq.common.filter.tag import tag_hash
from raftmq.common.message import decode_msg_id
from raftmq.common.record_batch import PurgeQueues, TopicConfigChange, TopicOp, encode
from raftmq.common.topic_config import TopicConfig
from raftmq.raftlog.record import Entry

from .support import InProcessLog, commit, produce, reset


class Node:
    """A store fed from an in-process log, one transaction per call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.log = InProcessLog()
        self.store = MessageStore(path, map_size_bytes=64 << 20)
        self.dispatcher = Dispatcher()

    def entry(self, *chunks: bytes) -> DispatchOutput:
        e = self.log.append(chunks)
        out = self.dispatcher.apply(e, self.store)
        self.store.apply(out)
        return out

    def reopen(self) -> None:
        self.store.close()
        self.store = MessageStore(self.path, map_size_bytes=64 << 20)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "store")
    yield n
    n.store.close()


def test_rows_survive_reopen_and_dispatch_resumes(node: Node) -> None:
    node.entry(produce("T", 0, 3))
    node.entry()
    node.entry(produce("T", 0, 2), commit("g", "T", 0, 4))
    node.reopen()
    assert node.store.dispatched_index == 3
    assert node.store.queue_bounds("T", 0) == (0, 5)
    assert node.store.committed_offset("g", "T", 0) == 4
    out = node.entry(produce("T", 0, 1))
    assert out.cq_rows()[0].queue_offset == 5


def test_apply_refuses_gaps_and_writes_nothing_then(node: Node) -> None:
    node.entry(produce("T", 0, 1))
    with pytest.raises(DispatchGapError):
        node.store.apply(DispatchOutput(3, 1))
    a = Dispatcher().apply(Entry(2, 1, (produce("T", 0, 1),)), node.store)
    with pytest.raises(DispatchGapError):
        node.store.apply([a, DispatchOutput(4, 1)])  # the whole transaction is rolled back
    assert node.store.dispatched_index == 1
    assert node.store.queue_bounds("T", 0) == (0, 1)


def test_several_outputs_in_one_transaction(node: Node) -> None:
    state = PendingState(node.store)
    outs = []
    for i in range(1, 4):
        out = node.dispatcher.apply(Entry(i, 1, (produce("T", 1, 2),)), state)
        state.absorb(out)
        outs.append(out)
    node.store.apply(outs)
    assert node.store.dispatched_index == 3
    assert [r.queue_offset for r in node.store.read_queue("T", 1, 0, 100)] == list(range(6))


def test_read_queue_ranges(node: Node) -> None:
    node.entry(produce("T", 0, 5), produce("T", 1, 2), produce("U", 0, 1))
    node.entry(produce("T", 0, 5))
    rows = node.store.read_queue("T", 0, 3, 4)
    assert [(r.queue_offset, r.raft_index, r.position) for r in rows] == [
        (3, 1, 3), (4, 1, 4), (5, 2, 0), (6, 2, 1),
    ]  # fmt: skip
    assert [r.queue_offset for r in node.store.read_queue("T", 0, 8, 32)] == [8, 9]
    assert node.store.read_queue("T", 0, 10, 32) == []
    assert node.store.read_queue("T", 2, 0, 32) == []
    assert node.store.read_queue("Nope", 0, 0, 32) == []
    assert node.store.queue_bounds("Nope", 0) == (0, 0)
    assert len(node.store.read_queue("T", 1, 0, 32)) == 2
    with pytest.raises(ValueError):
        node.store.read_queue("T", 0, 0, 0)


def test_tag_filter(node: Node) -> None:
    node.entry(
        produce("T", 0, 2, tags="A"),
        produce("T", 0, 2, tags="B"),
        produce("T", 0, 1),
        produce("T", 0, 2, tags="A"),
    )
    a, b = tag_hash("A"), tag_hash("B")
    assert [r.queue_offset for r in node.store.read_queue("T", 0, 0, 32, [a])] == [0, 1, 5, 6]
    assert [r.queue_offset for r in node.store.read_queue("T", 0, 0, 32, {a, b})] == [
        0, 1, 2, 3, 5, 6,
    ]  # fmt: skip
    assert [r.queue_offset for r in node.store.read_queue("T", 0, 0, 32, [0])] == [4]
    assert node.store.read_queue("T", 0, 0, 32, [tag_hash("C")]) == []
    # a scan that skipped everything says where to continue
    scan = node.store.scan_queue("T", 0, 0, 32, [tag_hash("C")])
    assert scan.rows == [] and scan.next_offset == 7
    scan = node.store.scan_queue("T", 0, 0, 32, [a], max_scan_rows=3)
    assert [r.queue_offset for r in scan.rows] == [0, 1] and scan.next_offset == 3
    scan = node.store.scan_queue("T", 0, 0, 1, [a])
    assert scan.next_offset == 1


def test_offset_for_timestamp(node: Node) -> None:
    s = node.store
    assert s.offset_for_timestamp("T", 0, 1_000) == 0  # empty queue
    node.entry(produce("T", 0, 2, ts_ms=1_000))  # offsets 0-1
    node.entry(produce("T", 0, 3, ts_ms=2_000))  # 2-4
    node.entry(produce("T", 0, 1, ts_ms=2_000))  # 5, same millisecond
    node.entry(produce("T", 0, 2, ts_ms=1_500))  # 6-7, a leader whose clock is behind
    node.entry(produce("T", 0, 1, ts_ms=3_000))  # 8
    assert s.offset_for_timestamp("T", 0, -5) == 0  # before the first: the min offset
    assert s.offset_for_timestamp("T", 0, 999) == 0
    assert s.offset_for_timestamp("T", 0, 1_000) == 0
    assert s.offset_for_timestamp("T", 0, 1_001) == 2
    assert s.offset_for_timestamp("T", 0, 1_500) == 2  # stored late batches count as 2_000
    assert s.offset_for_timestamp("T", 0, 2_000) == 2
    assert s.offset_for_timestamp("T", 0, 2_001) == 8
    assert s.offset_for_timestamp("T", 0, 3_000) == 8
    assert s.offset_for_timestamp("T", 0, 3_001) == 9  # after the last: max (exclusive)
    assert s.offset_for_timestamp("T", 1, 3_001) == 0
    node.entry(produce("T", 1, 1, ts_ms=9_000))
    assert s.offset_for_timestamp("T", 0, 5_000) == 9  # another queue's rows are not ours


def test_key_lookup(node: Node) -> None:
    long_key = "k" * 2_000  # beyond lmdb's 511-byte keys: the index hashes it
    node.entry(
        produce("T", 0, 2, keys=["order-1"], ts_ms=100),
        produce("T", 3, 1, keys=["order-1", long_key], ts_ms=200),
    )
    node.entry(
        produce("U", 0, 1, keys=["order-1"]), produce("T", 0, 1, keys=["order-2"], ts_ms=300)
    )
    s = node.store
    assert s.lookup_key("T", "order-1", 10) == [
        KeyHit(0, 0, 100), KeyHit(0, 1, 100), KeyHit(3, 0, 200),
    ]  # fmt: skip
    assert s.lookup_key("T", "order-1", 2) == [KeyHit(0, 0, 100), KeyHit(0, 1, 100)]
    assert s.lookup_key("T", "order-1", 10, begin_ms=150) == [KeyHit(3, 0, 200)]
    assert s.lookup_key("T", "order-1", 10, end_ms=150) == [KeyHit(0, 0, 100), KeyHit(0, 1, 100)]
    assert s.lookup_key("T", long_key, 10) == [KeyHit(3, 0, 200)]
    assert s.lookup_key("T", "order-2", 10) == [KeyHit(0, 2, 300)]
    assert s.lookup_key("T", "order-3", 10) == []
    assert len(s.lookup_key("U", "order-1", 10)) == 1


def test_consumer_offsets(node: Node) -> None:
    node.entry(commit("g", "T", 0, 7), commit("g1", "T", 0, 9), commit("g", "T", 1, 2))
    node.entry(commit("g", "T", 0, 3))  # commits may move backwards (RocketMQ)
    s = node.store
    assert s.committed_offset("g", "T", 0) == 3
    assert s.committed_offset("g", "T", 5) is None
    assert s.committed_offsets("g", "T") == {0: 3, 1: 2}
    node.entry(reset("g", "T", {0: 0, 1: 0, 4: 1}))
    assert s.committed_offsets("g", "T") == {0: 0, 1: 0, 4: 1}
    assert s.committed_offsets("g1", "T") == {0: 9}
    assert s.committed_offsets("g", "TT") == {}


def test_producer_table_and_topics_persist(node: Node) -> None:
    node.entry(
        produce("T", 0, 2, producer=("p", 0)),
        encode(TopicConfigChange(TopicOp.CREATE, TopicConfig("T", 8, 8, ordered=True))),
    )
    node.entry(encode(TopicConfigChange(TopicOp.UPDATE, TopicConfig("A", 1, 1, auto_created=True))))
    node.reopen()
    state = node.store.producer_state("p", "T", 0)
    assert state is not None and state.last_sequence == 1 and state.recent[0].first_offset == 0
    assert node.store.producer_state("p", "T", 1) is None
    assert node.store.topic("T") == TopicConfig("T", 8, 8, ordered=True)
    assert [t.name for t in node.store.topics()] == ["A", "T"]
    # a retry after a restart is still recognised
    out = node.entry(produce("T", 0, 2, producer=("p", 0)))
    assert type(out.outcomes[0]).__name__ == "Duplicate"
    node.entry(encode(TopicConfigChange(TopicOp.DELETE, TopicConfig("A"))))
    assert node.store.topic("A") is None


def test_reader_decodes_each_entry_once_per_call(node: Node) -> None:
    node.entry(produce("T", 0, 40, tags="A", keys=["k"]), produce("T", 0, 5))
    node.entry(produce("T", 0, 5))
    reader = MessageReader("broker-a", node.log.read)
    rows = node.store.read_queue("T", 0, 10, 32)
    msgs = reader.read(rows)
    assert node.log.reads == 1  # 32 messages, one entry read
    assert [m.queue_offset for m in msgs] == list(range(10, 42))
    first = msgs[0]
    assert first.message.body == b"hello\x0a" and first.message.tags == "A"
    assert first.topic == "T" and first.store_timestamp_ms == 1_000
    assert (first.raft_index, first.slot, first.position) == (1, 0, 10)
    assert msgs[-1].slot == 1 and msgs[-1].position == 1
    msgs = reader.read(node.store.read_queue("T", 0, 44, 32))
    assert node.log.reads == 3
    assert [m.raft_index for m in msgs] == [1] + [2] * 5


def test_one_message_of_a_big_batch(node: Node) -> None:
    node.entry(produce("T", 0, 1000, keys=["k"], body=b"m"))
    reader = MessageReader("broker-a", node.log.read)
    (m,) = reader.read(node.store.read_queue("T", 0, 777, 1))
    assert m.queue_offset == 777 and m.position == 777
    assert m.message.body == b"m" + bytes([777 % 256]) and m.message.keys == ("k",)


def test_message_id_names_the_same_message(node: Node) -> None:
    out = node.entry(produce("T", 1, 3), produce("T", 1, 3))
    appended = out.outcomes[1]
    assert isinstance(appended, Appended)
    reader = MessageReader("broker-a", node.log.read)
    (m,) = reader.read([node.store.read_queue("T", 1, 4, 1)[0]])
    mid = decode_msg_id(m.msg_id)
    assert mid.broker_group == "broker-a"
    row = node.store.cq_row_at(mid.raft_index, mid.slot, mid.position)
    assert row is not None and row.queue_offset == 4
    assert reader.read([row])[0] == m
    assert node.store.cq_row_at(1, 1, 3) is None  # past the batch
    assert node.store.cq_row_at(9, 0, 0) is None


def test_reader_refuses_rows_that_disagree_with_the_log(node: Node) -> None:
    node.entry(produce("T", 0, 2), commit("g", "T", 0, 1))
    row = node.store.read_queue("T", 0, 0, 1)[0]
    reader = MessageReader("b", node.log.read)
    bad_rows = [
        replace(row, slot=1),  # an offset commit, not a batch
        replace(row, slot=5),
        replace(row, position=9),
        replace(row, body_bytes=99),
        replace(row, topic="U"),
        replace(row, chunk_offset_bytes=3),
    ]
    for bad in bad_rows:
        with pytest.raises(StoreError):
            reader.read([bad])


def test_full_store_is_a_typed_error(tmp_path: Path) -> None:
    log = InProcessLog()
    with MessageStore(tmp_path / "tiny", map_size_bytes=256 << 10) as store:
        d = Dispatcher()
        with pytest.raises(StoreFullError, match="map_size_bytes"):
            for _ in range(200):
                e = log.append([produce("T", 0, 200, keys=["k"])])
                store.apply(d.apply(e, store))


def test_producer_rows_read_from_the_cache_equal_the_rows_on_disk(node: Node) -> None:
    """The decoded producer rows the dispatcher reads come from what apply() wrote; a store
    opened afresh (empty cache) reads the same from lmdb, and a read never fills the cache."""
    for seq in range(0, 14, 2):
        node.entry(produce("T", 0, 2, producer=("p", seq)), produce("T", 1, 1, producer=("p", seq)))
    cached = {q: node.store.producer_state("p", "T", q) for q in (0, 1)}
    assert cached[0] is not None and cached[0].last_sequence == 13
    assert len(cached[0].recent) == 5 and cached[0].recent[-1].first_offset == 12
    node.reopen()
    assert node.store._producer_cache == {}
    assert {q: node.store.producer_state("p", "T", q) for q in (0, 1)} == cached
    assert node.store._producer_cache == {}, "a read must not fill the cache"


def test_topic_reads_follow_every_applied_change_and_equal_the_table(node: Node) -> None:
    """store.topic reads a mirror of the topics table (the leader asks on every send): after
    each create, update, delete and a failed transaction it equals what the table holds."""

    def on_disk() -> dict[str, TopicConfig]:
        return {t.name: t for t in node.store.topics()}

    def change(op: TopicOp, cfg: TopicConfig) -> None:
        node.entry(encode(TopicConfigChange(op, cfg)))
        assert node.store._topic_cache == on_disk()

    change(TopicOp.CREATE, TopicConfig("T", 8, 8, ordered=True))
    change(TopicOp.CREATE, TopicConfig("T", 2, 2))  # exists: unchanged
    assert node.store.topic("T") == TopicConfig("T", 8, 8, ordered=True)
    change(TopicOp.UPDATE, TopicConfig("T", 4, 4, auto_created=True))
    change(TopicOp.UPDATE, TopicConfig("U", 1, 1))
    change(TopicOp.DELETE, TopicConfig("U"))
    assert node.store.topic("U") is None
    assert node.store.topic("T") == TopicConfig("T", 4, 4, auto_created=True)
    with pytest.raises(DispatchGapError):  # nothing written, nothing mirrored
        node.store.apply(DispatchOutput(node.store.dispatched_index + 2, 1))
    assert node.store._topic_cache == on_disk()
    node.reopen()
    assert node.store._topic_cache == on_disk() == {"T": TopicConfig("T", 4, 4, auto_created=True)}


@given(
    st.lists(
        st.builds(
            BatchOrigin,
            st.integers(0, (1 << 64) - 1),
            st.integers(0, (1 << 32) - 1),
            st.integers(0, (1 << 64) - 1),
            st.integers(0, (1 << 64) - 1),
            st.integers(0, (1 << 32) - 1),
        ),
        max_size=64,
    ),
    st.integers(0, (1 << 64) - 1),
    st.integers(0, (1 << 64) - 1),
)
def test_a_producer_row_decodes_to_the_state_encoded(
    recent: list[BatchOrigin], last_sequence: int, last_ts: int
) -> None:
    state = ProducerState(last_sequence, last_ts, tuple(recent))
    assert store_mod._decode_producer(store_mod._encode_producer(state)) == state


def _tables(store: MessageStore) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every row of every table, as stored (sealed): what two stores must agree on."""
    raw = store._env.raw  # the bytes themselves, not the checked view
    out: dict[str, list[tuple[bytes, bytes]]] = {}
    with raw.begin() as txn:
        for table in store._all_tables():
            out[table.name] = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=table.handle)]
    return out


_ENTRY = st.one_of(
    st.tuples(st.just("produce"), st.integers(0, 2), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("purge"), st.integers(0, 2), st.integers(0, 12), st.just(False)),
    st.tuples(st.just("commit"), st.integers(0, 2), st.integers(0, 12), st.just(False)),
)


@given(
    entries=st.lists(_ENTRY, min_size=1, max_size=14),
    cuts=st.lists(st.integers(1, 5), min_size=1, max_size=14),
)
def test_the_store_is_the_same_whatever_entries_share_a_transaction(
    tmp_path_factory: pytest.TempPathFactory,
    entries: list[tuple[str, int, int, bool]],
    cuts: list[int],
) -> None:
    """Heads and producer rows are written once per key per transaction (the last value), so a
    follower's long round and the leader's one-entry rounds must still leave the same rows:
    one transaction per entry against transactions of `cuts` entries, purges among them."""
    seqs = [0, 0, 0]
    chunks: list[bytes] = []
    for kind, queue, n, idempotent in entries:
        if kind == "produce":
            producer = ("p1", seqs[queue]) if idempotent else None
            if idempotent:
                seqs[queue] += n
            chunks.append(produce("T", queue, n, producer=producer, ts_ms=1_000 + len(chunks)))
        elif kind == "purge":
            chunks.append(encode(PurgeQueues("T", {queue: n})))
        else:
            chunks.append(commit("g", "T", queue, n))
    log = InProcessLog()
    for chunk in chunks:
        log.append([chunk])
    one = MessageStore(tmp_path_factory.mktemp("one"), map_size_bytes=64 << 20)
    grouped = MessageStore(tmp_path_factory.mktemp("grouped"), map_size_bytes=64 << 20)
    try:
        for i in range(1, len(chunks) + 1):
            one.apply(Dispatcher().apply(log.read(i), one))
        index, dispatcher, rounds = 1, Dispatcher(), iter(cuts * len(chunks))
        while index <= len(chunks):
            state, outs = PendingState(grouped), []
            for entry in log.read_from(index, max_bytes=1 << 20, max_entries=next(rounds)):
                out = dispatcher.apply(entry, state)
                state.absorb(out)
                outs.append(out)
            grouped.apply(outs)
            index += len(outs)
        assert _tables(grouped) == _tables(one)
    finally:
        one.close()
        grouped.close()
