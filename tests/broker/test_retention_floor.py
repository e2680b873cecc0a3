"""Retention beside the lifecycle features (a real lmdb store, the real Dispatcher): a scheduled
message pins the entry its bytes are in; once delivered, its row pins that entry for as long as
a cut would keep the row (a cut on a base written after the delivery takes row and entry away
together); so a base a cut stands on has an empty schedule, and bases do not carry it."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.broker.errors import StoreError
from raftmq.broker.retention import Reason, RetentionRecord, encode_record
from raftmq.broker.retention_store import decode_base
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


def test_a_base_does_not_grow_with_the_schedule(tmp_path: Path) -> None:
    """A base counts the schedule instead of carrying it: no cut can stand on a base taken while
    something was scheduled (the floor), so installing one is refused, and installing the base
    of a cut empties the schedule a node had (it was empty at the base on every replica)."""
    a = Node(tmp_path / "a")
    b = Node(tmp_path / "b")
    try:
        a.entries((plain("T", 1),))  # 1
        empty = a.entries((retention(0),))[0].raft_index  # 2: a base, nothing scheduled
        small = a.store.base(empty)
        a.entries((delayed("T", 0, list(range(9_000, 9_500))),))  # 3: 500 scheduled
        mark = a.entries((retention(0),))[0].raft_index  # 4
        held = a.store.base(mark)
        assert small is not None and held is not None
        assert len(held) - len(small) < 200, "the 500 schedule rows are not in the base"
        assert decode_base(held).unbased_rows == 1_000  # the schedule and its refs
        assert decode_base(small).unbased_rows == 0
        with pytest.raises(StoreError, match="taken with 1000 scheduled messages"):
            b.store.install_base(held)
        # The follower that installs the empty-schedule base (the one a cut stands on) ends
        # with an empty schedule, whatever it held before.
        b.entries((delayed("T", 0, [7_000]),))
        assert b.scheduled()
        assert b.store.install_base(small) == empty
        assert b.scheduled() == []
        assert b.store.retention_floor(empty) is None
        # The cut on the base with the schedule is refused (by the floor, as always).
        assert "still referenced" in cut_refused(a, mark + 1)
    finally:
        a.store.close()
        b.store.close()


def test_a_version_1_base_still_reads(node: Node) -> None:
    """Bases written before version 2 carried the schedule tables (sections 5 and 7)."""
    rows = [[(b"k%d" % i, b"v")] for i in range(10)]
    parts = [struct.pack("<4sIQQI", b"RMQB", 1, 12, 3, len(rows))]
    for section in rows:
        parts.append(struct.pack("<I", len(section)))
        for k, v in section:
            parts += [struct.pack("<I", len(k)), k, struct.pack("<I", len(v)), v]
    base = decode_base(b"".join(parts))
    assert (base.index, base.term, base.unbased_rows) == (12, 3, 2)
    assert [r[0][0] for r in base.sections] == [b"k0", b"k1", b"k2", b"k3", b"k4", b"k6", b"k8",
                                                b"k9"]  # fmt: skip


def test_only_delivered_rows_written_after_the_base_pin(node: Node) -> None:
    node.entries((delayed("T", 0, [2_000, 2_100]),))  # 1
    keys = node.scheduled()
    node.entries((encode(Deliver(5_000, tuple(keys))),))  # 2: both delivered
    assert node.store.retention_floor(1) == 1  # a cut on base 1 would keep the rows
    assert node.store.retention_floor(2) is None  # on base 2 they go with it
