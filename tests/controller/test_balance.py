"""Leader balancing as a pure policy: who should lead each group, and when a hand-off may be
asked for (stable leadership, rate-limited, only to a known member that reports and has reported
without a gap for the hold time, never when disabled)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.controller.balance import BalancePolicy, Transfer, parse_preferred, plan, preferred_node
from raftmq.controller.liveness import Seen
from raftmq.controller.state import GroupRecord

MEMBERS = {"n0": "h:1", "n1": "h:2", "n2": "h:3"}
POLICY = BalancePolicy(True, interval_ms=10_000, hold_ms=5_000, alive_ms=3_000)


def rec(group: str, leader: str, changed_ms: int = 0) -> GroupRecord:
    return GroupRecord(group, leader, 3, 1, changed_ms, dict(MEMBERS))


def all_up(records: list[GroupRecord], now_ms: int) -> dict[tuple[str, str], Seen]:
    """Every member of every group reported just now and has reported since time 0."""
    return {(r.broker_group, n): Seen(now_ms, 0) for r in records for n in r.members}


def run(
    records: list[GroupRecord],
    now_ms: int,
    configured: dict[str, str] | None = None,
    attempts: dict[str, int] | None = None,
    policy: BalancePolicy = POLICY,
) -> list[Transfer]:
    seen = all_up(records, now_ms)
    return plan(records, configured or {}, attempts or {}, seen, now_ms, policy)


def test_groups_prefer_different_nodes_by_default() -> None:
    groups = ["broker-a", "broker-b", "broker-c", "broker-d"]
    picks = [preferred_node(g, list(MEMBERS), groups, {}) for g in groups]
    assert picks == ["n0", "n1", "n2", "n0"]
    assert preferred_node("broker-b", list(MEMBERS), groups, {"broker-b": "n2"}) == "n2"


def test_plan_hands_off_a_stable_misplaced_leader() -> None:
    [t] = run([rec("broker-a", "n1")], 60_000)
    assert (t.from_node, t.to_node, t.from_address, t.to_address) == ("n1", "n0", "h:2", "h:1")
    assert run([rec("broker-a", "n0")], 60_000) == []


def test_plan_waits_for_the_hold_and_the_interval() -> None:
    r = rec("broker-a", "n1", changed_ms=58_000)
    assert run([r], 60_000) == []  # leader changed 2 s ago
    assert run([r], 63_000) != []
    assert run([r], 63_000, attempts={"broker-a": 55_000}) == []  # tried 8 s ago
    assert run([r], 63_000, attempts={"broker-a": 52_000}) != []


def test_plan_never_targets_an_unknown_node_or_runs_disabled() -> None:
    assert run([rec("broker-a", "n1")], 60_000, {"broker-a": "n9"}) == []
    off = BalancePolicy(False, 10_000, 5_000)
    assert run([rec("broker-a", "n1")], 60_000, policy=off) == []
    assert run([GroupRecord("broker-a", "", 0, 0, 0, dict(MEMBERS))], 60_000) == []


def test_plan_never_targets_a_silent_or_just_returned_node() -> None:
    r = rec("broker-a", "n1")
    up = all_up([r], 60_000)
    assert plan([r], {}, {}, up, 60_000, POLICY) != []
    # n0 (preferred) never reported, or last reported more than alive_ms ago: dead.
    assert plan([r], {}, {}, {k: v for k, v in up.items() if k[1] != "n0"}, 60_000, POLICY) == []
    dead = {**up, ("broker-a", "n0"): Seen(56_999, 0)}
    assert plan([r], {}, {}, dead, 60_000, POLICY) == []
    # n0 back 4 s ago after a gap: within the hold (5 s) it is not handed leadership yet.
    back = {**up, ("broker-a", "n0"): Seen(60_000, 56_000)}
    assert plan([r], {}, {}, back, 60_000, POLICY) == []
    assert plan([r], {}, {}, {**back, ("broker-a", "n0"): Seen(61_000, 56_000)}, 61_000, POLICY)
    # The current leader itself is silent: it could not be asked.
    silent = {**up, ("broker-a", "n1"): Seen(50_000, 0)}
    assert plan([r], {}, {}, silent, 60_000, POLICY) == []


def test_parse_preferred() -> None:
    assert parse_preferred(" broker-a=n1, broker-b=n2 ,") == {"broker-a": "n1", "broker-b": "n2"}
    with pytest.raises(ValueError, match="group=node_id"):
        parse_preferred("broker-a")


@settings(max_examples=100, deadline=None)
@given(
    leaders=st.lists(st.sampled_from(sorted(MEMBERS)), min_size=1, max_size=6),
    now=st.integers(0, 10**9),
    ages=st.lists(st.integers(0, 20_000), min_size=6, max_size=6),
    silent=st.lists(st.integers(0, 10_000), min_size=18, max_size=18),
    up=st.lists(st.integers(0, 10_000), min_size=18, max_size=18),
)
def test_plan_properties(
    leaders: list[str], now: int, ages: list[int], silent: list[int], up: list[int]
) -> None:
    records = [rec(f"g{i}", n, now - ages[i]) for i, n in enumerate(leaders)]
    seen = {
        (r.broker_group, node): Seen(
            now - silent[3 * i + j], now - silent[3 * i + j] - up[3 * i + j]
        )
        for i, r in enumerate(records)
        for j, node in enumerate(sorted(MEMBERS))
    }
    out = plan(records, {}, {}, seen, now, POLICY)
    names = [r.broker_group for r in records]
    for t in out:
        r = next(r for r in records if r.broker_group == t.broker_group)
        assert t.to_node == preferred_node(r.broker_group, list(MEMBERS), names, {})
        assert t.to_node != r.leader_node_id and now - r.changed_ms >= POLICY.hold_ms
        target = seen[(r.broker_group, t.to_node)]
        assert target.alive(now, POLICY.alive_ms) and target.up_for_ms(now) >= POLICY.hold_ms
        assert seen[(r.broker_group, t.from_node)].alive(now, POLICY.alive_ms)
    # At most one transfer per group, and none for a group attempted within the interval.
    assert len({t.broker_group for t in out}) == len(out)
    tried = {r.broker_group: now - 1 for r in records}
    assert plan(records, {}, tried, seen, now, POLICY) == []
    # Applying the plan leaves nothing to do: the policy converges in one step.
    moved = {t.broker_group: t.to_node for t in out}
    after = [rec(r.broker_group, moved.get(r.broker_group, r.leader_node_id), 0) for r in records]
    later = now + 10**6
    assert all(t.broker_group not in moved for t in run(after, later))
