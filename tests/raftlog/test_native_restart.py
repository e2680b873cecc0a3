"""A native node restarting alone (its peers down, so no leader tells it the commit index) on a
journal and Raft state file as its shell wrote them: what its state machine applied before the
restart is committed and readable at once, and nothing past the journal's end is."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftmq.raftlog import entry_codec
from raftmq.raftlog.config import RaftLogConfig
from raftmq.raftlog.journal import SegmentJournal
from raftmq.raftlog.meta import MetaStore
from raftmq.raftlog.native_log import NativeLog
from raftmq.raftlog.raft_messages import Entry, HardState
from raftmq.raftlog.raft_storage import JournalStorage
from tests.harness.local_cluster import free_ports


def written_node(tmp_path: Path) -> RaftLogConfig:
    """Five entries of term 1 and a commit hint of 2 (the hint is stored lazily: the node had
    applied more), written through the shell's own storage."""
    me, a, b = free_ports(3)
    cfg = RaftLogConfig(f"127.0.0.1:{me}", (f"127.0.0.1:{a}", f"127.0.0.1:{b}"), tmp_path)
    with SegmentJournal(tmp_path / "journal") as journal:
        st = JournalStorage(journal, MetaStore(tmp_path / "raft.meta"))
        st.write([Entry(entry_codec.encode_data([b"m%d" % i]), i, 1) for i in range(1, 6)])
        st.store_hard_state(HardState(1, cfg.node_id, 2))
    return cfg


@pytest.mark.parametrize(("hint", "readable"), [(4, 4), (9, 5), (0, 2)])
def test_what_the_state_machine_applied_is_readable_before_a_leader_is_heard(
    tmp_path: Path, hint: int, readable: int
) -> None:
    """The broker passes its store's dispatched index: a follower read of a row it indexed
    before a SIGKILL failed with an internal error (IndexError, "not committed yet") until the
    new leader's first message, and for good when none came."""
    rlog = NativeLog(written_node(tmp_path), applied_hint=hint)
    try:
        assert rlog.committed_index == readable
        assert rlog.read(readable).chunks == (b"m%d" % readable,)
        assert [e.index for e in rlog.read_from(1, max_bytes=1 << 20, max_entries=10)] == list(
            range(1, readable + 1)
        )
        with pytest.raises(IndexError):
            rlog.read(readable + 1)  # not known committed here: never served
    finally:
        rlog.close(transfer_leadership=False)
