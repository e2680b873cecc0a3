"""Transactions as the dispatcher applies them (broker/txn_apply.py) over a real lmdb store: a half
message gets no ConsumeQueue row; a commit adds one row pointing at the half's bytes, exactly
once; rollbacks and moves add none to the real topic; the table persisted with the dispatched
index restores to the same state (a restart, a new leader); the record codec refuses bad bytes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.broker.dispatch import Dispatcher, DispatchOutput, PendingState
from raftmq.broker.rows import Appended, Applied, Duplicate, Rejected
from raftmq.broker.store import MessageReader, MessageStore
from raftmq.broker.transaction import MOVED_TOPIC, Resolution, TxnSettings, TxnState
from raftmq.broker.txn_apply import TxnApplier, parse_end_detail
from raftmq.broker.txn_records import (
    HALF_PRODUCER_ID,
    PROP_PRODUCER_GROUP,
    PROP_TRAN_MSG,
    PROP_TRANSACTION_CLIENT,
    PROP_TRANSACTION_ID,
    TxnCheck,
    TxnEnd,
    TxnMoved,
    decode_txn,
    encode_txn,
)
from raftmq.common.message import Message
from raftmq.common.record_batch import (
    MalformedBatchError,
    ProduceBatch,
    ProducerSequence,
    encode,
)
from raftmq.raftlog.record import Entry

SETTINGS = TxnSettings(transaction_timeout_ms=1000, check_interval_ms=500, max_checks=2)
T = "orders"


def half(txn_id: str, body: bytes, ts: int, queue_id: int = 1) -> bytes:
    props = {
        PROP_TRAN_MSG: "true",
        PROP_PRODUCER_GROUP: "pg",
        PROP_TRANSACTION_ID: txn_id,
        PROP_TRANSACTION_CLIENT: "c1",
        "user": "x",
    }
    msg = Message(T, body, "tagA", ("key-" + txn_id,), props)
    return encode(ProduceBatch(T, queue_id, ts, (msg,), ProducerSequence(HALF_PRODUCER_ID, 0)))


def plain(body: bytes, ts: int, queue_id: int = 1) -> bytes:
    return encode(ProduceBatch(T, queue_id, ts, (Message(T, body),)))


def detail(out: DispatchOutput, slot: int = 0) -> str:
    outcome = out.outcomes[slot]
    assert isinstance(outcome, Applied), outcome
    return outcome.detail


class Node:
    """One replica: a dispatcher with transactions over a real store, entries kept in memory."""

    def __init__(self, path: Path, entries: list[Entry], txn: TxnSettings = SETTINGS) -> None:
        self.store = MessageStore(path, map_size_bytes=1 << 26)
        self.applier = TxnApplier(txn, self.store.transaction_values())
        self.dispatcher = Dispatcher(transactions=self.applier)
        self.entries = entries
        self.reader = MessageReader("g", lambda i: self.entries[i - 1])

    def feed(self, *chunks: bytes) -> DispatchOutput:
        entry = Entry(len(self.entries) + 1, 1, tuple(chunks))
        self.entries.append(entry)
        return self.catch_up()[-1]

    def catch_up(self) -> list[DispatchOutput]:
        pending = PendingState(self.store)
        outs = []
        for entry in self.entries[self.store.dispatched_index :]:
            out = self.dispatcher.apply(entry, pending)
            pending.absorb(out)
            outs.append(out)
        self.store.apply(outs)
        return outs

    def bodies(self, topic: str = T, queue_id: int = 1) -> list[bytes]:
        rows = self.store.read_queue(topic, queue_id, 0, 100)
        return [bytes(m.message.body) for m in self.reader.read(rows)]

    def close(self) -> None:
        self.store.close()


def test_commit_indexes_the_half_once_rollback_and_move_never(tmp_path: Path) -> None:
    node = Node(tmp_path / "a", [])
    out = node.feed(half("t1", b"one", 1000), half("t2", b"two", 1000), plain(b"p", 1000))
    assert isinstance(out.outcomes[0], Appended) and isinstance(out.outcomes[1], Appended)
    assert node.bodies() == [b"p"]  # halves invisible
    assert isinstance(node.feed(half("t1", b"again", 1001)).outcomes[0], Duplicate)

    out = node.feed(encode_txn(TxnEnd("t1", Resolution.COMMIT, 1100)))
    assert parse_end_detail(detail(out))[1] is TxnState.COMMITTED
    assert node.bodies() == [b"p", b"one"]
    msg = node.reader.read(node.store.read_queue(T, 1, 1, 1))[0]
    assert msg.message.keys == ("key-t1",) and msg.message.properties["user"] == "x"
    assert node.store.lookup_key(T, "key-t1", 10)[0].queue_offset == 1
    # The same commit again: a success that adds nothing; a rollback now: a conflict.
    node.feed(encode_txn(TxnEnd("t1", Resolution.COMMIT, 1200)))
    out = node.feed(encode_txn(TxnEnd("t1", Resolution.ROLLBACK, 1200)))
    assert parse_end_detail(detail(out))[0].value == "conflict"
    assert node.bodies() == [b"p", b"one"]

    # t2: unanswered checks, then moved: never in the real topic, readable in the moved one.
    node.feed(encode_txn(TxnCheck("t2", 2000, "c1")))
    node.feed(encode_txn(TxnCheck("t2", 2500, None)))
    out = node.feed(encode_txn(TxnMoved("t2", 3000)))
    assert detail(out) == "moved"
    assert node.bodies() == [b"p", b"one"]
    assert node.bodies(MOVED_TOPIC, 1) == [b"two"]
    assert node.store.topic(MOVED_TOPIC) is not None
    out = node.feed(encode_txn(TxnEnd("t2", Resolution.COMMIT, 3100)))
    assert parse_end_detail(detail(out))[0].value == "conflict"
    node.close()


def test_the_table_survives_a_restart_and_a_replica_rebuilds_the_same(tmp_path: Path) -> None:
    entries: list[Entry] = []
    node = Node(tmp_path / "a", entries)
    node.feed(half("t1", b"one", 1000), half("t2", b"two", 1000), half("t3", b"three", 1000))
    node.feed(encode_txn(TxnEnd("t1", Resolution.COMMIT, 1100)))
    node.feed(encode_txn(TxnEnd("t3", Resolution.ROLLBACK, 1100)))
    node.feed(encode_txn(TxnCheck("t2", 2000, "c1")))
    before = {t: node.applier.book.get(t) for t in ("t1", "t2", "t3")}
    node.close()

    restarted = Node(tmp_path / "a", entries)  # the store's rows only: nothing re-applied
    assert restarted.catch_up() == []
    replica = Node(tmp_path / "b", entries)  # from the log alone
    replica.catch_up()
    for other in (restarted, replica):
        for t, txn in before.items():
            assert other.applier.book.get(t) == txn
        assert other.applier.book.due_checks(2499) == []
        assert [a.txn_id for a in other.applier.book.due_checks(2500)] == ["t2"]
    # Both continue alike: the next commit indexes t2 once on each.
    restarted.feed(encode_txn(TxnEnd("t2", Resolution.COMMIT, 2600)))
    replica.catch_up()
    assert restarted.bodies() == replica.bodies() == [b"one", b"two"]
    restarted.close()
    replica.close()


def test_ended_ids_are_forgotten_in_the_store_too(tmp_path: Path) -> None:
    node = Node(tmp_path / "a", [])
    node.feed(half("t1", b"one", 1000))
    node.feed(encode_txn(TxnEnd("t1", Resolution.ROLLBACK, 1100)))
    assert len(node.store.transaction_values()) == 1
    later = 1100 + SETTINGS.ended_retention_ms + 1
    node.feed(half("t2", b"two", later))
    assert node.applier.book.get("t1") is None
    assert len(node.store.transaction_values()) == 1  # t2 only
    node.close()


def test_a_half_without_its_properties_or_a_bad_record_is_rejected_everywhere(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path / "a", [])
    mark = ProducerSequence(HALF_PRODUCER_ID, 0)
    bad_half = encode(
        ProduceBatch(T, 0, 1, (Message(T, b"x", properties={PROP_TRAN_MSG: "true"}),), mark)
    )
    out = node.feed(bad_half, b"\x14\x01garbage", encode_txn(TxnEnd("nope", Resolution.COMMIT, 5)))
    assert isinstance(out.outcomes[0], Rejected)
    assert isinstance(out.outcomes[1], Rejected)
    assert parse_end_detail(detail(out, 2))[0].value == "not found"
    assert node.bodies(T, 0) == []
    node.close()


records = st.one_of(
    st.builds(
        TxnEnd,
        st.text(min_size=1, max_size=40),
        st.sampled_from(list(Resolution)),
        st.integers(0, 2**63),
        st.booleans(),
    ),
    st.builds(
        TxnCheck,
        st.text(min_size=1, max_size=40),
        st.integers(0, 2**63),
        st.one_of(st.none(), st.text(max_size=40)),
    ),
    st.builds(TxnMoved, st.text(min_size=1, max_size=40), st.integers(0, 2**63)),
)


@given(records)
def test_records_round_trip(record: TxnEnd | TxnCheck | TxnMoved) -> None:
    assert decode_txn(encode_txn(record)) == record


@given(records, st.data())
def test_truncated_or_extended_records_are_malformed(
    record: TxnEnd | TxnCheck | TxnMoved, data: st.DataObject
) -> None:
    raw = encode_txn(record)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(MalformedBatchError):
        decode_txn(raw[:cut])
    with pytest.raises(MalformedBatchError):
        decode_txn(raw + b"\x00")


def test_a_copy_of_a_committed_message_is_a_plain_message(tmp_path: Path) -> None:
    """A committed message keeps its TRAN_MSG properties (as in RocketMQ); a copy stored by another
    path (a retry's send-back, a dead letter resent) has no half mark and is visible at once."""
    node = Node(tmp_path / "a", [])
    node.feed(half("t1", b"one", 1000))
    node.feed(encode_txn(TxnEnd("t1", Resolution.COMMIT, 1100)))
    [stored] = node.reader.read(node.store.read_queue(T, 1, 0, 1))
    assert stored.message.properties[PROP_TRAN_MSG] == "true"
    copy = encode(ProduceBatch(T, 1, 1200, (stored.message,)))
    out = node.feed(copy)
    assert isinstance(out.outcomes[0], Appended) and out.outcomes[0].stored.first_offset == 1
    assert node.bodies() == [b"one", b"one"]
    node.close()


# ---- a property: any history, any restarts: the restored table equals the applied one ----------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("half"), st.integers(0, 4)),
        st.tuples(st.just("end"), st.integers(0, 4), st.sampled_from(list(Resolution))),
        st.tuples(st.just("check"), st.integers(0, 4), st.sampled_from([None, "c1", "c2"])),
        st.tuples(st.just("moved"), st.integers(0, 4)),
        st.tuples(st.just("clock"), st.integers(-300, 3000)),  # a new leader's clock may lag
        st.tuples(st.just("restart"), st.just(0)),
    ),
    max_size=40,
)
SHORT = TxnSettings(
    transaction_timeout_ms=1000, check_interval_ms=500, max_checks=2, ended_retention_ms=2000
)


def _table(a: TxnApplier) -> tuple[object, ...]:
    b = a.book
    return (
        dict(b._open),
        list(b._ended.items()),  # in the order they ended: forgetting follows it
        list(b._check_order),
        dict(a._places),
        dict(a._ended_at),
    )


@settings(max_examples=40, deadline=None)
@given(ops)
def test_any_history_restores_to_the_same_table_and_rows(history: list[tuple]) -> None:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        entries: list[Entry] = []
        live = Node(Path(tmp) / "live", entries, SHORT)
        restarted = Node(Path(tmp) / "restarted", entries, SHORT)
        now, sent = 10_000, 0
        bodies: dict[str, bytes] = {}
        visible: list[bytes] = []
        for op in history:
            kind = op[0]
            if kind == "clock":
                now = max(0, now + op[1])
                continue
            if kind == "restart":
                restarted.close()
                restarted = Node(Path(tmp) / "restarted", entries, SHORT)
                restarted.catch_up()
                continue
            txn_id = f"t{op[1]}"
            if kind == "half":
                sent += 1
                body = b"%s-%d" % (txn_id.encode(), sent)
                out = live.feed(half(txn_id, body, now))
                if isinstance(out.outcomes[0], Appended):
                    bodies[txn_id] = body
            elif kind == "end":
                out = live.feed(encode_txn(TxnEnd(txn_id, op[2], now)))
                if detail(out).startswith("visible"):
                    visible.append(bodies[txn_id])
            elif kind == "check":
                live.feed(encode_txn(TxnCheck(txn_id, now, op[2])))
            else:
                live.feed(encode_txn(TxnMoved(txn_id, now)))
        restarted.catch_up()
        assert _table(restarted.applier) == _table(live.applier)
        assert live.bodies() == restarted.bodies() == visible  # each commit once, in order
        live.close()
        restarted.close()
