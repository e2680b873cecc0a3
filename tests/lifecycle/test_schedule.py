"""The delayed-message schedule: due order, bounded batches and window, idempotent delivery apply,
never early; and a property test over random schedules, clock steps, leader changes and proposals
that commit late, twice or never: every message is delivered exactly once, never before due."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.broker.schedule import (
    DeliverProposal,
    MemoryScheduleIndex,
    MessageRef,
    Schedule,
    ScheduleKey,
    check_batch_order,
)


def ref(n: int) -> MessageRef:
    return MessageRef(raft_index=n, slot=0, position=0, topic="orders", queue_id=n % 4)


def schedule(batch: int = 3, window: int = 2) -> Schedule:
    return Schedule(MemoryScheduleIndex(), deliver_batch=batch, max_inflight_batches=window)


def test_due_in_order_bounded_and_never_early() -> None:
    s = schedule(batch=3)
    for seq, due in enumerate([50, 10, 30, 10, 70, 20]):
        s.apply_scheduled(ScheduleKey(due, seq), ref(seq))
    assert s.next_due_ms() == 10
    assert s.take_due(9) is None, "nothing due before 10"
    p = s.take_due(40)
    assert p is not None
    assert p.keys == (ScheduleKey(10, 1), ScheduleKey(10, 3), ScheduleKey(20, 5))
    q = s.take_due(40)
    assert q is not None and q.keys == (ScheduleKey(30, 2),), "in-flight keys are skipped"
    assert s.take_due(40) is None, "window of two batches is full"
    out = s.apply_deliver(p.keys, entry_ts_ms=40)
    s.proposal_done(p)
    assert [e.key.seq for e in out.delivered] == [1, 3, 5] and check_batch_order(out.delivered)
    assert s.index.count() == 3 and s.inflight_count == 1


def test_apply_is_idempotent_and_refuses_early_keys() -> None:
    s = schedule()
    s.apply_scheduled(ScheduleKey(10, 0), ref(0))
    s.apply_scheduled(ScheduleKey(10, 0), ref(0))  # a replayed put changes nothing
    s.apply_scheduled(ScheduleKey(99, 1), ref(1))
    with pytest.raises(ValueError, match="already holds"):
        s.apply_scheduled(ScheduleKey(10, 0), ref(5))
    first = s.apply_deliver([ScheduleKey(10, 0), ScheduleKey(99, 1)], entry_ts_ms=50)
    assert [e.key for e in first.delivered] == [ScheduleKey(10, 0)]
    assert first.early == (ScheduleKey(99, 1),), "not due at the entry's time: kept"
    second = s.apply_deliver([ScheduleKey(10, 0)], entry_ts_ms=60)
    assert second.delivered == () and second.already == (ScheduleKey(10, 0),)
    assert s.index.count() == 1


def test_new_leader_reproposes_and_apply_keeps_one_delivery() -> None:
    s = schedule()
    s.apply_scheduled(ScheduleKey(5, 0), ref(0))
    old = s.take_due(10)
    assert old is not None
    s.lost_leadership()  # the old proposal is still in the log, uncommitted
    new = s.take_due(11)
    assert new is not None and new.keys == old.keys
    a = s.apply_deliver(old.keys, 10)
    b = s.apply_deliver(new.keys, 11)
    assert len(a.delivered) == 1 and b.already == new.keys


def test_failed_proposal_frees_its_keys() -> None:
    s = schedule(window=1)
    s.apply_scheduled(ScheduleKey(5, 0), ref(0))
    p = s.take_due(10)
    assert p is not None and s.take_due(10) is None
    s.proposal_done(p)  # never committed
    again = s.take_due(10)
    assert again is not None and again.keys == p.keys


def test_bad_settings_and_keys() -> None:
    with pytest.raises(ValueError):
        Schedule(MemoryScheduleIndex(), deliver_batch=0)
    with pytest.raises(ValueError, match="negative"):
        schedule().apply_scheduled(ScheduleKey(-1, 0), ref(0))


def test_memory_index_scan_after_pages() -> None:
    idx = MemoryScheduleIndex()
    for seq in range(10):
        idx.put(ScheduleKey(seq // 3, seq), ref(seq))
    page1 = idx.scan_due(100, 4)
    page2 = idx.scan_after(page1[-1].key, 100, 100)
    assert [e.key.seq for e in page1 + page2] == list(range(10))
    assert idx.delete(ScheduleKey(0, 0)) is not None and idx.delete(ScheduleKey(0, 0)) is None
    assert idx.first_due_ms() == 0 and idx.count() == 9


# ---- the property: a simulated Raft log with leader changes --------------------------------------

events = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), st.integers(0, 500)),  # due_ms (relative to now)
        st.tuples(st.just("tick"), st.integers(0, 120)),  # clock step
        st.tuples(st.just("commit"), st.integers(0, 3)),  # commit the pending proposal i
        st.tuples(st.just("lose"), st.integers(0, 3)),  # drop the pending proposal i
        st.tuples(st.just("leader_change"), st.just(0)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(events, st.integers(1, 5), st.integers(1, 3))
def test_every_message_delivered_exactly_once_never_early(
    script: list[tuple[str, int]], batch: int, window: int
) -> None:
    # Two replicas apply the same committed log; only the leader proposes.
    leader = Schedule(MemoryScheduleIndex(), deliver_batch=batch, max_inflight_batches=window)
    follower = Schedule(MemoryScheduleIndex(), deliver_batch=batch, max_inflight_batches=window)
    now = 1_000
    seq = 0
    due_of: dict[int, int] = {}
    pending: list[DeliverProposal] = []  # proposed, not yet committed (any term)
    delivered: list[tuple[int, int]] = []  # (seq, entry time)

    def apply_deliver(p: DeliverProposal, ts: int) -> None:
        out = leader.apply_deliver(p.keys, ts)
        mirror = follower.apply_deliver(p.keys, ts)
        assert out == mirror, "replicas decide alike"
        assert check_batch_order(out.delivered)
        delivered.extend((e.key.seq, ts) for e in out.delivered)

    def step(kind: str, arg: int) -> None:
        nonlocal now, seq
        if kind == "schedule":
            key = ScheduleKey(now + arg, seq)
            due_of[seq] = key.due_ms
            leader.apply_scheduled(key, ref(seq))
            follower.apply_scheduled(key, ref(seq))
            seq += 1
        elif kind == "tick":
            now += arg
            p = leader.take_due(now)
            if p is not None:
                assert len(p.keys) <= batch and list(p.keys) == sorted(p.keys)
                assert all(k.due_ms <= now for k in p.keys)
                pending.append(p)
            assert leader.inflight_count <= batch * window
        elif kind == "commit" and pending:
            p = pending.pop(arg % len(pending))
            apply_deliver(p, now)  # entry time: the leader's now at commit, >= proposal time
            leader.proposal_done(p)
        elif kind == "lose" and pending:
            p = pending.pop(arg % len(pending))
            leader.proposal_done(p)
        elif kind == "leader_change":
            leader.lost_leadership()  # pending proposals of the old term may still commit

    for kind, arg in script:
        step(kind, arg)
    # Drain: time passes beyond every due time and every proposal commits.
    for _ in range(seq + 10):
        step("tick", 600)
        while pending:
            step("commit", 0)
        if leader.index.count() == 0:
            break

    seqs = [s for s, _ in delivered]
    assert sorted(seqs) == list(range(seq)), "each scheduled message delivered exactly once"
    assert all(ts >= due_of[s] for s, ts in delivered), "never before it is due"
    assert leader.index.count() == follower.index.count() == 0
