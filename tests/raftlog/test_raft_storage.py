"""The native core over a real segment journal: what a Ready writes is what the core reads back,
an overwrite replaces the tail, a snapshot restarts the log, and a core rebuilt from the files
after a restart sees the same log (its memory holds only the not-yet-durable tail)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.raftlog.journal import SegmentJournal
from raftmq.raftlog.meta import MetaStore
from raftmq.raftlog.raft_core import RaftConfig, RaftCore, RaftLog
from raftmq.raftlog.raft_messages import Entry, HardState
from raftmq.raftlog.raft_storage import JournalStorage
from raftmq.raftlog.snapshot import Snapshot
from tests.raftlog.raft_sim import Disk


def open_storage(d: Path) -> JournalStorage:
    return JournalStorage(SegmentJournal(d / "journal", segment_bytes=1 << 16), MetaStore(d / "m"))


def test_writes_overwrite_and_install_read_back(tmp_path: Path) -> None:
    st = open_storage(tmp_path)
    st.write([Entry(b"a", 1, 1), Entry(b"b", 2, 1), Entry(b"c", 3, 1)])
    st.write([Entry(b"B", 2, 2)])  # a conflict from 2 on: 3 goes too
    assert st.last_index == 2 and st.term(2) == 2
    assert st.slice(1, 3) == [Entry(b"a", 1, 1), Entry(b"B", 2, 2)]
    st.install(Snapshot(10, 3, b"state"))
    assert st.last_index == 10 and st.base() == (10, 3)
    st.write([Entry(b"k", 11, 3)])
    st.store_hard_state(HardState(3, "x", 11))
    st.journal.close()
    again = open_storage(tmp_path)
    assert again.base() == (10, 3) and again.slice(11, 12) == [Entry(b"k", 11, 3)]
    assert again.load_hard_state() == HardState(3, "x", 11)
    core = RaftCore(
        "x",
        ("x", "y", "z"),
        RaftConfig(),
        seed=1,
        hard_state=again.load_hard_state(),
        storage=again,
        base=again.base(),
    )
    assert core.log.last_position.last_index == 11 and core.log.term_at(10) == 3


# A RaftLog over a storage must read like the in-memory one under any appends (conflicting ones
# included) and any persist/stable_to interleaving; its tail must hold only unpersisted entries.
ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 6), st.integers(1, 4)),
        st.tuples(st.just("persist"), st.just(0), st.just(0)),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_the_storage_split_reads_like_the_whole_log_in_memory(
    script: list[tuple[str, int, int]],
) -> None:
    disk = Disk()
    split = RaftLog(0, 0, (), disk)
    whole = RaftLog(0, 0, ())
    term = 1
    handed_from = 1  # what the next "Ready" hands to the disk
    for kind, back, n in script:
        if kind == "append":
            term += 1
            start = max(1, whole.last_index + 1 - back)
            entries = [Entry(f"{term}:{k}".encode(), start + k, term) for k in range(n)]
            whole.append(entries)
            split.append(entries)
            handed_from = min(handed_from, start)
        else:
            batch = tuple(split.entries(handed_from, split.last_index + 1))
            if batch:
                disk.write(batch)
                split.stable_to(batch[-1].index, batch[-1].term)
            handed_from = split.last_index + 1
        assert split.last_index == whole.last_index
        assert split.entries(1, whole.last_index + 1) == whole.entries(1, whole.last_index + 1)
        assert all(split.term_at(i) == whole.term_at(i) for i in range(whole.last_index + 1))
    if handed_from > split.last_index:
        assert not split._tail  # everything persisted: nothing kept in memory
