"""Retention beside the lifecycle features (a real lmdb store, the real Dispatcher): a scheduled
message pins the entry its bytes are in; once delivered, its row pins that entry for as long as
a cut would keep the row (a cut on a base written after the delivery takes row and entry away
together); a base carries the schedule, so a node that installs one still delivers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.broker.retention import Reason, RetentionRecord, encode_record
from raftmq.broker.store import MessageStore
from raftmq.common.record_batch import Deliver, ProduceBatch, encode

from .test_delivery_apply import Node, delayed


def retention(cut: int) -> bytes:
    return encode_record(RetentionRecord(cut, Reason.TIME if cut else Reason.MARK, 7))


def plain(topic: str, queue_id: int) -> bytes:
    from raftmq.common.message import Message

    return encode(ProduceBatch(topic, queue_id, 1_000, (Message(topic, b"x"),)))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "store")
    yield n
    n.store.close()


def cut_refused(node: Node, cut: int) -> str:
    node.entries((retention(cut),))
    [applied] = node.store.cuts_applied
    return applied.refused


def test_a_scheduled_then_delivered_message_pins_its_entry(node: Node) -> None:
    node.entries((delayed("T", 0, [2_000]),))  # entry 1: scheduled, its bytes in entry 1
    node.entries((plain("T", 1),))  # 2
    node.entries((retention(0),))  # 3: a base at 3
    assert "still referenced" in cut_refused(node, 4)  # 4: the schedule pins entry 1
    assert node.store.cut_index == 0
    [key] = node.scheduled()
    node.entries((encode(Deliver(5_000, (key,))),))  # 5: a row of T/0 pointing into entry 1
    assert node.read("T", 0) == [b"m0"]
    # The cut on base 3 would keep the row (written at 5, after the base) and delete entry 1.
    assert "still referenced" in cut_refused(node, 4)  # 6
    assert node.store.cut_index == 0 and node.read("T", 0) == [b"m0"]
    node.entries((retention(0),))  # 7: a base after the delivery
    assert cut_refused(node, 8) == ""  # 8: row and entry go together
    assert node.store.cut_index == 8
    assert node.store.queue_bounds("T", 0)[0] == 1  # the delivered row is below the min offset


def test_a_base_carries_the_schedule(tmp_path: Path) -> None:
    a = Node(tmp_path / "a")
    b = MessageStore(tmp_path / "b", map_size_bytes=64 << 20)
    try:
        a.entries((plain("T", 1),))  # 1
        a.entries((retention(0),))  # 2: base
        a.entries((delayed("T", 0, [9_000]),))  # 3: scheduled after the base
        mark = a.entries((retention(0),))[0].raft_index  # 4: a base holding the schedule entry
        blob = a.store.base(mark)
        assert blob is not None
        b.install_base(blob)
        assert [e.key for e in b.schedule_index().scan_due(1 << 62, 10)] == [
            e.key for e in a.store.schedule_index().scan_due(1 << 62, 10)
        ]
        assert b.retention_floor(mark) == 3  # the scheduled message's entry, pinned there too
    finally:
        a.store.close()
        b.close()


def test_only_delivered_rows_written_after_the_base_pin(node: Node) -> None:
    node.entries((delayed("T", 0, [2_000, 2_100]),))  # 1
    keys = node.scheduled()
    node.entries((encode(Deliver(5_000, tuple(keys))),))  # 2: both delivered
    assert node.store.retention_floor(1) == 1  # a cut on base 1 would keep the rows
    assert node.store.retention_floor(2) is None  # on base 2 they go with it
