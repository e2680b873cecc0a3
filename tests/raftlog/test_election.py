"""PreVote and the transfer-target choice without sockets (raftlog/election.py): tables for the
rules, and Hypothesis over random groups: a pre-vote round changes no node's term, a node with a
stale log never wins, nor does a node cut off while a leader serves a majority."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.raftlog.election import (
    LogPosition,
    PeerView,
    PreVoteReply,
    PreVoteRound,
    VoterState,
    cannot_take_over,
    grant_pre_vote,
    pre_vote_term,
    transfer_candidates,
)

TIMEOUT_S = 0.2


def voter(
    log: tuple[int, int] = (1, 10),
    contact: float | None = None,
    leader: bool = False,
    term: int = 3,
) -> VoterState:
    return VoterState("b", term, leader, LogPosition(*log), contact, TIMEOUT_S)


def ask(v: VoterState, log: tuple[int, int], term: int = 4) -> bool:
    rnd = PreVoteRound("a", 1, term, frozenset({"a", "b", "c"}))
    return grant_pre_vote(v, rnd.request(LogPosition(*log))).granted


@pytest.mark.parametrize(
    ("v", "cand_log", "granted"),
    [
        (voter(), (1, 10), True),  # equal logs, no leader heard
        (voter(), (1, 11), True),
        (voter(), (2, 1), True),  # a higher last term beats a longer log
        (voter(), (1, 9), False),  # shorter log, same last term
        (voter(), (0, 50), False),  # older last term
        (voter(contact=0.05), (1, 10), False),  # a live leader spoke 50 ms ago
        (voter(contact=0.25), (1, 10), True),  # its leader went quiet beyond the timeout
        (voter(leader=True), (5, 99), False),  # the leader is the live leader
        (voter(term=4), (1, 10), False),  # its election would not go above our term
    ],
)
def test_grant_rule(v: VoterState, cand_log: tuple[int, int], granted: bool) -> None:
    assert ask(v, cand_log) is granted


def test_a_lagging_term_is_told_the_term_then_asks_above_it() -> None:
    # a node back from a partition (or just started) with a current log but an old term
    v = voter(term=9)
    rnd = PreVoteRound("a", 7, pre_vote_term(3, 0), frozenset({"a", "b", "c"}))
    reply = grant_pre_vote(v, rnd.request(LogPosition(1, 10)))
    assert not reply.granted and reply.term == 9
    assert not rnd.on_reply(reply) and rnd.highest_term == 9
    again = PreVoteRound("a", 8, pre_vote_term(3, rnd.highest_term), frozenset({"a", "b", "c"}))
    assert again.term == 10
    assert again.on_reply(grant_pre_vote(v, again.request(LogPosition(1, 10))))


def test_round_counts_majority_once_and_ignores_strangers_and_old_rounds() -> None:
    rnd = PreVoteRound("a", 2, 1, frozenset({"a", "b", "c", "d", "e"}))
    assert not rnd.won
    assert not rnd.on_reply(PreVoteReply("b", 1, True, 1))  # an older round
    assert not rnd.on_reply(PreVoteReply("x", 2, True, 1))  # not a member
    assert not rnd.on_reply(PreVoteReply("b", 2, True, 1))
    assert not rnd.on_reply(PreVoteReply("b", 2, True, 1))  # the same voter twice
    assert not rnd.on_reply(PreVoteReply("c", 2, False, 4))
    assert rnd.on_reply(PreVoteReply("d", 2, True, 1))  # a, b, d: 3 of 5
    assert not rnd.on_reply(PreVoteReply("e", 2, True, 1))  # already won: reported once
    assert rnd.highest_term == 4
    assert PreVoteRound("solo", 1, 0, frozenset({"solo"})).won


def test_a_candidate_outside_its_group_is_refused() -> None:
    with pytest.raises(ValueError, match="not a member"):
        PreVoteRound("z", 1, 1, frozenset({"a", "b"}))


@st.composite
def groups(draw: st.DrawFn) -> tuple[list[VoterState], list[bool], int, int]:
    """Random group: each node's term, log, leader contact; who can hear the candidate."""
    n = draw(st.sampled_from([1, 2, 3, 4, 5, 7]))
    leader = draw(st.one_of(st.none(), st.integers(0, n - 1)))
    nodes = []
    for i in range(n):
        term = draw(st.integers(0, 12))
        last_term = draw(st.integers(0, term))
        nodes.append(
            VoterState(
                node_id=f"n{i}",
                term=term,
                is_leader=i == leader,
                log=LogPosition(last_term, draw(st.integers(0, 30))),
                leader_contact_age_s=draw(st.one_of(st.none(), st.floats(0, 1.0, allow_nan=False))),
                min_election_timeout_s=TIMEOUT_S,
            )
        )
    reachable = [draw(st.booleans()) for _ in range(n)]
    candidate = draw(st.integers(0, n - 1).filter(lambda c: c != leader) if n > 1 else st.just(0))
    return nodes, reachable, candidate, draw(st.integers(0, 2**31))


def run_round(
    nodes: list[VoterState], reachable: list[bool], c: int, seed: int
) -> tuple[PreVoteRound, list[PreVoteReply]]:
    """One round as the wire would run it: every reachable node answers, in any order, with
    duplicates and an answer to an older round mixed in."""
    cand = nodes[c]
    rnd = PreVoteRound(
        cand.node_id, 5, pre_vote_term(cand.term, 0), frozenset(v.node_id for v in nodes)
    )
    req = rnd.request(cand.log)
    replies = [grant_pre_vote(v, req) for i, v in enumerate(nodes) if i != c and reachable[i]]
    rng = random.Random(seed)
    stream = replies + rng.sample(replies, k=len(replies) // 2)
    stream += [dataclasses.replace(r, round_id=4, granted=True) for r in replies[:1]]
    rng.shuffle(stream)
    for r in stream:
        rnd.on_reply(r)
    return rnd, replies


@settings(max_examples=400, deadline=None)
@given(groups())
def test_pre_vote_rounds_change_no_term_and_stale_or_cut_off_nodes_never_win(
    g: tuple[list[VoterState], list[bool], int, int],
) -> None:
    nodes, reachable, c, seed = g
    before = list(nodes)
    rnd, replies = run_round(nodes, reachable, c, seed)
    n, cand = len(nodes), nodes[c]

    # no pre-vote round changes any node's term (nor anything else a voter holds)
    assert nodes == before
    assert all(r.term == nodes[int(r.voter[1:])].term for r in replies)

    # a node whose log is behind a majority's (it lacks committed entries) never wins
    ahead = sum(1 for v in nodes if v.log > cand.log)
    if 2 * ahead >= n and ahead > 0:
        assert not rnd.won
    # nor does a node that a majority of the group refuses because their leader is alive
    live = [
        v
        for v in nodes
        if v.is_leader
        or (v.leader_contact_age_s is not None and v.leader_contact_age_s < TIMEOUT_S)
    ]
    if 2 * len(live) >= n and cand not in live:
        assert not rnd.won
    # liveness: with no live leader around, the most up-to-date node that hears a majority wins
    # nor does a node whose election would not go above a majority's terms
    higher = sum(1 for v in nodes if v.term >= rnd.term)
    if 2 * higher >= n and higher > 0:
        assert not rnd.won
    # liveness: with no live leader around, the most up-to-date node that hears a majority wins
    heard = [v for i, v in enumerate(nodes) if i == c or reachable[i]]
    if (
        not live
        and 2 * len(heard) > n
        and all(v.log <= cand.log and v.term <= cand.term for v in heard)
    ):
        assert rnd.won
    if rnd.won:
        # its election goes above the terms of every node that said yes, its own included
        granting = [nodes[int(r.voter[1:])] for r in replies if r.granted]
        assert all(rnd.term > v.term for v in [cand, *granting])


# ---- transfer target -----------------------------------------------------------------------------


def peer(
    node_id: str,
    match: int = 100,
    age: float = 0.05,
    can_write: bool = True,
    connected: bool = True,
) -> PeerView:
    return PeerView(node_id, connected, match, age, can_write)


def pick(
    peers: list[PeerView], tried: dict[str, float] | None = None, now: float = 10.0
) -> list[str] | None:
    return transfer_candidates(
        peers,
        last_index=100,
        reachable_s=0.2,
        tried=tried or {},
        in_flight_s=0.2,
        pass_over_s=1.0,
        now=now,
    )


def test_transfer_skips_followers_that_cannot_take_over() -> None:
    assert pick([peer("b"), peer("c", can_write=False)]) == ["b"]
    assert pick([peer("b", age=1.5), peer("c")]) == ["c"]  # b has not answered for 1.5 s
    assert pick([peer("b", connected=False), peer("c")]) == ["c"]
    assert pick([peer("b", can_write=False), peer("c", age=9)]) == []
    assert cannot_take_over(peer("b", can_write=False), 0.2) == "cannot_write"
    assert cannot_take_over(peer("b", age=0.3), 0.2) == "not_answering"
    assert cannot_take_over(peer("b", connected=False), 0.2) == "not_connected"
    assert cannot_take_over(peer("b"), 0.2) is None


def test_transfer_prefers_caught_up_then_recent_then_id() -> None:
    assert pick([peer("b", match=99), peer("c")]) == ["c", "b"]
    assert pick([peer("b", age=0.1), peer("c", age=0.01)]) == ["c", "b"]
    assert pick([peer("c"), peer("b")]) == ["b", "c"]


def test_transfer_waits_for_one_in_flight_then_passes_it_over_then_retries_it() -> None:
    both = [peer("b"), peer("c")]
    assert pick(both, {"b": 10.0}, now=10.1) is None  # b may still be winning its election
    assert pick(both, {"b": 10.0}, now=10.25) == ["c"]  # b did not take over: next one
    assert pick(both, {"b": 10.0, "c": 10.25}, now=10.5) == []  # both passed over: give up
    assert pick(both, {"b": 10.0, "c": 10.25}, now=11.3) == ["b", "c"]
