"""Every lmdb value the store writes is sealed with a checksum over its table, key and value
(broker/checked_tables.py), checked on read (issue 25): a flipped byte anywhere, and a
well-formed wrong row (a ConsumeQueue row pointing at another batch of its queue), is a
CorruptRowError that names the table and key and is reported, never a row. Stores of format 2
and 3 are sealed in place, resuming after a crash."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.broker import checked_tables
from raftmq.broker import store as store_mod
from raftmq.broker.checked_tables import SEAL_BYTES, CheckedEnv, Table, seal
from raftmq.broker.dispatch import Dispatcher
from raftmq.broker.errors import CorruptRowError
from raftmq.broker.store import MessageReader, MessageStore
from raftmq.common.record_batch import TopicConfigChange, TopicOp, encode
from raftmq.common.topic_config import TopicConfig

from .support import InProcessLog, commit, produce

TABLES = (
    "consume_queue", "queues", "key_index", "time_index", "consumer_offsets", "producers",
    "topics", "batches", "meta", "queue_locks", "pop_state", "transactions", "schedule",
    "old_refs", "schedule_refs", "half_refs", "retention_bases",
)  # fmt: skip
UNSEALED_META = (b"format", b"sealing")


def _raw_rows(path: Path) -> dict[str, list[tuple[bytes, bytes]]]:
    env = lmdb.open(str(path), max_dbs=64, subdir=True, readonly=True)
    out: dict[str, list[tuple[bytes, bytes]]] = {}
    with env.begin() as txn:
        for name in TABLES:
            db = env.open_db(name.encode(), txn=txn, create=False)
            out[name] = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)]
    env.close()
    return out


def _put_raw(
    path: Path, table: str, key: bytes, value: bytes, old_key: bytes | None = None
) -> None:
    env = lmdb.open(str(path), max_dbs=64, subdir=True)
    with env.begin(write=True) as txn:
        db = env.open_db(table.encode(), txn=txn, create=False)
        if old_key is not None:
            txn.delete(old_key, db=db)
        txn.put(key, value, db=db)
    env.close()


def as_written_by_format(path: Path, fmt: bytes) -> None:
    """Make a (closed) store what an older build wrote: every value without its seal."""
    env = lmdb.open(str(path), max_dbs=64, subdir=True)
    with env.begin(write=True) as txn:
        for name in TABLES:
            db = env.open_db(name.encode(), txn=txn, create=False)
            for k, v in list(txn.cursor(db=db)):
                if not (name == "meta" and k in UNSEALED_META):
                    txn.put(k, v[:-SEAL_BYTES], db=db)
        txn.put(b"format", fmt, db=env.open_db(b"meta", txn=txn, create=False))
    env.close()


class Node:
    """A store fed from an in-process log (a real lmdb file, the real dispatcher)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.log = InProcessLog()
        self.dispatcher = Dispatcher()
        self.reports: list[CorruptRowError] = []
        self.store = self._open()

    def _open(self) -> MessageStore:
        s = MessageStore(self.path, map_size_bytes=64 << 20)
        s.report_corrupt_to(self.reports.append)
        return s

    def entry(self, *chunks: bytes) -> None:
        e = self.log.append(chunks)
        self.store.apply(self.dispatcher.apply(e, self.store))

    def reopen(self) -> None:
        self.store.close()
        self.store = self._open()

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "store")
    n.entry(produce("T", 0, 3, keys=["k1"], producer=("p1", 0)))  # batch at index 1
    n.entry(produce("T", 0, 2, keys=["k2"], ts_ms=2_000))  # batch at index 2: offsets 3, 4
    n.entry(commit("g", "T", 0, 2), encode(TopicConfigChange(TopicOp.CREATE, TopicConfig("U"))))
    yield n
    n.close()


def test_every_value_of_every_table_is_sealed_over_its_table_and_key(node: Node) -> None:
    node.close()
    rows = _raw_rows(node.path)
    for name in ("consume_queue", "queues", "key_index", "time_index", "consumer_offsets",
                 "producers", "topics", "batches", "meta"):  # fmt: skip
        assert rows[name], f"the workload writes {name}"
    for name, table_rows in rows.items():
        table = Table(name, None, checked_tables.crc32c.crc32c(name.encode() + b"\0"))
        for k, v in table_rows:
            if name == "meta" and k in UNSEALED_META:
                continue
            assert seal(table, k, v[:-SEAL_BYTES]) == v, (name, k)


def test_a_row_pointing_at_another_batch_of_its_queue_is_caught_not_served(node: Node) -> None:
    """The issue's silent wrong data: the row of offsets 3-4 (batch at raft index 2) rewritten
    well-formed to point at raft index 1, another batch of the same queue, with positions that
    exist there. Without the checksum the reader serves batch 1's messages as offsets 3-4."""
    messages = MessageReader("b", node.log.read)
    assert [m.message.body for m in messages.read(node.store.read_queue("T", 0, 3, 2))] == [
        b"hello\x00",
        b"hello\x01",
    ]
    node.close()
    key, value = next((k, v) for k, v in _raw_rows(node.path)["consume_queue"] if k.endswith(
        struct.pack(">Q", 3)))  # fmt: skip
    assert struct.unpack_from(">Q", value)[0] == 2
    _put_raw(node.path, "consume_queue", key, struct.pack(">Q", 1) + value[8:])
    node.reopen()
    with pytest.raises(CorruptRowError) as caught:
        node.store.read_queue("T", 0, 3, 2)
    assert caught.value.table == "consume_queue"
    assert "T" in caught.value.key and caught.value.path == str(node.path)
    assert node.reports == [caught.value]  # reported before the reader saw the error
    assert [r.queue_offset for r in node.store.read_queue("T", 0, 0, 3)] == [0, 1, 2]


def test_a_row_moved_to_another_key_is_caught(node: Node) -> None:
    """A flipped byte in a key: the row of offset 0 now sits at offset 8 (its value intact)."""
    node.close()
    key, value = _raw_rows(node.path)["consume_queue"][0]
    moved = key[:-8] + struct.pack(">Q", 8)
    _put_raw(node.path, "consume_queue", moved, value, old_key=key)
    node.reopen()
    with pytest.raises(CorruptRowError, match="consume_queue"):
        node.store.read_queue("T", 0, 5, 10)


@pytest.mark.parametrize(
    ("table", "read"),
    [
        ("consumer_offsets", lambda s: s.committed_offset("g", "T", 0)),
        ("queues", lambda s: s.queue_bounds("T", 0)),
        ("key_index", lambda s: s.lookup_key("T", "k2", 10)),
        ("time_index", lambda s: s.offset_for_timestamp("T", 0, 1_500)),
        ("producers", lambda s: s.producer_state("p1", "T", 0)),
        ("batches", lambda s: s.cq_row_at(2, 0, 1)),
        # The store reads these when it opens (the dispatched index, the topics' cache).
        ("meta", None),
        ("topics", None),
    ],
)
def test_a_flipped_byte_in_any_table_is_a_typed_error_naming_it(
    node: Node, table: str, read: object
) -> None:
    node.close()
    rows = _raw_rows(node.path)[table]
    for key, value in rows:  # every row of the table: whichever the read touches is bad
        if table == "meta" and key in UNSEALED_META:
            continue
        flipped = bytes([value[0] ^ 0x10]) + value[1:]
        _put_raw(node.path, table, key, flipped)
    with pytest.raises(CorruptRowError) as caught:
        node.reopen()
        if read is not None:  # else the reopen itself must refuse the row
            read(node.store)
    assert caught.value.table == table
    if read is not None:  # (a store that cannot open has no listener yet)
        assert node.reports and node.reports[0].table == table


@given(
    st.sampled_from(TABLES),
    st.binary(min_size=1, max_size=64),
    st.binary(max_size=64),
    st.data(),
)
def test_any_one_byte_changed_in_a_key_or_stored_value_fails_the_check(
    name: str, key: bytes, value: bytes, data: st.DataObject
) -> None:
    table = Table(name, None, checked_tables.crc32c.crc32c(name.encode() + b"\0"))
    env = CheckedEnv(None, "store")
    stored = seal(table, key, value)
    assert env.unseal(table, key, stored) == value
    in_key = data.draw(st.booleans(), label="in key")
    target = key if in_key else stored
    at = data.draw(st.integers(0, len(target) - 1), label="at")
    delta = data.draw(st.integers(1, 255), label="xor")
    bad = target[:at] + bytes([target[at] ^ delta]) + target[at + 1 :]
    with pytest.raises(CorruptRowError):
        env.unseal(table, bad, stored) if in_key else env.unseal(table, key, bad)
    other = data.draw(st.sampled_from(TABLES), label="other table")
    if other != name:  # the same row in another table fails there
        with pytest.raises(CorruptRowError):
            env.unseal(Table(other, None, checked_tables.crc32c.crc32c(other.encode() + b"\0")),
                       key, stored)  # fmt: skip


def test_a_format_3_store_is_sealed_in_place_and_a_cut_short_sealing_resumes(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    node.close()
    before = _raw_rows(node.path)
    as_written_by_format(node.path, b"3")
    # The sealing dies after its first transaction (two rows a transaction here).
    monkeypatch.setattr(store_mod, "SEAL_ROWS_PER_TXN", 2)
    sealed = 0
    real_seal = store_mod.seal

    def dying_seal(table: Table, key: bytes, value: bytes) -> bytes:
        nonlocal sealed
        sealed += 1
        if sealed > 2:
            raise OSError("the power went")
        return real_seal(table, key, value)

    monkeypatch.setattr(store_mod, "seal", dying_seal)
    with pytest.raises(OSError, match="power"):
        MessageStore(node.path, map_size_bytes=64 << 20)
    env = lmdb.open(str(node.path), max_dbs=64, subdir=True, readonly=True)
    with env.begin() as txn:
        meta = env.open_db(b"meta", txn=txn, create=False)
        # Half sealed: no build but this one may read it.
        assert txn.get(b"format", db=meta) == b"4-sealing"
        assert txn.get(b"sealing", db=meta) is not None
    env.close()
    monkeypatch.setattr(store_mod, "seal", real_seal)
    node.reopen()
    assert node.store.queue_bounds("T", 0) == (0, 5)
    assert node.store.committed_offset("g", "T", 0) == 2
    node.close()
    after = _raw_rows(node.path)
    assert {k: v for k, v in after.items() if k != "meta"} == {
        k: v for k, v in before.items() if k != "meta"
    }  # every row sealed once, exactly as this build writes it
    assert dict(after["meta"])[b"format"] == b"4" and b"sealing" not in dict(after["meta"])


@given(
    st.sampled_from(TABLES),
    st.binary(min_size=1, max_size=64),
    st.binary(max_size=64),
    st.integers(0, 127),
)
def test_a_transaction_seals_and_checks_as_seal_and_unseal_do(
    tmp_path_factory: pytest.TempPathFactory, name: str, key: bytes, value: bytes, at: int
) -> None:
    """CheckedTxn.put and .get compute the checksum inline (the dispatcher's every row): the
    bytes stored are seal()'s, and a changed byte read back is reported and raised."""
    path = tmp_path_factory.mktemp("txn")
    raw = lmdb.open(str(path), max_dbs=4, map_size=1 << 20)
    env = CheckedEnv(raw, str(path))
    heard: list[CorruptRowError] = []
    env.on_corrupt = heard.append
    table = Table.open(raw, name)
    with env.begin(write=True) as txn:
        txn.put(key, value, db=table)
        assert txn.raw.get(key, db=table.handle) == seal(table, key, value)
        assert txn.get(key, db=table) == value
        stored = bytearray(seal(table, key, value))
        stored[at % len(stored)] ^= 0x40
        txn.raw.put(key, bytes(stored), db=table.handle)
        with pytest.raises(CorruptRowError):
            txn.get(key, db=table)
        txn.raw.put(key, b"\0" * (at % SEAL_BYTES), db=table.handle)  # shorter than a seal
        with pytest.raises(CorruptRowError):
            txn.get(key, db=table)
    assert len(heard) == 2 and heard[0].table == name
    raw.close()
