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
    grant_pre_vote,
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


def ask(v: VoterState, log: tuple[int, int], term: int = 3) -> bool:
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
    ],
)
def test_grant_rule(v: VoterState, cand_log: tuple[int, int], granted: bool) -> None:
    assert ask(v, cand_log) is granted


def test_terms_do_not_enter_the_answer_and_the_election_goes_above_them() -> None:
    # a candidate whose term lags (it was partitioned) but whose log is current must win
    v = voter(term=9)
    assert ask(v, (1, 10), term=3)
    rnd = PreVoteRound("a", 7, 3, frozenset({"a", "b", "c"}))
    reply = grant_pre_vote(v, rnd.request(LogPosition(1, 10)))
    assert reply.term == 9 and rnd.on_reply(reply) and rnd.won
    assert rnd.election_term == 10


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
    assert rnd.election_term == 5
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
    rnd = PreVoteRound(cand.node_id, 5, cand.term, frozenset(v.node_id for v in nodes))
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
    assert rnd.term == cand.term
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
    heard = [v for i, v in enumerate(nodes) if i == c or reachable[i]]
    if not live and 2 * len(heard) > n and all(v.log <= cand.log for v in heard):
        assert rnd.won
    if rnd.won:
        # its election goes above every term it heard of, its own included
        assert rnd.election_term > max(r.term for r in [*replies, PreVoteReply("", 0, 0, 0)])
        assert rnd.election_term > cand.term


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
) -> list[str]:
    return transfer_candidates(
        peers, last_index=100, reachable_s=0.2, tried=tried or {}, retry_after_s=0.2, now=now
    )


def test_transfer_skips_followers_that_cannot_take_over() -> None:
    assert pick([peer("b"), peer("c", can_write=False)]) == ["b"]
    assert pick([peer("b", age=1.5), peer("c")]) == ["c"]  # b has not answered for 1.5 s
    assert pick([peer("b", connected=False), peer("c")]) == ["c"]
    assert pick([peer("b", can_write=False), peer("c", age=9)]) == []


def test_transfer_prefers_caught_up_then_recent_then_id() -> None:
    assert pick([peer("b", match=99), peer("c")]) == ["c", "b"]
    assert pick([peer("b", age=0.1), peer("c", age=0.01)]) == ["c", "b"]
    assert pick([peer("c"), peer("b")]) == ["b", "c"]


def test_transfer_passes_over_a_follower_that_did_not_take_over_then_retries_it() -> None:
    tried = {"b": 10.0}
    assert pick([peer("b"), peer("c")], tried, now=10.1) == ["c"]
    assert pick([peer("b"), peer("c")], {"b": 10.0, "c": 10.1}, now=10.15) == []
    assert pick([peer("b"), peer("c")], {"b": 10.0, "c": 10.1}, now=10.25) == ["b"]
