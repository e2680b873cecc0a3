"""The broker's orderly-consumption lock table: one live holder per (group, queue), leases that
renew and expire, unlock only by the holder; and a property test against a simple model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.broker.queue_lock import LockKind, LockRequest, LockTable
from raftmq.common.types import QueueRef

Q = [QueueRef("orders", "broker-a", i) for i in range(4)]


def test_lock_renew_expire_and_take_over() -> None:
    t = LockTable()
    assert t.lease_ms == 60_000
    r = t.lock("g", "c1", Q[:2], now_ms=0)
    assert r.granted == frozenset(Q[:2]) and not r.refused
    r = t.lock("g", "c2", Q[1:3], now_ms=10)
    assert r.granted == {Q[2]} and r.refused == {Q[1]}, "held by c1"
    assert t.lock("other-group", "c2", [Q[1]], 10).granted == {Q[1]}, "groups are separate"
    t.lock("g", "c1", [Q[1]], now_ms=50_000)  # renewal
    assert t.holder("g", Q[1], 109_999) == "c1"
    assert t.holder("g", Q[1], 110_000) is None, "lease over"
    r = t.lock("g", "c2", [Q[1]], now_ms=110_000)
    assert r.granted == {Q[1]} and r.taken_over == {Q[1]}
    assert t.held_by("g", "c2", 110_000) == {Q[1]}, "c2's lease on Q2 (from 10) is over"


def test_unlock_only_by_the_holder() -> None:
    t = LockTable(lease_ms=100)
    t.lock("g", "c1", Q, 0)
    assert t.unlock("g", "c2", Q, 1).granted == frozenset(), "not c2's to release"
    assert t.unlock("g", "c1", Q[:1], 1).granted == {Q[0]}
    assert t.lock("g", "c2", Q[:1], 2).granted == {Q[0]}, "free at once after unlock"


def test_apply_requests_and_expire_sweep() -> None:
    t = LockTable(lease_ms=10)
    r = t.apply(LockRequest(LockKind.LOCK, "g", "c1", tuple(Q)), 0)
    assert r.granted == frozenset(Q)
    assert t.apply(LockRequest(LockKind.UNLOCK, "g", "c1", (Q[0],)), 1).granted == {Q[0]}
    assert len(t) == 3
    assert len(t.expire(10, limit=2)) == 2 and len(t.expire(10)) == 1 and len(t) == 0
    with pytest.raises(ValueError):
        LockTable(lease_ms=0)


ops = st.lists(
    st.tuples(
        st.sampled_from([LockKind.LOCK, LockKind.UNLOCK]),
        st.sampled_from(["c1", "c2", "c3"]),
        st.sets(st.sampled_from(Q), min_size=1),
        st.integers(0, 40),  # time step
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_one_live_holder_matches_the_model(
    script: list[tuple[LockKind, str, set[QueueRef], int]],
) -> None:
    t = LockTable(lease_ms=50)
    replica = LockTable(lease_ms=50)
    model: dict[QueueRef, tuple[str, int]] = {}  # queue -> (client, expires)
    now = 0
    for kind, client, queues, dt in script:
        now += dt
        request = LockRequest(kind, "g", client, tuple(sorted(queues)))
        result = t.apply(request, now)
        assert result == replica.apply(request, now), "deterministic on every replica"
        for q in queues:
            held = model.get(q)
            live = held is not None and now < held[1]
            if kind is LockKind.LOCK:
                if live and held is not None and held[0] != client:
                    assert q in result.refused
                else:
                    assert q in result.granted
                    model[q] = (client, now + 50)
            elif held is not None and held[0] == client:
                assert q in result.granted
                del model[q]
            else:
                assert q not in result.granted
        for q in Q:
            held = model.get(q)
            expect = held[0] if held is not None and now < held[1] else None
            assert t.holder("g", q, now) == expect
