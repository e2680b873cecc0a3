"""Who may start an election and who should take over: Raft's PreVote (thesis section 9.6) and the
choice of a leadership-transfer target, as values in, values out.

No sockets, threads or clocks here: pysyncobj_compat passes the time and the node's state in and
does the sends these functions name. Nothing in a pre-vote round changes a term or a vote: a
voter answers from what it knows, a pre-candidate only counts answers; a real election (which
does raise the term) starts only after a majority said it would vote.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, order=True)
class LogPosition:
    """The last entry of a log; Raft's "at least as up-to-date" is this tuple's order."""

    last_term: int
    last_index: int


@dataclass(frozen=True, slots=True)
class PreVoteRequest:
    """Would you vote for me? Sent instead of request_vote when an election timer fires."""

    candidate: str
    round_id: int  # echoed in the reply, so answers to an older round are not counted
    term: int  # the candidate's current term (its real election would use a higher one)
    log: LogPosition


@dataclass(frozen=True, slots=True)
class PreVoteReply:
    voter: str
    round_id: int
    granted: bool
    term: int  # the voter's current term: a won round's election goes above every term seen


@dataclass(frozen=True, slots=True)
class VoterState:
    """What a node knows when a pre-vote request arrives."""

    node_id: str
    term: int
    is_leader: bool
    log: LogPosition
    leader_contact_age_s: float | None  # since the last message from a leader; None: never
    min_election_timeout_s: float


def grant_pre_vote(voter: VoterState, req: PreVoteRequest) -> PreVoteReply:
    """The thesis' rule: yes only if the candidate's log is at least as up-to-date as ours and we
    have not heard from a live leader within the minimum election timeout (a leader never grants:
    it is that live leader). Terms do not enter the answer: a candidate whose term lags but whose
    log is current must still be able to win (its election then goes above the terms it heard)."""
    heard_leader = voter.is_leader or (
        voter.leader_contact_age_s is not None
        and voter.leader_contact_age_s < voter.min_election_timeout_s
    )
    granted = not heard_leader and req.log >= voter.log
    return PreVoteReply(voter.node_id, req.round_id, granted, voter.term)


@dataclass(slots=True)
class PreVoteRound:
    """A pre-candidate's count of one round. The candidate grants itself; `won` once a majority
    of the group (itself included) granted; answers of other rounds or strangers are ignored."""

    node_id: str
    round_id: int
    term: int
    members: frozenset[str]  # the whole group, this node included
    granted: set[str] = field(default_factory=set)
    highest_term: int = 0

    def __post_init__(self) -> None:
        if self.node_id not in self.members:
            raise ValueError(f"{self.node_id} is not a member of {sorted(self.members)}")
        self.granted.add(self.node_id)
        self.highest_term = max(self.highest_term, self.term)

    def request(self, log: LogPosition) -> PreVoteRequest:
        return PreVoteRequest(self.node_id, self.round_id, self.term, log)

    def on_reply(self, reply: PreVoteReply) -> bool:
        """Count one answer; True when this answer made the round won."""
        if reply.round_id != self.round_id or reply.voter not in self.members:
            return False
        was_won = self.won
        self.highest_term = max(self.highest_term, reply.term)
        if reply.granted:
            self.granted.add(reply.voter)
        return self.won and not was_won

    @property
    def won(self) -> bool:
        return 2 * len(self.granted) > len(self.members)

    @property
    def election_term(self) -> int:
        """The term a won round's election uses: above every term this round heard of, so a
        candidate whose term lagged is not refused for it by the voters who just said yes."""
        return self.highest_term + 1


# ---- leadership transfer ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerView:
    """What the leader knows of one follower when it picks a transfer target."""

    node_id: str
    connected: bool
    match_index: int
    response_age_s: float  # since its last acknowledgement
    can_write: bool  # as the follower last reported (a full disk says no)


def transfer_candidates(
    peers: Iterable[PeerView],
    last_index: int,
    reachable_s: float,
    tried: Mapping[str, float],
    retry_after_s: float,
    now: float,
) -> list[str]:
    """Followers that can take over, best first: connected, heard from within `reachable_s`,
    able to write, and not given a TimeoutNow in the last `retry_after_s` (it did not take over).
    The caught-up ones come first (a TimeoutNow is refused for a lagging one: it would lose the
    election); among equals the most recently heard from, then the id (deterministic)."""
    able = [
        p
        for p in peers
        if p.connected
        and p.can_write
        and p.response_age_s <= reachable_s
        and now - tried.get(p.node_id, float("-inf")) >= retry_after_s
    ]
    able.sort(
        key=lambda p: (p.match_index < last_index, -p.match_index, p.response_age_s, p.node_id)
    )
    return [p.node_id for p in able]
