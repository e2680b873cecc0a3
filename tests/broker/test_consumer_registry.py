"""ConsumerRegistry: live members by heartbeat, expiry with time passed in, bounded."""

from __future__ import annotations

import pytest

from raftmq.broker.consumer_registry import ConsumerRegistry, RegistryFullError


def test_members_are_sorted_and_expire() -> None:
    r = ConsumerRegistry()
    r.heartbeat("g", "c2", ("t",), 1000, now_ms=0)
    r.heartbeat("g", "c1", ("t",), 1000, now_ms=500)
    assert r.members("g", now_ms=900) == ["c1", "c2"]
    assert r.members("g", now_ms=1000) == ["c1"], "c2's heartbeat expired at 1000"
    r.heartbeat("g", "c1", ("t",), 1000, now_ms=1400)
    assert r.members("g", now_ms=2300) == ["c1"]
    assert r.members("g", now_ms=2400) == []
    assert r.members("other", now_ms=0) == []


def test_leave_removes_at_once() -> None:
    r = ConsumerRegistry()
    r.heartbeat("g", "c1", (), 10_000, now_ms=0)
    r.heartbeat("g", "c2", (), 10_000, now_ms=0)
    assert r.leave("g", "c1")
    assert not r.leave("g", "c1")
    assert r.members("g", now_ms=1) == ["c2"]


def test_bounds() -> None:
    r = ConsumerRegistry(max_groups=1, max_clients_per_group=2)
    r.heartbeat("g", "a", (), 1000, now_ms=0)
    r.heartbeat("g", "b", (), 1000, now_ms=0)
    with pytest.raises(RegistryFullError):
        r.heartbeat("g", "c", (), 1000, now_ms=500)
    with pytest.raises(RegistryFullError):
        r.heartbeat("h", "a", (), 1000, now_ms=500)
    r.heartbeat("g", "c", (), 1000, now_ms=1000)  # a and b expired: room again
    assert r.members("g", now_ms=1000) == ["c"]


def test_expiry_is_clamped() -> None:
    r = ConsumerRegistry()
    r.heartbeat("g", "zero", (), 0, now_ms=0)  # 0 = the default, 30 s
    r.heartbeat("g", "negative", (), -5, now_ms=0)
    r.heartbeat("g", "huge", (), 10**12, now_ms=0)
    assert r.members("g", now_ms=999) == ["huge", "negative", "zero"]
    assert r.members("g", now_ms=1_000) == ["huge", "zero"], "at least MIN_EXPIRY_MS"
    assert r.members("g", now_ms=30_000) == ["huge"]
    assert r.members("g", now_ms=600_000) == [], "at most MAX_EXPIRY_MS"
