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
    """Would you vote for me at `term`? Sent instead of request_vote when an election timer
    fires; `term` is the term the candidate's real election would use (nobody stores it)."""

    candidate: str
    round_id: int  # echoed in the reply, so answers to an older round are not counted
    term: int
    log: LogPosition


@dataclass(frozen=True, slots=True)
class PreVoteReply:
    voter: str
    round_id: int
    granted: bool
    term: int  # the voter's current term: a candidate refused for its term asks above it next


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
    """Yes only if (thesis 9.6) the candidate's log is at least as up-to-date as ours and we have
    not heard from a live leader within the minimum election timeout (a leader never grants: it
    is that live leader), and (etcd) its election would go above our term: a node that has not
    yet learned the group's term (just started, or back from a partition) is told the term
    instead of being let through to an election that would depose a leader it does not know."""
    heard_leader = voter.is_leader or (
        voter.leader_contact_age_s is not None
        and voter.leader_contact_age_s < voter.min_election_timeout_s
    )
    granted = not heard_leader and req.term > voter.term and req.log >= voter.log
    return PreVoteReply(voter.node_id, req.round_id, granted, voter.term)


def pre_vote_term(current_term: int, highest_term_heard: int) -> int:
    """The term a new round asks for: above this node's term and above every term the voters
    answered with in earlier rounds (so a candidate whose term lags can still win; its own term
    stays as it is until the real election)."""
    return max(current_term, highest_term_heard) + 1


@dataclass(slots=True)
class PreVoteRound:
    """A pre-candidate's count of one round. The candidate grants itself; `won` once a majority
    of the group (itself included) granted; answers of other rounds or strangers are ignored."""

    node_id: str
    round_id: int
    term: int  # the election term asked for (pre_vote_term)
    members: frozenset[str]  # the whole group, this node included
    granted: set[str] = field(default_factory=set)
    highest_term: int = 0  # the highest term a voter answered with

    def __post_init__(self) -> None:
        if self.node_id not in self.members:
            raise ValueError(f"{self.node_id} is not a member of {sorted(self.members)}")
        self.granted.add(self.node_id)

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


# ---- leadership transfer ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerView:
    """What the leader knows of one follower when it picks a transfer target."""

    node_id: str
    connected: bool
    match_index: int
    response_age_s: float  # since its last acknowledgement
    can_write: bool  # as the follower last reported (a full disk says no)


def cannot_take_over(p: PeerView, reachable_s: float) -> str | None:
    """Why this follower could not win an election now, or None if it could."""
    if not p.connected:
        return "not_connected"
    if p.response_age_s > reachable_s:
        return "not_answering"
    if not p.can_write:
        return "cannot_write"
    return None


def transfer_candidates(
    peers: Iterable[PeerView],
    last_index: int,
    reachable_s: float,
    tried: Mapping[str, float],
    in_flight_s: float,
    pass_over_s: float,
    now: float,
) -> list[str] | None:
    """Followers to hand leadership to, best first: connected, heard from within `reachable_s`,
    able to write, and not sent a TimeoutNow in the last `pass_over_s` (it did not take over).
    None while a TimeoutNow sent less than `in_flight_s` ago may still win: nobody else is
    asked then (two candidates at once split the vote); [] when no follower can take over.
    Caught-up ones come first (a TimeoutNow to a lagging one is refused: it would lose the
    election), then the most recently heard from, then the id (deterministic)."""
    if any(now - t < in_flight_s for t in tried.values()):
        return None
    able = [
        p
        for p in peers
        if cannot_take_over(p, reachable_s) is None
        and now - tried.get(p.node_id, float("-inf")) >= pass_over_s
    ]
    able.sort(
        key=lambda p: (p.match_index < last_index, -p.match_index, p.response_age_s, p.node_id)
    )
    return [p.node_id for p in able]
