"""A row of the index store that fails its checksum is reported (storage_error names the table)
and the store rebuilt from the log without stopping dispatch (broker/index_repair.py), whether a
reader or the dispatcher itself found it; the report clears only once the rebuild caught up. A
pull's answer is cross-checked against the request before it leaves (broker/pull.py)."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.broker.dispatcher_thread import DispatcherSettings, DispatcherThread
from raftmq.broker.errors import CorruptRowError, StoreError
from raftmq.broker.index_repair import SCRUB_PASS_GAP_S, IndexRepair, scrub_rest_s
from raftmq.broker.pull import check_served
from raftmq.broker.store import MessageReader, MessageStore, RawPart
from raftmq.raftlog.storage_health import StorageHealth

from .support import InProcessLog, commit, produce

FAST = DispatcherSettings(max_batch_entries=4, max_batch_bytes=1 << 20, poll_timeout_ms=10)


class Group:
    """One node's store, dispatcher and repair over an in-process committed log."""

    def __init__(self, path: Path, scrub_rows_per_s: int = 0) -> None:
        self.log = InProcessLog()
        self.store = MessageStore(path, map_size_bytes=64 << 20)
        self.health = StorageHealth("n1")
        self.dispatcher = DispatcherThread(self.log, self.store, settings=FAST, health=self.health)
        self.repair = IndexRepair(
            "n1", self.store, self.dispatcher, None, self.health, scrub_rows_per_s=scrub_rows_per_s
        )
        self.dispatcher.start()
        self.repair.start()

    def close(self) -> None:
        self.repair.close()
        self.dispatcher.stop()
        self.store.close()

    def overwrite(self, table: str, key_suffix: bytes, change: bytes) -> None:
        """Write `change` over the start of the stored value (checksum left as it was) of the
        row of `table` whose key ends in key_suffix: a byte flipped on disk."""
        raw = self.store._env.raw  # the store's own environment: lmdb allows one per process
        db = raw.open_db(table.encode())
        with raw.begin(write=True) as txn:
            key = next(k for k, _ in txn.cursor(db=db) if k.endswith(key_suffix))
            value = txn.get(key, db=db)
            txn.put(key, change + value[len(change) :], db=db)

    def wait_repaired(self, rebuilds: int, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.repair.rebuilds < rebuilds or self.health.error is not None:
            assert time.monotonic() < deadline, f"not rebuilt: {self.health.error}"
            time.sleep(0.02)


@pytest.fixture(params=[0], ids=["no scrub"])
def group(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Group]:
    g = Group(tmp_path / "store", request.param)
    for i in range(3):
        g.log.append([produce("T", 0, 2, body=b"m%d-" % i)])
    g.log.append([commit("g", "T", 0, 3)])
    assert g.dispatcher.wait_dispatched(4, 10)
    yield g
    g.close()


def test_a_row_a_reader_finds_bad_is_reported_then_rebuilt_from_the_log(group: Group) -> None:
    # Offsets 2-3 (the batch at raft index 2) made to point at raft index 1: well-formed.
    group.overwrite("consume_queue", struct.pack(">Q", 2), struct.pack(">Q", 1))
    with pytest.raises(CorruptRowError):
        group.store.read_queue("T", 0, 2, 2)
    err = group.health.error
    assert err is not None and err.corrupt and "consume_queue" in err.path
    group.wait_repaired(1)
    rows = group.store.read_queue("T", 0, 0, 10)
    assert [(r.queue_offset, r.raft_index) for r in rows] == [
        (0, 1), (1, 1), (2, 2), (3, 2), (4, 3), (5, 3),
    ]  # fmt: skip
    bodies = [m.message.body for m in MessageReader("b", group.log.read).read(rows)]
    assert bodies == [b"m0-\x00", b"m0-\x01", b"m1-\x00", b"m1-\x01", b"m2-\x00", b"m2-\x01"]
    assert group.store.committed_offset("g", "T", 0) == 3
    group.log.append([produce("T", 0, 1)])  # dispatch goes on after the rebuild
    assert group.dispatcher.wait_dispatched(5, 10)
    assert group.store.queue_bounds("T", 0) == (0, 7)


def test_a_row_the_dispatcher_finds_bad_does_not_stop_dispatch(group: Group) -> None:
    group.overwrite("queues", b"T\0\0\0\0\0", b"\xff")  # the queue's head, read by dispatch
    group.log.append([produce("T", 0, 1)])
    group.wait_repaired(1)
    assert group.dispatcher.wait_dispatched(5, 10)
    assert group.dispatcher.failure is None
    assert group.store.queue_bounds("T", 0) == (0, 7)


@pytest.mark.parametrize("group", [0, 1_000], ids=["no scrub", "scrub"], indirect=True)
def test_a_bad_row_nobody_reads_is_found_by_the_scrub(group: Group) -> None:
    """The time index's row is read by no pull; only the scrub finds it (without the scrub,
    shown by the "no scrub" case, the report never comes)."""
    group.overwrite("time_index", struct.pack(">Q", 1_000), b"\x01")
    deadline = time.monotonic() + 1.0
    while group.health.error is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if group.repair._scrub_rows_per_tick == 0:
        assert group.health.error is None and group.repair.scrubbed_rows == 0
        return
    group.wait_repaired(1)
    assert group.store.offset_for_timestamp("T", 0, 1_000) == 0
    deadline = time.monotonic() + 5.0
    while group.repair.scrub_passes == 0:  # then whole passes over the rebuilt store
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert group.repair.scrubbed_rows > 0 and group.health.error is None


def _part(first: int, positions: list[int]) -> RawPart:
    return RawPart(1, 0, first, 0, b"", positions, [0] * len(positions))


def test_an_answer_is_checked_against_the_request() -> None:
    check_served("T", 0, 5, 9, [], [_part(4, [1, 2]), _part(7, [0, 1])])  # offsets 5, 6, 7, 8
    for parts in (
        [_part(0, [4])],  # below the offset asked for
        [_part(4, [2, 1])],  # out of order
        [_part(3, [2, 3, 5, 4])],  # out of order inside a longer part
        [_part(4, [1, 2]), _part(5, [1, 2])],  # a part overlapping the one before
        [_part(5, [0]), _part(5, [0])],  # the same offset twice
        [_part(8, [1])],  # at or past the next offset it claims
    ):
        with pytest.raises(StoreError):
            check_served("T", 0, 5, 9, [], parts)


def test_a_rebuild_after_a_retention_cut_starts_from_its_base(tmp_path: Path) -> None:
    """With a cut in force the log before it is gone (on a real node): the rebuild installs
    the base the cut stands on and dispatches only what follows; every read is as before."""
    from raftmq.broker.retention import Reason, RetentionRecord, encode_record

    g = Group(tmp_path / "store")
    try:
        for k in range(4):
            g.log.append([produce("T", 0, 3, ts_ms=1_000 + k), commit("g", "T", 0, 3 * k)])
        mark = g.log.append([encode_record(RetentionRecord(0, Reason.MARK, 7))]).index
        g.log.append([produce("T", 0, 2, ts_ms=2_000)])
        cut = g.log.append([encode_record(RetentionRecord(mark + 1, Reason.TIME, 7))]).index
        g.log.append([produce("T", 0, 1, ts_ms=3_000)])
        assert g.dispatcher.wait_dispatched(cut + 1, 10)
        assert g.store.cut_index == mark + 1
        reads = (
            lambda: g.store.queue_bounds("T", 0),
            lambda: g.store.read_queue("T", 0, 12, 100),  # (rows below: not trimmed yet)
            lambda: g.store.committed_offset("g", "T", 0),
            g.store.base_indexes,
        )
        before = [r() for r in reads]
        assert before[0] == (12, 15)  # the cut moved the min offset past the base's batches
        g.overwrite("consume_queue", struct.pack(">Q", 12), struct.pack(">Q", 1))
        with pytest.raises(CorruptRowError):
            g.store.read_queue("T", 0, 12, 1)
        g.wait_repaired(1)
        assert [r() for r in reads] == before
    finally:
        g.close()


def test_a_bad_base_cannot_be_rebuilt_on_and_stays_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The base the cut stands on is itself bad: nothing is rebuilt (nothing changes), the
    report stays, pulls stay refused, one line says what to do, and close() does not wait."""
    from raftmq.broker.retention import Reason, RetentionRecord, encode_record

    g = Group(tmp_path / "store")
    try:
        for k in range(3):
            g.log.append([produce("T", 0, 3, ts_ms=1_000 + k)])
        mark = g.log.append([encode_record(RetentionRecord(0, Reason.MARK, 7))]).index
        g.log.append([produce("T", 0, 2, ts_ms=2_000)])
        cut = g.log.append([encode_record(RetentionRecord(mark + 1, Reason.TIME, 7))]).index
        assert g.dispatcher.wait_dispatched(cut, 10) and g.store.cut_index == mark + 1
        g.overwrite("retention_bases", struct.pack(">Q", mark), b"XXXX")
        g.overwrite("consume_queue", struct.pack(">Q", 9), struct.pack(">Q", 1))
        with pytest.raises(CorruptRowError):
            g.store.read_queue("T", 0, 9, 1)
        deadline = time.monotonic() + 10
        while "broker.index_rebuild_failed" not in caplog.text:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert "retention_bases" in caplog.text and "delete its store directory" in caplog.text
        assert g.repair.rebuilds == 0 and g.repair.rebuilding
        assert g.health.error is not None and g.health.error.corrupt
        assert g.store.queue_bounds("T", 0) == (9, 11)  # nothing was emptied
    finally:
        started = time.monotonic()
        g.close()
        assert time.monotonic() - started < 5  # not the 30 s wait before the next try


def test_a_long_scrub_pass_rests_four_times_its_length() -> None:
    """The index scrub's CPU per second is bounded on a large store too (issue 24's profile: at
    20 000 rows/s back to back it cost ~8 % of a core per node): a pass rests four times its own
    length, and at least the fixed gap, which is all a small store (chaos') ever gets."""
    assert scrub_rest_s(0.0) == SCRUB_PASS_GAP_S
    assert scrub_rest_s(SCRUB_PASS_GAP_S / 4) == SCRUB_PASS_GAP_S
    assert scrub_rest_s(50.0) == 200.0  # 10^6 rows at 20 000 rows/s: reads 20 % of the time
    for pass_s in (0.1, 1.0, 2.0, 10.0, 100.0):
        busy = pass_s / (pass_s + scrub_rest_s(pass_s))
        assert busy <= 0.2 + 1e-9
