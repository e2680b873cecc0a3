"""The controller's state machine: fencing by term, one leader per term, epochs counting
accepted leader changes; the same commands give the same records on every replica."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from raftmq.controller.state import CommandError, ControllerState, RoleReport, decode


def rep(node: str, term: int, leader: bool = True, group: str = "broker-a") -> RoleReport:
    return RoleReport(group, node, f"{node}:1", term, leader, now_ms=1000 + term)


def test_leader_changes_fencing_and_epochs() -> None:
    s = ControllerState()
    v = s.apply(rep("n0", 1))
    assert v.accepted and v.changed and (v.leader_node_id, v.term, v.epoch) == ("n0", 1, 1)
    assert s.apply(rep("n0", 1)).changed is False, "the same report twice changes nothing"
    v = s.apply(rep("n1", 1))
    assert not v.accepted and "already has leader n0" in v.reason
    v = s.apply(rep("n1", 3))
    assert v.changed and (v.leader_node_id, v.term, v.epoch) == ("n1", 3, 2)
    v = s.apply(rep("n0", 2))
    assert not v.accepted and "stale term 2" in v.reason, "a deposed leader is fenced off"
    assert s.groups["broker-a"].leader_node_id == "n1"
    assert s.groups["broker-a"].leader_address == "n1:1"
    assert s.apply(rep("n2", 3, leader=False)).accepted
    assert s.groups["broker-a"].members == {"n0": "n0:1", "n1": "n1:1", "n2": "n2:1"}


def test_commands_round_trip_and_garbage_is_refused() -> None:
    r = rep("n0", 7)
    assert decode(r.encode()) == r
    for bad in (b"", b"{}", b'{"op":"drop"}', b'{"op":"report","group":"g"}', b"\xff"):
        with pytest.raises(CommandError):
            decode(bad)


class Replicas(RuleBasedStateMachine):
    """Two replicas fed the same commands agree; terms never go back; epochs count changes."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = ControllerState(), ControllerState()
        self.terms: dict[str, int] = {}
        self.changes: dict[str, int] = {}

    @rule(
        group=st.sampled_from(["g1", "g2"]),
        node=st.sampled_from(["n0", "n1", "n2"]),
        term=st.integers(0, 8),
        leader=st.booleans(),
    )
    def report(self, group: str, node: str, term: int, leader: bool) -> None:
        r = rep(node, term, leader, group)
        before = self.a.groups.get(group)
        old_term = before.term if before else 0
        old_leader = before.leader_node_id if before else ""
        va, vb = self.a.apply(r), self.b.apply(r)
        assert va == vb
        if term < old_term:
            assert not va.accepted and va.leader_node_id == old_leader
        if va.changed:
            self.changes[group] = self.changes.get(group, 0) + 1
            assert leader and term >= old_term
        self.terms[group] = max(self.terms.get(group, 0), va.term)

    @invariant()
    def agree_and_count(self) -> None:
        assert {k: (g.leader_node_id, g.term, g.epoch) for k, g in self.a.groups.items()} == {
            k: (g.leader_node_id, g.term, g.epoch) for k, g in self.b.groups.items()
        }
        for k, g in self.a.groups.items():
            assert g.term == self.terms.get(k, 0), "the recorded term never decreases"
            assert g.epoch == self.changes.get(k, 0)


TestReplicas = Replicas.TestCase


@settings(max_examples=200, deadline=None)
@given(
    reports=st.lists(
        st.tuples(
            st.sampled_from(["g1", "g2"]),
            st.sampled_from(["n0", "n1", "n2"]),
            st.sampled_from(["a:1", "b:1"]),
            st.integers(0, 5),
            st.booleans(),
        ),
        max_size=40,
    )
)
def test_unchanged_verdict_is_apply_without_a_change(
    reports: list[tuple[str, str, str, int, bool]],
) -> None:
    """A heartbeat's re-report answered without committing gets exactly the verdict applying it
    would have given, and applying it would indeed have changed nothing."""
    s = ControllerState()
    for group, node, address, term, leader in reports:
        r = RoleReport(group, node, address, term, leader, now_ms=term)
        before = copy.deepcopy(s.groups)
        same = s.unchanged_verdict(r)
        v = s.apply(r)
        if same is not None:
            assert same == v and not v.changed
            assert s.groups == before
