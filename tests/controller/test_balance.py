"""Leader balancing as a pure policy: who should lead each group, and when a hand-off may be
asked for (stable leadership, rate-limited, only to a known member, never when disabled)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.balance import BalancePolicy, parse_preferred, plan, preferred_node
from controller.state import GroupRecord

MEMBERS = {"n0": "h:1", "n1": "h:2", "n2": "h:3"}
POLICY = BalancePolicy(True, interval_ms=10_000, hold_ms=5_000)


def rec(group: str, leader: str, changed_ms: int = 0) -> GroupRecord:
    return GroupRecord(group, leader, 3, 1, changed_ms, dict(MEMBERS))


def test_groups_prefer_different_nodes_by_default() -> None:
    groups = ["broker-a", "broker-b", "broker-c", "broker-d"]
    picks = [preferred_node(g, list(MEMBERS), groups, {}) for g in groups]
    assert picks == ["n0", "n1", "n2", "n0"]
    assert preferred_node("broker-b", list(MEMBERS), groups, {"broker-b": "n2"}) == "n2"


def test_plan_hands_off_a_stable_misplaced_leader() -> None:
    [t] = plan([rec("broker-a", "n1")], {}, {}, 60_000, POLICY)
    assert (t.from_node, t.to_node, t.from_address, t.to_address) == ("n1", "n0", "h:2", "h:1")
    assert plan([rec("broker-a", "n0")], {}, {}, 60_000, POLICY) == []


def test_plan_waits_for_the_hold_and_the_interval() -> None:
    r = rec("broker-a", "n1", changed_ms=58_000)
    assert plan([r], {}, {}, 60_000, POLICY) == []  # leader changed 2 s ago
    assert plan([r], {}, {}, 63_000, POLICY) != []
    assert plan([r], {}, {"broker-a": 55_000}, 63_000, POLICY) == []  # tried 8 s ago
    assert plan([r], {}, {"broker-a": 52_000}, 63_000, POLICY) != []


def test_plan_never_targets_an_unknown_node_or_runs_disabled() -> None:
    assert plan([rec("broker-a", "n1")], {"broker-a": "n9"}, {}, 60_000, POLICY) == []
    off = BalancePolicy(False, 10_000, 5_000)
    assert plan([rec("broker-a", "n1")], {}, {}, 60_000, off) == []
    assert plan([GroupRecord("broker-a", "", 0, 0, 0, dict(MEMBERS))], {}, {}, 60_000, POLICY) == []


def test_parse_preferred() -> None:
    assert parse_preferred(" broker-a=n1, broker-b=n2 ,") == {"broker-a": "n1", "broker-b": "n2"}
    with pytest.raises(ValueError, match="group=node_id"):
        parse_preferred("broker-a")


@settings(max_examples=100, deadline=None)
@given(
    leaders=st.lists(st.sampled_from(sorted(MEMBERS)), min_size=1, max_size=6),
    now=st.integers(0, 10**9),
    ages=st.lists(st.integers(0, 20_000), min_size=6, max_size=6),
)
def test_plan_properties(leaders: list[str], now: int, ages: list[int]) -> None:
    records = [rec(f"g{i}", n, now - ages[i]) for i, n in enumerate(leaders)]
    out = plan(records, {}, {}, now, POLICY)
    names = [r.broker_group for r in records]
    for t in out:
        r = next(r for r in records if r.broker_group == t.broker_group)
        assert t.to_node == preferred_node(r.broker_group, list(MEMBERS), names, {})
        assert t.to_node != r.leader_node_id and now - r.changed_ms >= POLICY.hold_ms
    # Applying the plan leaves nothing to do: the policy converges in one step.
    moved = {t.broker_group: t.to_node for t in out}
    after = [rec(r.broker_group, moved.get(r.broker_group, r.leader_node_id), 0) for r in records]
    assert all(t.broker_group not in moved for t in plan(after, {}, {}, now + 10**6, POLICY))
