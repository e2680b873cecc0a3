"""The Raft core's rules one at a time, driven by hand (no simulator): each test feeds a RaftCore
messages and ticks and reads what its Ready says to persist and send."""

from __future__ import annotations

import pytest

from raftmq.raftlog.election import LogPosition, PreVoteReply, PreVoteRequest
from raftmq.raftlog.errors import NotLeaderError
from raftmq.raftlog.raft_core import PeerMode, RaftConfig, RaftCore, Role, TransferRefusedError
from raftmq.raftlog.raft_messages import (
    AppendEntries,
    AppendResponse,
    Entry,
    HardState,
    InstallSnapshot,
    Message,
    PreVote,
    PreVoteResponse,
    Ready,
    RequestVote,
    TimeoutNow,
    VoteResponse,
)

CFG = RaftConfig(election_ticks=10, heartbeat_ticks=1, max_inflight=2, max_entries_per_append=4)
MEMBERS = ("a", "b", "c")


def node(node_id: str = "a", **kwargs: object) -> RaftCore:
    return RaftCore(node_id, MEMBERS, CFG, seed=1, **kwargs)  # type: ignore[arg-type]


def flush(core: RaftCore) -> Ready:
    """The shell's turn: persist, send, apply, advance."""
    rd = core.ready()
    core.advance(rd)
    return rd


def sent(
    rd: Ready | tuple[Message, ...], kind: type[Message], to: str | None = None
) -> list[Message]:
    out = (*rd.leader_messages, *rd.messages) if isinstance(rd, Ready) else rd
    return [m for m in out if isinstance(m, kind) and (to is None or m.to == to)]


def entries(*terms: int) -> list[Entry]:
    return [Entry(f"e{i}".encode(), i, t) for i, t in enumerate(terms, start=1)]


def time_out(core: RaftCore) -> Ready:
    for _ in range(2 * CFG.election_ticks):
        core.tick()
    return flush(core)


def elect(core: RaftCore) -> Ready:
    """Make `core` leader with b's pre-vote and vote; returns the Ready of its first term."""
    pre = sent(time_out(core), PreVote, "b")[0]
    assert isinstance(pre, PreVote)
    core.step(PreVoteResponse("b", core.id, PreVoteReply("b", pre.request.round_id, True, 0)))
    flush(core)
    core.step(VoteResponse("b", core.id, core.term, True))
    assert core.role is Role.LEADER
    return flush(core)


def ack(core: RaftCore, sender: str, next_index: int) -> None:
    core.step(AppendResponse(sender, core.id, core.term, True, next_index, 0, True))


# ---- elections -------------------------------------------------------------------------------


def test_a_silent_follower_asks_for_pre_votes_without_raising_its_term() -> None:
    a = node(hard_state=HardState(term=4))
    rd = time_out(a)
    assert {m.to for m in sent(rd, PreVote)} == {"b", "c"}
    assert a.term == 4 and rd.hard_state is None and a.role is Role.PRE_CANDIDATE


def test_a_won_pre_vote_raises_the_term_and_its_ballots_leave_with_the_durable_vote() -> None:
    a = node(hard_state=HardState(term=4))
    pre = sent(time_out(a), PreVote, "b")[0]
    assert isinstance(pre, PreVote)
    a.step(PreVoteResponse("b", "a", PreVoteReply("b", pre.request.round_id, True, 4)))
    rd = flush(a)
    # The ballots ride in the Ready whose hard state (term 5, vote a) the shell persists first.
    assert rd.hard_state == HardState(term=5, vote="a", commit=0)
    assert {m.to for m in sent(rd, RequestVote)} == {"b", "c"}


def test_a_lagging_node_campaigns_at_the_term_its_pre_vote_round_asked_for() -> None:
    """Found by the simulator: campaigning at term + 1 instead lost every election to voters
    that had moved on, until a refusal taught the term."""
    a = node(hard_state=HardState(term=2))
    first = sent(time_out(a), PreVote, "b")[0]
    assert isinstance(first, PreVote) and first.request.term == 3
    a.step(PreVoteResponse("b", "a", PreVoteReply("b", first.request.round_id, False, 4)))
    second = sent(time_out(a), PreVote, "b")[0]
    assert isinstance(second, PreVote) and second.request.term == 5
    a.step(PreVoteResponse("b", "a", PreVoteReply("b", second.request.round_id, True, 4)))
    assert flush(a).hard_state == HardState(term=5, vote="a", commit=0)


def test_a_vote_goes_only_to_a_log_at_least_as_up_to_date_as_ours() -> None:
    b = node("b", hard_state=HardState(term=2), entries=entries(1, 2))
    b.step(RequestVote("a", "b", 3, LogPosition(1, 5), False))  # longer but older last term
    assert sent(flush(b), VoteResponse)[0] == VoteResponse("b", "a", 3, False)
    b.step(RequestVote("c", "b", 3, LogPosition(2, 2), False))
    assert sent(flush(b), VoteResponse)[0] == VoteResponse("b", "c", 3, True)


def test_one_vote_per_term_even_across_a_restart() -> None:
    b = node("b", hard_state=HardState(term=2))
    b.step(RequestVote("a", "b", 3, LogPosition(0, 0), False))
    rd = flush(b)
    assert rd.hard_state == HardState(term=3, vote="a", commit=0)
    b.step(RequestVote("c", "b", 3, LogPosition(0, 0), False))
    assert sent(flush(b), VoteResponse)[0] == VoteResponse("b", "c", 3, False)
    restarted = node("b", hard_state=rd.hard_state)
    restarted.step(RequestVote("c", "b", 3, LogPosition(0, 0), False))
    assert sent(flush(restarted), VoteResponse)[0] == VoteResponse("b", "c", 3, False)


def test_a_follower_hearing_its_leader_ignores_a_candidate_but_not_a_transfer() -> None:
    b = node("b", hard_state=HardState(term=2))
    b.step(AppendEntries("a", "b", 2, 0, 0, 0, ()))
    flush(b)
    b.step(RequestVote("c", "b", 3, LogPosition(0, 0), False))
    assert b.term == 2 and not sent(flush(b), VoteResponse)
    b.step(RequestVote("c", "b", 3, LogPosition(0, 0), True))
    assert sent(flush(b), VoteResponse)[0] == VoteResponse("b", "c", 3, True)


def follower_of_a(node_id: str = "b") -> RaftCore:
    core = node(node_id, hard_state=HardState(term=2))
    core.step(AppendEntries("a", node_id, 2, 0, 0, 0, ()))
    flush(core)
    return core


def ticks_to_pre_vote(core: RaftCore, limit: int = 4 * CFG.election_ticks) -> int | None:
    for k in range(1, limit + 1):
        core.tick()
        if sent(flush(core), PreVote):
            return k
    return None


def test_a_follower_told_its_leader_disconnected_campaigns_within_two_heartbeats() -> None:
    b = follower_of_a()
    b.peer_disconnected("a")
    waited = ticks_to_pre_vote(b)
    # Without the notice it waits a whole election timeout (>= election_ticks) after a's append.
    assert waited is not None and waited <= 2 * CFG.heartbeat_ticks


def test_after_its_leader_disconnected_a_follower_grants_votes_and_pre_votes() -> None:
    b = follower_of_a()
    b.peer_disconnected("a")
    b.step(PreVote("c", "b", PreVoteRequest("c", 1, 3, LogPosition(0, 0))))
    answer = sent(flush(b), PreVoteResponse)[0]
    assert isinstance(answer, PreVoteResponse) and answer.reply.granted
    b.step(RequestVote("c", "b", 3, LogPosition(0, 0), False))
    assert sent(flush(b), VoteResponse)[0] == VoteResponse("b", "c", 3, True)


def test_a_disconnect_of_a_peer_that_is_not_the_leader_changes_nothing() -> None:
    b = follower_of_a()
    b.peer_disconnected("c")
    assert ticks_to_pre_vote(b, CFG.election_ticks - 1) is None
    b.step(RequestVote("c", "b", 3, LogPosition(0, 0), False))
    assert b.term == 2 and not sent(flush(b), VoteResponse)


def test_a_leader_heard_again_after_a_disconnect_keeps_its_follower() -> None:
    b = follower_of_a()
    b.peer_disconnected("a")
    b.step(AppendEntries("a", "b", 2, 0, 0, 0, ()))  # it reconnected: a live leader
    flush(b)
    assert ticks_to_pre_vote(b, CFG.election_ticks - 1) is None
    assert b.role is Role.FOLLOWER and b.leader == "a"


def test_a_new_leader_appends_a_no_op_of_its_term_and_sends_it() -> None:
    a = node(hard_state=HardState(term=1), entries=entries(1))
    rd = elect(a)
    assert rd.entries == (Entry(b"", 2, 2),)
    assert all(m.entries[-1:] == (Entry(b"", 2, 2),) for m in sent(rd, AppendEntries))


def test_check_quorum_a_leader_hearing_no_majority_for_an_election_timeout_steps_down() -> None:
    a = node()
    elect(a)
    for _ in range(CFG.election_ticks - 1):
        a.tick()
        ack(a, "b", a.log.last_index + 1)
    a.tick()
    assert a.role is Role.LEADER  # b answered during the round
    for _ in range(CFG.election_ticks):
        a.tick()
    assert a.role is Role.FOLLOWER
    with pytest.raises(NotLeaderError):
        a.propose([b"x"])


# ---- commit ----------------------------------------------------------------------------------


def test_an_older_terms_entry_commits_only_with_one_of_the_current_term() -> None:
    a = node(hard_state=HardState(term=1), entries=entries(1))
    elect(a)  # term 2, no-op at index 2
    ack(a, "b", 2)  # b stores index 1 (term 1): a majority has it, yet it is not counted
    assert a.commit == 0
    ack(a, "b", 3)  # b stores the no-op of term 2
    assert a.commit == 2
    assert flush(a).committed == (Entry(b"e1", 1, 1), Entry(b"", 2, 2))


def test_the_leader_counts_itself_only_after_the_shell_reports_its_entries_durable() -> None:
    a = node()
    elect(a)
    ack(a, "b", 2)
    assert a.commit == 1
    first, _ = a.propose([b"p"])
    rd = a.ready()  # handed to the shell: the write (or its fdatasync) is under way
    ack(a, "b", first + 1)
    assert a.commit == 1  # b alone is not a majority while our own copy is not durable
    a.advance(rd)
    assert a.commit == first


# ---- replication -----------------------------------------------------------------------------


def test_a_follower_that_lost_acknowledged_entries_is_probed_from_where_its_log_ends() -> None:
    # ASYNC_FLUSH acknowledges before the fdatasync: a follower's power cut (a torn tail) or a
    # wiped disk loses entries it acknowledged. Without _lost_acknowledged its refusals look
    # stale to the leader (at or below the match) and it is never repaired.
    a = node(hard_state=HardState(term=1), entries=entries(1, 1, 1))
    elect(a)  # term 2, no-op at index 4
    ack(a, "b", 5)
    flush(a)
    assert a.progress["b"].match_index == 4
    # b restarts with only entries 1-2 and refuses the heartbeat at its old match.
    a.step(AppendResponse("b", "a", a.term, False, 3, 4, True))
    out = sent(flush(a), AppendEntries, "b")
    assert a.progress["b"].match_index == 2
    assert out and isinstance(out[-1], AppendEntries) and out[-1].prev_index == 2


def test_a_follower_rejects_a_conflicting_term_with_a_hint_past_the_whole_run() -> None:
    b = node("b", hard_state=HardState(term=3), entries=entries(1, 2, 2, 2))
    b.step(AppendEntries("a", "b", 4, 4, 3, 0, ()))
    reply = sent(flush(b), AppendResponse)[0]
    assert reply == AppendResponse("b", "a", 4, False, 2, 4, True)


def test_the_leader_resumes_at_the_hint_and_ignores_a_stale_rejection() -> None:
    a = node(hard_state=HardState(term=3), entries=entries(1, 3, 3, 3))
    elect(a)
    a.step(AppendResponse("b", "a", a.term, False, 2, 4, True))
    resend = sent(flush(a), AppendEntries, "b")
    assert isinstance(resend[0], AppendEntries) and resend[0].prev_index == 1
    ack(a, "b", 6)  # now replicating, all of it matched
    a.step(AppendResponse("b", "a", a.term, False, 2, 3, True))  # an old refusal, late
    assert a.progress["b"].match_index == 5 and a.progress["b"].mode is PeerMode.REPLICATE


def test_replication_keeps_at_most_max_inflight_appends_out_per_peer() -> None:
    a = node()
    elect(a)
    ack(a, "b", 2)  # b replicates from now on
    flush(a)
    out = 0
    for k in range(10):
        a.propose([f"p{k}".encode()])
        out += len(sent(flush(a), AppendEntries, "b"))
    assert out == CFG.max_inflight
    ack(a, "b", a.progress["b"].inflight[0] + 1)  # one answered: one more goes
    assert len(sent(flush(a), AppendEntries, "b")) == 1


def test_a_re_sent_append_never_truncates_newer_entries() -> None:
    b = node("b", hard_state=HardState(term=1), entries=entries(1, 1, 1))
    b.step(AppendEntries("a", "b", 1, 0, 0, 0, (Entry(b"e1", 1, 1),)))
    assert b.log.last_index == 3
    assert sent(flush(b), AppendResponse)[0] == AppendResponse("b", "a", 1, True, 2, 0, True)


# ---- leadership transfer and eligibility -----------------------------------------------------


def test_transfer_waits_for_the_target_to_catch_up_then_it_campaigns_without_pre_vote() -> None:
    a = node()
    elect(a)
    flush(a)
    assert a.transfer_leadership("c") == "c"
    assert not sent(flush(a), TimeoutNow)
    with pytest.raises(NotLeaderError):
        a.propose([b"x"])  # no new entries while handing over
    ack(a, "c", a.log.last_index + 1)
    timeout_now = sent(flush(a), TimeoutNow, "c")[0]
    c = node("c", hard_state=HardState(term=a.term))
    c.step(timeout_now)
    rd = flush(c)
    assert rd.hard_state == HardState(term=a.term + 1, vote="c", commit=0)
    assert all(isinstance(m, RequestVote) and m.transfer for m in rd.messages)
    assert len(rd.messages) == 2


def test_a_leader_whose_ready_is_stuck_still_hands_its_messages_out_once() -> None:
    """A full disk: the shell cannot persist the Ready it holds, so no second Ready comes;
    the heartbeats and the hand-off's TimeoutNow, which promise nothing about that disk, are
    taken without one (else the hand-off waited for an election), and never sent twice."""
    a = node()
    elect(a)
    ack(a, "c", a.log.last_index + 1)
    a.propose([b"p"])
    stuck = a.ready()  # its write keeps failing: never advanced in this test
    ack(a, "c", a.log.last_index + 1)
    a.transfer_leadership("c")
    a.tick()  # a heartbeat's worth of time
    out = a.take_leader_messages()
    assert sent(out, TimeoutNow, "c")
    assert sent(out, AppendEntries, "b")  # b keeps hearing its leader
    assert a.take_leader_messages() == ()
    assert stuck.leader_messages and not set(stuck.leader_messages) & set(out)


def test_a_node_not_eligible_never_campaigns_nor_takes_over() -> None:
    c = node("c")
    c.set_eligible(False)
    assert not time_out(c).messages and c.role is Role.FOLLOWER
    c.step(TimeoutNow("a", "c", 0))
    assert c.role is Role.FOLLOWER and c.term == 0


def test_the_leader_never_transfers_to_a_follower_that_said_it_cannot_lead() -> None:
    a = node()
    elect(a)
    a.step(AppendResponse("c", "a", a.term, True, 2, 0, False))
    with pytest.raises(TransferRefusedError, match="cannot lead"):
        a.transfer_leadership("c")
    ack(a, "b", 2)
    assert a.transfer_leadership(None) == "b"  # the automatic choice skips c too


# ---- retention and snapshots -----------------------------------------------------------------


def test_a_follower_behind_the_retention_cut_is_sent_the_snapshot_and_installs_it() -> None:
    a = node()
    elect(a)
    ack(a, "b", 2)
    a.propose([b"p2", b"p3"])
    flush(a)
    ack(a, "b", 4)
    flush(a)  # applied up to 3
    snap = a.compact(3, b"state@3")
    a.tick()  # the heartbeat re-probes c, which never answered: its next entry is cut away
    install = sent(flush(a), InstallSnapshot, "c")[0]
    assert isinstance(install, InstallSnapshot) and install.snapshot == snap
    a.tick()  # a heartbeat does not send a large snapshot again...
    assert not sent(flush(a), InstallSnapshot)
    for _ in range(CFG.snapshot_resend_ticks):  # ...only an answer that never came does
        a.tick()
        ack(a, "b", a.log.last_index + 1)  # b keeps the leader in office meanwhile
    assert sent(flush(a), InstallSnapshot, "c")
    c = node("c")
    c.step(install)
    rd = flush(c)
    assert rd.snapshot == snap and c.log.first_index == 4 and c.commit == 3
    assert sent(rd, AppendResponse)[0] == AppendResponse("c", "a", a.term, True, 4, 0, True)


def test_compaction_keeps_what_is_not_yet_applied() -> None:
    a = node()
    elect(a)
    with pytest.raises(ValueError, match="applied and durable"):
        a.compact(1, b"")


# ---- the Ready contract ----------------------------------------------------------------------


def test_a_second_ready_before_advance_is_refused() -> None:
    a = node()
    time_out(a)
    a.tick()
    a.ready()
    with pytest.raises(RuntimeError, match="advance"):
        a.ready()


def test_a_restart_whose_commit_lies_past_its_durable_log_is_refused() -> None:
    with pytest.raises(ValueError, match="past the durable log"):
        node(hard_state=HardState(term=1, commit=3), entries=entries(1, 1))
