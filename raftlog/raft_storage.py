"""The native Raft core's durable state on one node: its log in the segment journal (read by the
core through raft_core.LogStorage, written by the shell per Ready) and its hard state in meta.py's
atomic file.

Runs on the node's loop thread only (the journal's readers may be other threads); it never keeps
the log in memory (the journal's record cache is bounded) and never decides anything Raft.
"""

from __future__ import annotations

from collections.abc import Sequence

from raftmq.raftlog.journal import SegmentJournal
from raftmq.raftlog.meta import MetaStore, RaftMeta
from raftmq.raftlog.raft_messages import Entry, HardState
from raftmq.raftlog.snapshot import Snapshot

_READ_BYTES = 8 << 20  # one journal read_range at most; slice() loops


class JournalStorage:
    """raft_core.LogStorage over a SegmentJournal, plus the writes a Ready asks for."""

    def __init__(self, journal: SegmentJournal, meta: MetaStore) -> None:
        self.journal = journal
        self.meta = meta

    # ---- LogStorage (the core reads) -----------------------------------------------------------

    @property
    def last_index(self) -> int:
        return self.journal.last_index

    def term(self, index: int) -> int:
        return self.journal.term_at(index)

    def slice(self, lo: int, hi: int) -> list[Entry]:
        out: list[Entry] = []
        while lo < hi:
            recs = self.journal.read_range(lo, max_bytes=_READ_BYTES, max_count=hi - lo)
            if not recs:
                raise IndexError(f"journal has no entry {lo}")
            out.extend(Entry(r.command, r.index, r.term) for r in recs)
            lo = recs[-1].index + 1
        return out

    # ---- the shell's writes --------------------------------------------------------------------

    def load_hard_state(self) -> HardState:
        m = self.meta.load()
        return HardState(m.current_term, m.voted_for, m.commit_index)

    def store_hard_state(self, hs: HardState) -> None:
        """Durable (fsynced, atomic) before returning: votes and ballots wait for it."""
        self.meta.store(RaftMeta(hs.term, hs.vote, hs.commit))

    def write(self, entries: Sequence[Entry]) -> None:
        """Ready.entries: each overwrites any stored entry at its index or above. Written, not
        yet synced (the flush policy decides when)."""
        if not entries:
            return
        start = entries[0].index
        j = self.journal
        if start <= j.last_index:
            j.truncate_suffix(start)
        for e in entries:
            j.append(e.index, e.term, e.data)

    def install(self, snapshot: Snapshot) -> None:
        """Ready.snapshot: the log restarts after the snapshot's last entry."""
        self.journal.reset(snapshot.base_index + 1, snapshot.base_term)

    def base(self) -> tuple[int, int]:
        """(index, term) before the journal's first entry, for a restart: (0, 0) on a fresh
        journal; after retention or an install, the journal keeps the base's term."""
        j = self.journal
        first = j.first_index
        if first <= 1:
            return 0, 0
        if j.has_base:
            return first - 1, j.term_at(first - 1)
        raise ValueError(
            f"journal {j.directory} starts at {first} without the term of entry {first - 1}"
        )
