"""Delayed delivery in apply (broker/delivery.py through the Dispatcher and a real lmdb store): a
SCHEDULED batch enters the on-disk schedule, not its queue; a DELIVER record adds rows of the real
queue pointing at the stored bytes exactly once and never early, also when schedule and delivery
sit in one store transaction (the pending view), and across a reopen. Hypothesis drives random
deliveries, duplicates and early proposals against a model."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.broker.delivery import PROPERTY_TIMER_OUT_MS
from raftmq.broker.dispatch import Dispatcher, DispatchOutput, PendingState
from raftmq.broker.rows import Applied, Scheduled
from raftmq.broker.schedule import MessageRef
from raftmq.broker.schedule_store import location, pack_ref, unpack_ref
from raftmq.broker.store import MessageReader, MessageStore
from raftmq.common.message import Message
from raftmq.common.record_batch import Deliver, DeliverKey, ProduceBatch, decode, encode

from .support import InProcessLog


def delayed(topic: str, queue_id: int, dues: list[int], *, ts_ms: int = 1_000) -> bytes:
    msgs = tuple(
        Message(topic, f"m{i}".encode(), properties={PROPERTY_TIMER_OUT_MS: str(due)})
        for i, due in enumerate(dues)
    )
    return encode(ProduceBatch(topic, queue_id, ts_ms, msgs, scheduled=True))


class Node:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.log = InProcessLog()
        self.store = MessageStore(path, map_size_bytes=64 << 20)
        self.dispatcher = Dispatcher()

    def entries(self, *entries: tuple[bytes, ...]) -> list[DispatchOutput]:
        """Several entries dispatched into one store transaction (the dispatcher thread's way)."""
        pending = PendingState(self.store)
        outs = []
        for chunks in entries:
            out = self.dispatcher.apply(self.log.append(chunks), pending)
            pending.absorb(out)
            outs.append(out)
        self.store.apply(outs)
        return outs

    def scheduled(self, upto_ms: int = 1 << 62) -> list[DeliverKey]:
        index = self.store.schedule_index()
        return [DeliverKey(e.key.due_ms, *location(e.key)) for e in index.scan_due(upto_ms, 10**6)]

    def read(self, topic: str, queue_id: int) -> list[bytes]:
        rows = self.store.read_queue(topic, queue_id, 0, 10**6)
        reader = MessageReader("g", self.log.read)
        return [m.message.body for m in reader.read(rows)]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "store")
    yield n
    n.store.close()


def test_record_round_trip() -> None:
    rec = Deliver(5_000, (DeliverKey(4_000, 7, 1, 2), DeliverKey(4_500, 1 << 40, 0, 4095)))
    assert decode(encode(rec)) == rec
    batch = ProduceBatch("T", 1, 9, (Message("T", b"x"),), scheduled=True)
    assert decode(encode(batch)) == batch


def test_scheduled_then_delivered_once_never_early(node: Node) -> None:
    [out] = node.entries((delayed("T", 0, [3_000, 2_000, 5_000]),))
    assert isinstance(out.outcomes[0], Scheduled) and out.outcomes[0].count == 3
    assert node.store.queue_bounds("T", 0) == (0, 0), "invisible until due"
    keys = node.scheduled()
    assert [k.due_ms for k in keys] == [2_000, 3_000, 5_000]
    # Early: a record at 2 500 may deliver only the 2 000 one, whatever it names.
    [out] = node.entries((encode(Deliver(2_500, tuple(keys))),))
    assert out.outcomes[0] == Applied(
        0, out.outcomes[0].kind, "DeliverCounts(delivered=1, already=0, early=2)"
    )  # type: ignore[union-attr]
    assert node.read("T", 0) == [b"m1"]
    # A duplicate (a deposed leader's proposal) changes nothing; the rest come when due.
    node.entries((encode(Deliver(2_600, (keys[0],))),))
    node.entries((encode(Deliver(9_000, tuple(keys[1:]))),), (encode(Deliver(9_100, tuple(keys))),))
    assert node.read("T", 0) == [b"m1", b"m0", b"m2"]
    assert node.scheduled() == []
    rows = node.store.read_queue("T", 0, 0, 10)
    assert [r.store_timestamp_ms for r in rows] == [2_500, 9_000, 9_000]
    assert [r.position for r in rows] == [1, 0, 2]


def test_schedule_and_delivery_in_one_transaction_and_after_reopen(node: Node) -> None:
    chunk = delayed("T", 1, [1_500])
    out = node.entries((chunk,), (encode(Deliver(2_000, (DeliverKey(1_500, 1, 0, 0),))),))
    assert out[1].loose_rows and node.scheduled() == []
    assert node.read("T", 1) == [b"m0"]
    node.entries((delayed("T", 1, [8_000]),))
    node.store.close()
    node.store = MessageStore(node.path, map_size_bytes=64 << 20)
    [key] = node.scheduled()
    assert key.due_ms == 8_000 and key.raft_index == 3
    node.entries((encode(Deliver(8_000, (key,))),))
    assert node.read("T", 1) == [b"m0", b"m0"]


def test_delivery_writes_the_key_index_once_with_the_delivery_time(node: Node) -> None:
    msgs = (
        Message("T", b"k", keys=("a", "b", "a"), properties={PROPERTY_TIMER_OUT_MS: "1500"}),
        Message("T", b"none", properties={PROPERTY_TIMER_OUT_MS: "1500"}),
        Message("T", b"k2", keys=("b",), properties={PROPERTY_TIMER_OUT_MS: "1600"}),
    )
    node.entries((encode(ProduceBatch("T", 0, 1_000, msgs, scheduled=True)),))
    assert node.store.lookup_key("T", "a", 10) == [], "not in the real topic before it is due"
    node.store.close()  # the keys are kept in the schedule on disk
    node.store = MessageStore(node.path, map_size_bytes=64 << 20)
    keys = node.scheduled()
    [out] = node.entries((encode(Deliver(2_000, tuple(keys))),))
    assert [(k.key, k.queue_offset, k.store_timestamp_ms) for k in out.key_rows()] == [
        ("a", 0, 2_000),
        ("b", 0, 2_000),
        ("b", 2, 2_000),
    ]
    node.entries((encode(Deliver(2_100, tuple(keys))),))  # a duplicate adds no row
    assert [(h.queue_id, h.queue_offset) for h in node.store.lookup_key("T", "b", 10)] == [
        (0, 0),
        (0, 2),
    ]
    assert node.store.lookup_key("T", "a", 10, begin_ms=2_001) == []
    assert node.store.offset_for_timestamp("T", 0, 2_000) == 0


def test_schedule_values_without_keys_still_read() -> None:
    ref = MessageRef(7, 1, 2, "T", 3, 40, 5, 99)
    assert unpack_ref(pack_ref(ref)) == ref
    keyed = dataclasses.replace(ref, keys=("x", "y z"))
    assert unpack_ref(pack_ref(keyed)) == keyed
    assert pack_ref(keyed).startswith(pack_ref(ref))  # a value written before keys: none


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    dues=st.lists(st.integers(0, 50), min_size=1, max_size=12),
    proposals=st.lists(
        st.tuples(st.integers(0, 60), st.lists(st.integers(0, 11), max_size=6)), max_size=12
    ),
)
def test_random_deliveries_match_the_model(
    tmp_path_factory: pytest.TempPathFactory,
    dues: list[int],
    proposals: list[tuple[int, list[int]]],
) -> None:
    n = Node(tmp_path_factory.mktemp("prop") / "store")
    try:
        n.entries((delayed("T", 0, dues, ts_ms=0),))
        keys = {k.position: k for k in n.scheduled()}
        delivered: list[int] = []
        for now, picks in proposals:
            chosen = tuple(keys[p] for p in picks if p in keys)
            n.entries((encode(Deliver(now, chosen)),))
            for k in chosen:
                if k.due_ms <= now and k.position not in delivered:
                    delivered.append(k.position)
        assert n.read("T", 0) == [f"m{p}".encode() for p in delivered]
        rows = n.store.read_queue("T", 0, 0, 100)
        assert all(r.store_timestamp_ms >= dues[r.position] for r in rows), "never early"
        assert sorted(k.position for k in n.scheduled()) == sorted(set(keys) - set(delivered))
    finally:
        n.store.close()
