"""The replication rules without sockets: (log state, message) -> decision tables, the leader's
progress rules, and a property test that a follower fed one leader's history never diverges."""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.raftlog import pysyncobj_compat
from raftmq.raftlog.errors import CommittedEntryConflictError
from raftmq.raftlog.journal import SegmentJournal
from raftmq.raftlog.meta import MetaStore, RaftMeta
from raftmq.raftlog.pysyncobj_compat import RaftNode
from raftmq.raftlog.replication import (
    Ack,
    AppendDecision,
    AppendReply,
    AppendRequest,
    Progress,
    WireEntry,
    first_index_of_term_run,
    follower_append,
    leader_on_ack,
)
from raftmq.raftlog.storage_health import CorruptRecord, StorageHealth


@dataclass
class ListLog:
    """An in-memory log: terms[k] is the term of index first + k."""

    terms: list[int]
    first: int = 1

    @property
    def first_index(self) -> int:
        return self.first

    @property
    def last_index(self) -> int:
        return self.first + len(self.terms) - 1

    def term_at(self, index: int) -> int:
        if not self.first_index <= index <= self.last_index:
            raise IndexError(index)
        return self.terms[index - self.first]

    def apply(self, d: AppendDecision) -> None:
        if d.truncate_from is not None:
            assert self.first_index <= d.truncate_from <= self.last_index
            del self.terms[d.truncate_from - self.first :]
        for _, index, term in d.append:
            assert index == self.last_index + 1
            assert not self.terms or term >= self.terms[-1]
            self.terms.append(term)


def ents(first: int, terms: Sequence[int]) -> list[WireEntry]:
    return [(b"c%d" % (first + k), first + k, t) for k, t in enumerate(terms)]


def req(prev: int, prev_term: int, commit: int, first_term_list: Sequence[int]) -> AppendRequest:
    return AppendRequest(prev, prev_term, commit, ents(prev + 1, first_term_list))


# (id, our terms from index 1, our commit index, message,
#  expected truncate_from, expected appended indexes, expected commit, expected reply)
FOLLOWER_TABLE = [
    (
        "empty log (only the initial entry): append all, commit clamped to last new",
        [0],
        0,
        req(1, 0, 5, [1, 1]),
        None,
        [2, 3],
        3,
        AppendReply(True, 4),
    ),
    (
        "heartbeat on a matching prefix: nothing to write, commit advances to leader's",
        [0, 1, 1, 1],
        1,
        req(4, 1, 3, []),
        None,
        [],
        3,
        AppendReply(True, 5),
    ),
    (
        "matching prefix then new entries: only the new ones are appended",
        [0, 1, 1],
        1,
        req(1, 0, 2, [1, 1, 2, 2]),
        None,
        [4, 5],
        2,
        AppendReply(True, 6),
    ),
    (
        "conflicting uncommitted suffix: truncated from the first conflict",
        [0, 1, 1, 2, 2],
        2,
        req(2, 1, 4, [1, 3, 3]),
        4,
        [4, 5],
        4,
        AppendReply(True, 6),
    ),
    (
        "stale duplicate append (shorter than our log): no truncation of matching entries",
        [0, 1, 1, 1, 1],
        1,
        req(1, 0, 4, [1, 1]),
        None,
        [],
        3,
        AppendReply(True, 4),
    ),
    (
        "prev index beyond our end: reject with our end as the hint",
        [0, 1, 1],
        1,
        req(7, 2, 7, [2]),
        None,
        [],
        1,
        AppendReply(False, 4),
    ),
    (
        "prev term mismatch: reject, hint skips our whole term run",
        [0, 1, 2, 2, 2],
        1,
        req(5, 3, 5, [3]),
        None,
        [],
        1,
        AppendReply(False, 3),
    ),
    (
        "prev term mismatch: the hint never goes at or below our commit index",
        [0, 1, 2, 2, 2],
        3,
        req(5, 3, 5, [3]),
        None,
        [],
        3,
        AppendReply(False, 4),
    ),
    (
        "leader commit beyond what the message proves: clamped to the last new entry",
        [0, 1],
        0,
        req(2, 1, 100, [1]),
        None,
        [3],
        3,
        AppendReply(True, 4),
    ),
    (
        "leader commit below ours (a stale message): our commit never goes back",
        [0, 1, 1, 1],
        3,
        req(1, 0, 1, [1]),
        None,
        [],
        3,
        AppendReply(True, 3),
    ),
]


@pytest.mark.parametrize(
    ("ours", "commit", "msg", "truncate_from", "appended", "new_commit", "reply"),
    [case[1:] for case in FOLLOWER_TABLE],
    ids=[case[0] for case in FOLLOWER_TABLE],
)
def test_follower_append_table(
    ours: list[int],
    commit: int,
    msg: AppendRequest,
    truncate_from: int | None,
    appended: list[int],
    new_commit: int,
    reply: AppendReply,
) -> None:
    d = follower_append(ListLog(list(ours)), commit, msg)
    assert d.truncate_from == truncate_from
    assert [e[1] for e in d.append] == appended
    assert d.commit_index == new_commit
    assert d.reply == reply
    assert d.reply.reset is (not reply.success)


def test_prev_below_first_index_is_rejected_with_our_end() -> None:
    log = ListLog([3, 3, 3], first=10)  # retention removed 1..9
    d = follower_append(log, 9, req(5, 1, 20, [1]))
    assert d.reply == AppendReply(False, 13)
    assert d.append == () and d.truncate_from is None


@pytest.mark.parametrize(
    ("ours", "commit", "msg", "index"),
    [
        ([0, 1, 1, 1], 3, req(1, 0, 4, [1, 2]), 3),  # an entry conflicts at commit index
        ([0, 1, 1, 1], 4, req(1, 0, 4, [2]), 2),  # an entry conflicts below it
        ([0, 1, 2, 2], 3, req(3, 1, 4, [2]), 3),  # prev itself conflicts, committed
    ],
    ids=["entry at commit", "entry below commit", "prev below commit"],
)
def test_conflict_at_a_committed_index_raises(
    ours: list[int], commit: int, msg: AppendRequest, index: int
) -> None:
    with pytest.raises(CommittedEntryConflictError) as info:
        follower_append(ListLog(list(ours)), commit, msg)
    assert info.value.index == index
    assert info.value.commit_index == commit


def test_non_consecutive_entries_are_refused() -> None:
    msg = AppendRequest(1, 0, 0, [(b"a", 2, 1), (b"b", 4, 1)])
    with pytest.raises(ValueError, match="carries index 4"):
        follower_append(ListLog([0]), 0, msg)


def test_first_index_of_term_run() -> None:
    log = ListLog([1, 1, 2, 2, 2, 5], first=4)
    assert [first_index_of_term_run(log, i) for i in range(4, 10)] == [4, 4, 6, 6, 6, 9]


# (id, progress before, ack, progress after); Ack(next_index, success, reset)
OK, RESET, FAILED = (True, False), (False, True), (False, False)
LEADER_TABLE = [
    ("ack advances match and next", Progress(0, 5), Ack(9, *OK), Progress(8, 9)),
    ("pipelined: a late ack never rewinds next", Progress(3, 20), Ack(9, *OK), Progress(8, 20)),
    ("stale ack below match is ignored", Progress(8, 20), Ack(5, *OK), Progress(8, 20)),
    (
        "reject with hint above match: next to the hint",
        Progress(3, 20),
        Ack(6, *RESET),
        Progress(3, 6),
    ),
    (
        "reject at match + 1: next never below match + 1",
        Progress(5, 20),
        Ack(6, *RESET),
        Progress(5, 6),
    ),
    (
        "follower lost acked entries: match comes down",
        Progress(8, 20),
        Ack(4, *RESET),
        Progress(3, 4),
    ),
    ("a failure without reset changes nothing", Progress(8, 20), Ack(4, *FAILED), Progress(8, 20)),
]


@pytest.mark.parametrize(
    ("before", "ack", "after"),
    [case[1:] for case in LEADER_TABLE],
    ids=[case[0] for case in LEADER_TABLE],
)
def test_leader_on_ack_table(before: Progress, ack: Ack, after: Progress) -> None:
    got = leader_on_ack(before, ack)
    assert got == after
    assert got.next_index >= got.match_index + 1


# ---- property: one leader history, random messages from it --------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    """(leader terms, follower terms, follower commit): the follower holds a prefix of the leader's
    log, then possibly entries of terms the leader never had (odd; the leader's are even); the
    leader's log ends with an entry of its own, newer term."""
    n = draw(st.integers(1, 25))
    steps = draw(st.lists(st.sampled_from([0, 0, 0, 2]), min_size=n, max_size=n))
    leader = [0]
    for s in steps:
        leader.append(leader[-1] + s)
    shared = draw(st.integers(1, len(leader)))
    follower = leader[:shared]
    for _ in range(draw(st.integers(0, 8))):
        follower.append(max(follower[-1] + 1 - follower[-1] % 2, 1) + 2 * draw(st.integers(0, 1)))
    commit = draw(st.integers(0, shared))
    # The leader's no-op of its own term, above every term either log holds (Raft: a leader's
    # term is newer than any entry it could conflict with).
    leader.append(2 * (max(leader + follower) // 2 + 1))
    return leader, follower, commit


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=300, deadline=None)
@given(data=st.data(), start=histories())
def test_follower_never_diverges_from_its_leader(
    data: st.DataObject, start: tuple[list[int], list[int], int]
) -> None:
    leader, ours, commit = start
    log = ListLog(list(ours))
    last = len(leader)  # leader's last index (index k holds leader[k - 1])

    def message(prev: int, count: int, leader_commit: int) -> AppendRequest:
        terms = leader[prev : prev + count]
        return AppendRequest(prev, leader[prev - 1], leader_commit, ents(prev + 1, terms))

    def step(msg: AppendRequest) -> AppendDecision:
        nonlocal commit
        before = common_prefix(log.terms, leader)
        d = follower_append(log, commit, msg)
        log.apply(d)
        assert d.commit_index >= commit
        commit = d.commit_index
        assert common_prefix(log.terms, leader) >= before  # a shared entry is never dropped
        assert commit <= common_prefix(log.terms, leader)  # committed entries are the leader's
        if d.reply.success:
            assert log.terms[: d.reply.next_index - 1] == leader[: d.reply.next_index - 1]
        return d

    # Random messages: re-sent, reordered or stale ranges of the one history.
    for _ in range(data.draw(st.integers(0, 12))):
        prev = data.draw(st.integers(1, last))
        count = data.draw(st.integers(0, last - prev))
        step(message(prev, count, data.draw(st.integers(0, last))))
    # Then the leader's own loop: start at its end, follow the hints; the follower converges.
    nxt = last + 1
    for _ in range(2 * last + 2):
        d = step(message(nxt - 1, last - nxt + 1, last))
        nxt = d.reply.next_index
        if d.reply.success and nxt == last + 1:
            break
    assert log.terms == leader
    assert commit == last


def test_stop_process_logs_critical_and_exits_nonzero(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", fake_exit)
    err = CommittedEntryConflictError(7, 9, 2, 3)
    with caplog.at_level(logging.CRITICAL, logger="raftlog.raft"), pytest.raises(SystemExit):
        pysyncobj_compat.stop_process("127.0.0.1:1", err)
    assert codes == [pysyncobj_compat.EXIT_INVARIANT_VIOLATED] and codes[0] != 0
    assert "raft.invariant_violated" in caplog.text and "index 7" in caplog.text


# ---- the shell: RaftNode's handler does what the decision says, and stops on a conflict ---------


class ShellStub:
    """The pysyncobj state RaftNode._rm_on_append_entries reads and writes, without sockets."""

    def __init__(self, journal: SegmentJournal, commit_index: int, term: int) -> None:
        self._rm_journal = journal
        self._rm_health = StorageHealth("127.0.0.1:1")
        self._rm_cfg = SimpleNamespace(node_id="127.0.0.1:1")
        self._rm_sync_flush = True
        self.fatal: list[BaseException] = []
        self._rm_on_fatal = lambda _node_id, err: self.fatal.append(err)
        self.sent: list[dict[str, object]] = []
        self._SyncObj__raftCurrentTerm = term
        self._SyncObj__transferInProgress = False
        self._SyncObj__raftElectionDeadline = 0.0
        self._SyncObj__raftLeader = "leader"
        self._SyncObj__leaderCommitIndex = 0
        self._SyncObj__raftCommitIndex = commit_index
        self._SyncObj__raftLog = SimpleNamespace(setRaftCommitIndex=lambda i: None)

    def _SyncObj__generateRaftTimeout(self) -> float:
        return 1.0

    def _SyncObj__onLeaderChanged(self) -> None:
        pass

    def _SyncObj__setCurrentTerm(self, term: int, voted_for: object) -> None:
        self._SyncObj__raftCurrentTerm = term

    def _SyncObj__setState(self, state: int) -> None:
        pass

    def _SyncObj__sendNextNodeIdx(self, node: object, **kw: object) -> None:
        self.sent.append(kw)

    def _rm_accept_leader(self, node: object, msg: dict[str, object]) -> bool:
        return bool(RaftNode._rm_accept_leader(self, node, msg))


def wire(
    prev: int, prev_term: int, commit: int, entries: list[WireEntry], term: int
) -> dict[str, object]:
    return {
        "type": "append_entries",
        "term": term,
        "commit_index": commit,
        "entries": entries,
        "prevLogIdx": prev,
        "prevLogTerm": prev_term,
    }


def test_shell_truncates_appends_replies_and_commits(tmp_path: Path) -> None:
    with SegmentJournal(tmp_path) as j:
        for i, t in enumerate([0, 1, 1, 2, 2], start=1):
            j.append(i, t, b"old%d" % i)
        stub = ShellStub(j, commit_index=2, term=3)
        msg = wire(2, 1, 4, ents(3, [1, 3, 3]), term=3)
        RaftNode._rm_on_append_entries(stub, "leader", msg)
        assert [j.term_at(i) for i in range(1, 6)] == [0, 1, 1, 3, 3]
        assert j.get(3).command == b"old3"  # the matching entry was not rewritten
        assert j.get(4).command == b"c4"
        assert stub.sent == [{"nextNodeIdx": 6, "success": True}]
        assert stub._SyncObj__raftCommitIndex == 4
        assert stub.fatal == []


def test_shell_stops_on_a_conflict_at_a_committed_index(tmp_path: Path) -> None:
    with SegmentJournal(tmp_path) as j:
        for i, t in enumerate([0, 1, 1, 1], start=1):
            j.append(i, t, b"old%d" % i)
        stub = ShellStub(j, commit_index=3, term=3)
        RaftNode._rm_on_append_entries(stub, "leader", wire(1, 0, 4, ents(2, [1, 2]), term=3))
        assert len(stub.fatal) == 1 and isinstance(stub.fatal[0], CommittedEntryConflictError)
        assert stub.sent == []  # no reply: nothing was acknowledged
        assert j.last_index == 4 and j.term_at(3) == 1  # nothing truncated or written
        assert stub._SyncObj__raftCommitIndex == 3


def test_shell_on_a_full_disk_keeps_what_it_wrote_and_backs_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SegmentJournal(tmp_path) as j:
        j.append(1, 1, b"old1")
        stub = ShellStub(j, commit_index=1, term=1)
        real_append = j.append

        def append(index: int, term: int, command: bytes) -> None:
            if index >= 3:
                raise OSError(errno.ENOSPC, "No space left on device")
            real_append(index, term, command)

        monkeypatch.setattr(j, "append", append)
        msg = wire(1, 1, 1, ents(2, [1, 1, 1]), term=1)
        RaftNode._rm_on_append_entries(stub, "leader", msg)
        assert j.last_index == 2  # entry 2 stays; 3 and 4 did not fit
        assert stub.sent == [{"nextNodeIdx": 3, "reset": True}]  # resend from 3, later
        err = stub._rm_health.error
        assert err is not None and err.disk_full and err.where == "journal"
        RaftNode._rm_on_append_entries(stub, "leader", wire(2, 1, 1, ents(3, [1, 1]), term=1))
        assert stub.sent[-1] == {"nextNodeIdx": 3, "reset": True}  # backing off: not tried
        assert j.last_index == 2


def test_a_meta_store_that_failed_is_retried_while_the_node_is_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SegmentJournal(tmp_path / "j") as j:
        meta = MetaStore(tmp_path / "raft.meta")
        adapter = pysyncobj_compat.JournalAdapter(j, meta, StorageHealth("n1"))
        real_store = meta.store

        def full(_m: RaftMeta) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(meta, "store", full)
        with pytest.raises(OSError):
            adapter.setCurrentTerm(2, "n2")  # a vote the disk refused: nothing sent
        assert adapter.health.error is not None
        monkeypatch.setattr(meta, "store", real_store)
        time.sleep(adapter.health.retry_in_s("raft meta", time.monotonic()))  # its back-off
        adapter.onOneSecondTimer()  # nothing changed since, but the failed store is retried
        adapter.health.settle(10**9)
        assert adapter.health.error is None


def test_a_node_with_a_corrupt_record_says_it_cannot_take_over(tmp_path: Path) -> None:
    """What a follower's acks carry (rm_cannot_write): the leader's transfer_candidates then
    pass it over."""
    with SegmentJournal(tmp_path / "j") as j:
        stub = ShellStub(j, commit_index=0, term=1)
        stub._rm_next_space_check = 0.0  # type: ignore[attr-defined]
        stub._rm_low_space = False  # type: ignore[attr-defined]
        assert not RaftNode._rm_cannot_write(stub)
        rec = CorruptRecord("journal", str(tmp_path / "j" / "1.seg"), 24, 3, "crc mismatch")
        stub._rm_health.corrupt(rec, 1.0)
        assert RaftNode._rm_cannot_write(stub)  # unrepaired corruption: never preferred
        stub._rm_health.repaired(rec.path, rec.offset)
        assert not RaftNode._rm_cannot_write(stub)
