"""The ConsumeQueue kept as one row per batch (broker/cq_rows.py, issue 14): every read the
per-message rows served (a scan from any offset, inside a batch or not, with a tag filter and a
scan limit; the row a message id names) gives what a row per message gave, also next to other
queues' rows, around delivered delayed messages (one-message rows at any position) and after
retention trimmed whole batches below a min offset that cuts through one."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.broker import cq_rows, retention_store
from raftmq.broker.dispatch import DispatchOutput
from raftmq.broker.rows import CQBatch, CQRow, QueueHead
from raftmq.broker.store import MessageStore

TOPIC = "T"
TAGS = (11, 22, 33)

# A queue's layout: per row, (count, loose position or None for a produce batch, tag choice).
rows_strategy = st.lists(
    st.tuples(st.integers(1, 6), st.none() | st.integers(0, 9), st.integers(0, 2)),
    min_size=1,
    max_size=12,
)


LOOSE_SLOT = 5  # delivered delayed messages' rows: their own slot, never a batch's


def _build(
    store: MessageStore, layout: list[tuple[int, int | None, int]]
) -> tuple[list[CQRow], list[int]]:
    """Write the layout to queue 0 (queue 1 and topic "S" get rows around it too). Returns the
    per-message rows a row per message would hold, in offset order, and where each row starts."""
    expected: list[CQRow] = []
    starts: list[int] = []
    offset = 0
    for i, (count, loose, tag_pick) in enumerate(layout):
        index = i + 1
        ts = 1000 + i
        tags = tuple(TAGS[(tag_pick + k) % 3] for k in range(count))
        starts.append(offset)
        if loose is not None:  # a delivered delayed message: one row at its own position
            row = CQRow(TOPIC, 0, offset, index, LOOSE_SLOT, loose, 40, 7, tags[0], ts)
            heads = (QueueHead(TOPIC, 0, offset + 1, ts),)
            out = DispatchOutput(index, 1, loose_rows=(row,), queue_heads=heads)
            expected.append(row)
            offset += 1
        else:
            at = tuple(30 + 50 * k for k in range(count))
            sizes = tuple(10 + k for k in range(count))
            batches = (
                CQBatch(TOPIC, 0, offset, index, 0, ts, at, sizes, tags),
                CQBatch(TOPIC, 1, 3 * i, index, 1, ts, at[:1], sizes[:1], tags[:1]),
                CQBatch("S", 0, 3 * i, index, 2, ts, at, sizes, tags),
            )
            heads = (QueueHead(TOPIC, 0, offset + count, ts),)
            out = DispatchOutput(index, 1, cq_batches=batches, queue_heads=heads)
            expected.extend(batches[0].rows())
            offset += count
        store.apply(out)
    return expected, starts


@given(rows_strategy, st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_batch_rows_read_as_rows_per_message(
    layout: list[tuple[int, int | None, int]], data: st.DataObject
) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        MessageStore(Path(tmp), map_size_bytes=32 << 20) as s,
    ):
        expected, _ = _build(s, layout)
        end = len(expected)
        for start in range(end + 2):
            max_count = data.draw(st.integers(1, end + 1), label="max_count")
            scan_limit = data.draw(st.integers(1, end + 1), label="max_scan_rows")
            wanted = data.draw(st.none() | st.sets(st.sampled_from(TAGS)), label="tags")
            got = s.scan_queue(TOPIC, 0, start, max_count, wanted, max_scan_rows=scan_limit)
            model, nxt, scanned = [], start, 0
            for row in expected[start:]:
                nxt, scanned = row.queue_offset + 1, scanned + 1
                if wanted is None or row.tag_hash in wanted:
                    model.append(row)
                    if len(model) >= max_count:
                        break
                if scanned >= scan_limit:
                    break
            assert (got.rows, got.next_offset) == (model, nxt)
            # runs, each of one batch's messages in position order, none empty
            assert all(r.positions == sorted(set(r.positions)) != [] for r in got.runs)
        for row in expected:  # what a message id names
            assert s.cq_row_at(row.raft_index, row.slot, row.position) == row
        assert s.cq_row_at(len(layout) + 5, 0, 0) is None
        last = expected[-1]
        if last.slot == 0:  # one position past the end of a batch names nothing
            assert s.cq_row_at(last.raft_index, 0, last.position + 1) is None


@given(rows_strategy, st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_trim_keeps_the_batch_that_straddles_the_min_offset(
    layout: list[tuple[int, int | None, int]], data: st.DataObject
) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        MessageStore(Path(tmp), map_size_bytes=32 << 20) as s,
    ):
        expected, starts = _build(s, layout)
        low = data.draw(st.integers(0, len(expected)), label="min offset")
        with s._env.begin(write=True) as txn:
            removed = retention_store._delete_prefix_rows(
                txn, s._cq, b"T\0\0\0\0\0", low, 10_000, by_value=False
            )
        # Rows wholly below `low` went; the one holding `low` stays whole.
        ends = [*starts[1:], len(expected)]
        assert removed == sum(1 for end in ends if end <= low)
        first_kept = min(
            (st_ for st_, end in zip(starts, ends, strict=True) if end > low), default=low
        )
        assert s.read_queue(TOPIC, 0, 0, 10_000) == expected[first_kept:]
        assert s.read_queue(TOPIC, 0, low, 10_000) == expected[low:]
        n_batches = sum(1 for _, loose, _ in layout if loose is None)
        assert len(s.read_queue(TOPIC, 1, 0, 10_000)) == n_batches  # other queues untouched


def test_a_row_holds_its_columns() -> None:
    value = cq_rows.pack(7, 2, 0, 99, (1, 2), (3, 4), (5, 6))
    assert cq_rows.count(value) == 2
    assert cq_rows.unpack(value) == (7, 2, 0, 99, 2, (1, 2, 3, 4, 5, 6))


@given(st.integers(1, 40), st.data())
def test_a_slice_of_the_columns_equals_the_whole_rows_slice(n: int, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, n - 1))
    stop = data.draw(st.integers(start + 1, n))
    ats, sizes, tags = (
        tuple(range(n)),
        tuple(range(100, 100 + n)),
        tuple(range(1 << 40, (1 << 40) + n)),
    )
    value = cq_rows.pack(1, 2, 3, 4, ats, sizes, tags)
    assert cq_rows.head(value) == (1, 2, 3, 4, n)
    assert cq_rows.columns(value, n, start, stop) == (
        ats[start:stop],
        sizes[start:stop],
        tags[start:stop],
    )


def _column(draw: st.DrawFn, n: int, bits: int) -> tuple[int, ...]:
    """A column of n values: evenly stepped (often, as a producer's batch is) or not."""
    top = (1 << bits) - 1
    if draw(st.booleans()):
        first = draw(st.integers(0, top))
        step = draw(st.sampled_from((0, 1, 7, -3, 1 << 20)))
        values = tuple(first + step * i for i in range(n))
        if all(0 <= v <= top for v in values):
            return values
    return tuple(draw(st.lists(st.integers(0, top), min_size=n, max_size=n)))


@st.composite
def rows(draw: st.DrawFn) -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    n = draw(st.integers(1, 50))
    return n, _column(draw, n, 32), _column(draw, n, 32), _column(draw, n, 64)


@given(rows(), st.data())
def test_even_and_uneven_columns_read_back_as_written(
    row: tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...]], data: st.DataObject
) -> None:
    n, ats, sizes, tags = row
    value = cq_rows.pack(9, 1, 0, 5, ats, sizes, tags)
    assert cq_rows.count(value) == n
    assert cq_rows.head(value) == (9, 1, 0, 5, n)
    assert cq_rows.unpack(value) == (9, 1, 0, 5, n, ats + sizes + tags)
    start = data.draw(st.integers(0, n - 1))
    stop = data.draw(st.integers(start + 1, n))
    assert cq_rows.columns(value, n, start, stop) == (
        ats[start:stop],
        sizes[start:stop],
        tags[start:stop],
    )


def test_a_batch_of_equal_messages_costs_its_row_head_not_16_bytes_a_message() -> None:
    """Issue 14 bar 3 (disk per node under 1.3x the raw bytes for 10^8 x 100 B): the index of a
    batch of equal-sized records with one tag is a few dozen bytes, whatever its count."""
    n = 1024
    value = cq_rows.pack(1, 0, 0, 7, tuple(range(30, 30 + 126 * n, 126)), (100,) * n, (0,) * n)
    assert len(value) <= cq_rows.HEAD.size + 24
    assert cq_rows.columns(value, n, 1000, 1003) == ((126030, 126156, 126282), (100,) * 3, (0,) * 3)
    # Uneven columns keep every value.
    sizes = tuple(100 + i % 3 for i in range(n))
    assert len(cq_rows.pack(1, 0, 0, 7, sizes, sizes, (0,) * n)) > 8 * n


def test_a_row_written_before_even_columns_reads_as_it_did() -> None:
    """Rows of stores written by earlier builds have no flags: every column in full."""
    n = 3
    old = cq_rows.HEAD.pack(4, 1, 0, 8, n) + struct.pack(">3I3I3Q", 1, 5, 9, 2, 2, 2, 7, 7, 7)
    assert cq_rows.unpack(old) == (4, 1, 0, 8, n, (1, 5, 9, 2, 2, 2, 7, 7, 7))
    assert cq_rows.columns(old, n, 1, 3) == ((5, 9), (2, 2), (7, 7))


def test_the_index_of_a_backlog_of_equal_messages_stays_under_a_byte_a_message() -> None:
    """Issue 14 bar 3 at the store: 10^6 messages of 100 B in batches of 1024 over 8 queues (as
    bench/backlog_bench.py writes them) take lmdb pages for their rows and batch locators, not
    16 bytes a message (1.6 MB here; the journal holds ~126 B a message)."""
    per_batch, queues, entries = 1024, 8, 123  # ~10^6 messages
    at = tuple(range(40, 40 + 126 * per_batch, 126))
    with (
        tempfile.TemporaryDirectory() as tmp,
        MessageStore(Path(tmp), map_size_bytes=256 << 20) as s,
    ):
        empty = s.size_bytes()
        for i in range(entries):
            batches = tuple(
                CQBatch(
                    TOPIC,
                    q,
                    i * per_batch,
                    i + 1,
                    q,
                    1000 + i,
                    at,
                    (100,) * per_batch,
                    (0,) * per_batch,
                )
                for q in range(queues)
            )
            heads = tuple(QueueHead(TOPIC, q, (i + 1) * per_batch, 1000 + i) for q in range(queues))
            s.apply(DispatchOutput(i + 1, 1, cq_batches=batches, queue_heads=heads))
        messages = per_batch * queues * entries
        assert (s.size_bytes() - empty) / messages < 1.0
        rows = s.read_queue(TOPIC, 3, 5 * per_batch + 1000, 32)
        assert [r.queue_offset for r in rows] == list(
            range(5 * per_batch + 1000, 5 * per_batch + 1032)
        )
        assert {(r.body_bytes, r.tag_hash) for r in rows} == {(100, 0)}
        assert rows[0].chunk_offset_bytes == 40 + 126 * 1000


def test_a_format_2_store_is_read_and_marked_4_an_unknown_one_refused(tmp_path: Path) -> None:
    """Rows of a format-2 store read as they are (no flags) once sealed in place; the store then
    says format 4, which an older build refuses instead of taking the flags for a count or the
    checksums for columns."""
    import lmdb

    from raftmq.broker.errors import StoreError
    from tests.broker.test_checked_rows import as_written_by_format

    with MessageStore(tmp_path, map_size_bytes=32 << 20) as s:
        s.apply(
            DispatchOutput(
                1, 1, cq_batches=(CQBatch(TOPIC, 0, 0, 1, 0, 5, (9, 19), (4, 4), (7, 8)),)
            )
        )
    as_written_by_format(tmp_path, b"2")
    with MessageStore(tmp_path, map_size_bytes=32 << 20) as s:
        assert [(r.chunk_offset_bytes, r.tag_hash) for r in s.read_queue(TOPIC, 0, 0, 10)] == [
            (9, 7),
            (19, 8),
        ]
    env = lmdb.open(str(tmp_path), max_dbs=64, subdir=True)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn, create=False)
        assert txn.get(b"format", db=meta) == b"4"
        txn.put(b"format", b"1", db=meta)
    env.close()
    with pytest.raises(StoreError, match="has format"):
        MessageStore(tmp_path, map_size_bytes=32 << 20)


@given(
    st.integers(0, (1 << 64) - 1),
    st.integers(0, (1 << 32) - 1),
    st.integers(0, (1 << 32) - 1),
    st.integers(0, (1 << 64) - 1),
    st.integers(0, (1 << 32) - 1),
    st.integers(0, (1 << 32) - 1),
    st.integers(0, (1 << 64) - 1),
)
def test_a_one_message_row_is_the_general_rows_bytes(
    index: int, slot: int, position: int, ts: int, at: int, size: int, tag: int
) -> None:
    """pack() writes a one-message row (W2's every batch) with one struct call: the same bytes
    as the general path, every column even."""
    value = cq_rows.pack(index, slot, position, ts, (at,), (size,), (tag,))
    assert value == cq_rows._pack_columns(index, slot, position, ts, (at,), (size,), (tag,))
    assert cq_rows.unpack(value) == (index, slot, position, ts, 1, (at, size, tag))
