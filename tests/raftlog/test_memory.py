"""MemoryLog, the in-process log for broker tests: it commits at once, keeps entries dense and
bounded, follows role changes like the real log, and honours held commits."""

from __future__ import annotations

import threading

import pytest

from raftmq.raftlog import errors
from raftmq.raftlog.memory import MemoryLog
from raftmq.raftlog.record import Entry, Role, RoleChange


def test_a_leader_from_the_start_with_its_noop() -> None:
    log = MemoryLog("a")
    st = log.status()
    assert (st.role, st.term, st.leader, st.commit_index) == (Role.LEADER, 1, "a", 1)
    assert log.read(1) == Entry(1, 1, ())
    c = log.submit(b"x").result(0)
    assert (c.term, c.index, c.slot) == (1, 2, 0)
    assert log.read_from(1, max_bytes=1 << 20, max_entries=10) == [
        Entry(1, 1, ()),
        Entry(2, 1, (b"x",)),
    ]


def test_reads_are_bounded_and_return_at_least_one() -> None:
    log = MemoryLog()
    for i in range(5):
        log.submit(bytes(10 * [i])).result(0)
    assert [e.index for e in log.read_from(2, max_bytes=1, max_entries=10)] == [2]
    assert [e.index for e in log.read_from(2, max_bytes=25, max_entries=10)] == [2, 3]
    assert [e.index for e in log.read_from(2, max_bytes=1 << 20, max_entries=3)] == [2, 3, 4]
    assert log.read_from(7, max_bytes=1, max_entries=1) == []
    with pytest.raises(IndexError):
        log.read(7)


def test_old_entries_are_compacted_away() -> None:
    log = MemoryLog(max_entries=3)
    for _ in range(5):
        log.submit(b"y").result(0)
    assert log.first_index == 4 and log.committed_index == 6
    with pytest.raises(errors.CompactedError):
        log.read_from(3, max_bytes=1, max_entries=1)
    assert log.read(4).index == 4


def test_a_follower_refuses_and_learns_entries() -> None:
    seen: list[RoleChange] = []
    log = MemoryLog("a")
    log.add_role_listener(seen.append)
    log.become_follower("b", term=2)
    assert not log.is_leader() and not log.is_leader_ready()
    with pytest.raises(errors.NotLeaderError) as info:
        log.submit(b"x").result(0)
    assert info.value.leader == "b"
    assert log.append([b"from b"]) == Entry(2, 2, (b"from b",))
    log.become_leader()
    assert log.status().term == 3 and log.read(3) == Entry(3, 3, ())
    assert [(c.role, c.term) for c in seen] == [(Role.FOLLOWER, 2), (Role.LEADER, 3)]


def test_held_commits_wait_and_a_lost_leadership_leaves_them_unknown() -> None:
    log = MemoryLog()
    log.hold_commits()
    fut = log.submit(b"x")
    assert not fut.done() and log.committed_index == 1
    assert not log.wait_committed(2, 0.01)
    waiter = threading.Thread(target=log.wait_committed, args=(2, 5))
    waiter.start()
    log.release_commits()
    waiter.join(5)
    assert fut.result(0).index == 2
    log.hold_commits()
    lost = log.submit(b"y")
    log.become_follower(None)
    with pytest.raises(errors.OutcomeUnknownError):
        lost.result(0)


def test_limits_and_close() -> None:
    log = MemoryLog(max_entry_bytes=4)
    with pytest.raises(errors.EntryTooLargeError):
        log.submit(b"12345")
    log.close()
    with pytest.raises(errors.LogClosedError):
        log.submit(b"1")


def test_leadership_says_what_status_says() -> None:
    log = MemoryLog("a")
    for step in (lambda: None, lambda: log.become_follower("b", term=2), log.become_leader):
        step()
        st = log.status()
        assert log.leadership() == (st.role, st.term, st.leader)
