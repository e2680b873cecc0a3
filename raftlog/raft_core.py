"""The Raft state machine of one node, in etcd-raft's RawNode style: `step` (a message), `tick` (one
unit of time passed in) and `propose` go in; `ready()` hands out what to persist, send and apply.

Never any I/O, clock, thread or randomness it was not given (its jitter comes from a seeded
Random). Each safety rule lives in one small method named for it, so a test can remove one rule in a
subclass and watch the simulator (tests/raftlog/raft_sim.py) catch the bug.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from mypy_extensions import mypyc_attr

from raftmq.raftlog.election import (
    LogPosition,
    PeerView,
    PreVoteReply,
    PreVoteRequest,
    PreVoteRound,
    VoterState,
    grant_pre_vote,
    pre_vote_term,
    transfer_candidates,
)
from raftmq.raftlog.errors import CorruptJournalError, NotLeaderError, RaftLogError
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
from raftmq.raftlog.replication import Ack, AppendRequest, Progress, follower_append, leader_on_ack
from raftmq.raftlog.snapshot import Snapshot

NO_OP = b""  # a new leader's first entry: committing it commits every earlier entry


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class PeerMode(enum.Enum):
    PROBE = "probe"  # one append (or snapshot) out at a time until the follower's end is found
    REPLICATE = "replicate"  # appends streamed ahead of acknowledgements, up to max_inflight
    SNAPSHOT = "snapshot"  # a snapshot is out: wait for its answer, resend it only if none comes


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Timing in ticks (the shell calls tick() every tick_ms); bounds per peer."""

    election_ticks: int = (
        10  # a follower campaigns after [election_ticks, 2*election_ticks) of silence
    )
    heartbeat_ticks: int = 1
    tick_ms: int = 100  # what one tick is worth (election.py's rules take seconds)
    max_inflight: int = 8  # appends in flight per peer in REPLICATE mode
    max_entries_per_append: int = 64
    snapshot_resend_ticks: int = 20  # a snapshot is large: ask again only after this long
    max_committed_per_ready: int = 1024  # entries handed to apply in one Ready
    # A leader that heard from no majority for this long steps down; 0 = election_ticks. Longer
    # rides out a peer restarting (pysyncobj's leaderFallbackTimeout: 1.5 s in the broker).
    check_quorum: int = 0

    @property
    def check_quorum_ticks(self) -> int:
        return self.check_quorum or self.election_ticks

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_ticks < self.election_ticks:
            raise ValueError("heartbeat_ticks must be positive and below election_ticks")
        if min(self.max_inflight, self.max_entries_per_append, self.max_committed_per_ready) < 1:
            raise ValueError(
                "max_inflight, max_entries_per_append and max_committed_per_ready must be >= 1"
            )


class TransferRefusedError(RaftLogError):
    """A leadership transfer cannot start: the reason says what to fix first. cannot_write: the
    target said it cannot lead (waiting will not help)."""

    def __init__(self, reason: str, *, cannot_write: bool = False) -> None:
        super().__init__(reason)
        self.cannot_write = cannot_write


@dataclass(slots=True)
class PeerProgress:
    """The leader's view of one follower (etcd's Progress)."""

    match_index: int
    next_index: int
    mode: PeerMode = PeerMode.PROBE
    paused: bool = False  # PROBE: an append is out; wait for its answer or the next heartbeat
    inflight: deque[int] = field(default_factory=deque)  # last index of each append in flight
    recent_active: bool = True  # heard from since the last check-quorum round
    eligible: bool = True  # as the follower last said
    match_at_heartbeat: int = 0  # match_index at the previous heartbeat (a stalled pipeline)
    heard_ticks: int = 0  # ticks since its last answer
    snapshot_ticks: int = 0  # SNAPSHOT: ticks since the snapshot left


class LogStorage(Protocol):
    """The stable part of a node's log, as the shell wrote it (Ready.entries): the core only
    reads it, for indexes above its base and below its in-memory tail. The broker's is the
    segment journal (raft_storage.JournalStorage); the simulator's is its Disk."""

    @property
    def last_index(self) -> int: ...

    def term(self, index: int) -> int:
        """The term of a stored entry (IndexError if it is not stored)."""
        ...

    def slice(self, lo: int, hi: int) -> Sequence[Entry]:
        """Stored entries with lo <= index < hi, all of them stored."""
        ...


class RaftLog:
    """The node's log: a base (a snapshot's index and term, or 0/0), the stable entries after it
    in a LogStorage (read only) and an in-memory tail from `_offset` on (entries not yet
    confirmed durable by advance(), which then drops them). Without a storage the tail keeps
    every entry (tests, and a core driven without a disk). Implements replication.LogView."""

    def __init__(
        self,
        base_index: int,
        base_term: int,
        entries: Sequence[Entry],
        storage: LogStorage | None = None,
    ) -> None:
        self.base_index = base_index
        self.base_term = base_term
        self._storage = storage
        if storage is not None and entries:
            raise ValueError("entries come from the storage when one is given")
        # Indexes below _offset (and above the base) are read from the storage.
        self._offset = (
            base_index + 1 if storage is None else max(storage.last_index, base_index) + 1
        )
        self._tail: list[Entry] = list(entries)
        for k, e in enumerate(self._tail):
            if e.index != base_index + 1 + k:
                raise ValueError(f"entry {k} has index {e.index}, expected {base_index + 1 + k}")

    @property
    def first_index(self) -> int:
        return self.base_index + 1

    @property
    def last_index(self) -> int:
        return self._offset - 1 + len(self._tail)

    @property
    def last_position(self) -> LogPosition:
        return LogPosition(self.term_at(self.last_index), self.last_index)

    def term_at(self, index: int) -> int:
        if index == self.base_index:
            return self.base_term
        if not self.base_index < index <= self.last_index:
            raise IndexError(index)
        if index >= self._offset:
            return self._tail[index - self._offset].term
        assert self._storage is not None  # without one, _offset is base_index + 1
        return self._storage.term(index)

    def entries(self, lo: int, hi: int) -> list[Entry]:
        """Entries with lo <= index < hi (both within the log)."""
        lo = max(lo, self.base_index + 1)
        hi = min(hi, self.last_index + 1)
        if lo >= hi:
            return []
        out: list[Entry] = []
        if lo < self._offset:
            assert self._storage is not None
            out.extend(self._storage.slice(lo, min(hi, self._offset)))
            lo = self._offset
        if lo < hi:
            out.extend(self._tail[lo - self._offset : hi - self._offset])
        return out

    def append(self, entries: Sequence[Entry]) -> None:
        """Add entries starting at most one past the end; anything at or above the first one's
        index is replaced (the caller decided it conflicts)."""
        if not entries:
            return
        start = entries[0].index
        if not self.base_index < start <= self.last_index + 1:
            raise ValueError(
                f"append at {start} outside ({self.base_index}, {self.last_index + 1}]"
            )
        if start >= self._offset:
            del self._tail[start - self._offset :]
            self._tail.extend(entries)
        else:  # replaces stable entries: they stay stored but are shadowed until rewritten
            self._tail = list(entries)
            self._offset = start

    def stable_to(self, index: int, term: int) -> None:
        """The shell made entries up to (index, term) durable: with a storage, the tail drops
        them (it reads them from there). Ignored if the entry was replaced meanwhile."""
        if self._storage is None or not self._offset <= index <= self.last_index:
            return
        if self._tail[index - self._offset].term != term:
            return
        del self._tail[: index - self._offset + 1]
        self._offset = index + 1

    def compact(self, index: int) -> None:
        """Drop entries up to `index`, which becomes the base."""
        term = self.term_at(index)
        if index >= self._offset:
            del self._tail[: index - self._offset + 1]
            self._offset = index + 1
        self.base_index, self.base_term = index, term

    def reset(self, base_index: int, base_term: int) -> None:
        self._tail.clear()
        self._offset = base_index + 1
        self.base_index, self.base_term = base_index, base_term


# The simulator's tests subclass it with a rule removed (tests/raftlog/test_raft_sim.py); mypyc
# refuses interpreted subclasses of a compiled class unless told.
@mypyc_attr(allow_interpreted_subclasses=True)
class RaftCore:
    """One node of a Raft group. Construct it from what the node made durable (a restart
    passes its hard state, snapshot and log back); then feed it and drain ready().

    Between ready() and advance() the shell may keep stepping, ticking and proposing (it may be
    waiting on fdatasync); it must not call ready() again before advance()."""

    def __init__(
        self,
        node_id: str,
        members: Iterable[str],
        config: RaftConfig,
        *,
        seed: int,
        hard_state: HardState | None = None,
        snapshot: Snapshot | None = None,
        entries: Sequence[Entry] = (),
        storage: LogStorage | None = None,
        base: tuple[int, int] = (0, 0),
        applied_index: int | None = None,
        apply_payloads: bool = True,
    ) -> None:
        self.id = node_id
        # False: Ready.committed carries (index, term) with empty data, for a shell whose state
        # machine reads the log itself (the broker's dispatcher does).
        self.apply_payloads = apply_payloads
        self.members = frozenset(members)
        if node_id not in self.members:
            raise ValueError(f"{node_id} is not among the members {sorted(self.members)}")
        self.peers = sorted(self.members - {node_id})
        self.config = config
        self._rng = random.Random(seed)
        hs = hard_state or HardState()
        self.term = hs.term
        self.vote = hs.vote
        self.snapshot = snapshot
        # `base`: where a storage cut by retention starts when no snapshot is kept.
        base = (snapshot.base_index, snapshot.base_term) if snapshot else base
        self.log = RaftLog(*base, entries, storage)
        if hs.commit > self.log.last_index:
            raise ValueError(
                f"hard state commit {hs.commit} is past the durable log's end {self.log.last_index}"
            )
        # What the state machine applied is committed, whatever the (lazily kept) hard state says.
        self.applied = self.log.base_index if applied_index is None else applied_index
        if not self.log.base_index <= self.applied <= self.log.last_index:
            raise ValueError(
                f"applied index {self.applied} outside the durable log "
                f"[{self.log.base_index}, {self.log.last_index}]"
            )
        self.commit = max(hs.commit, self.applied)
        self.role = Role.FOLLOWER
        self.leader: str | None = None
        self.eligible = True
        # What the shell has made durable, and what it has been handed but not yet confirmed.
        self._durable_hs = HardState(self.term, self.vote, hs.commit)
        self.durable_index = self.log.last_index
        self._unstable_from = self.log.last_index + 1
        self._pending_snapshot: Snapshot | None = None
        self._msgs: list[Message] = []
        self._leader_msgs: list[Message] = []  # promise nothing of our disk: may leave at once
        self._awaiting_advance = False
        # Timers, in ticks.
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._leader_contact_ticks: int | None = None  # None: no leader heard since start
        self._randomized_timeout = self._new_timeout()
        # Elections.
        self._pre_vote_round: PreVoteRound | None = None
        self._round_seq = 0
        self._highest_term_heard = 0
        self._votes: dict[str, bool] = {}
        # Leader only.
        self.progress: dict[str, PeerProgress] = {}
        self.transfer_target: str | None = None
        self._transfer_elapsed = 0
        # The shell's: told when a stored entry a peer needs cannot be read (it logs, repairs).
        self.on_unreadable: Callable[[str, CorruptJournalError], None] | None = None

    # ---- the shell's interface -------------------------------------------------------------

    @property
    def quorum(self) -> int:
        return len(self.members) // 2 + 1

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.commit)

    @property
    def durable_hard_state(self) -> HardState:
        """The hard state of the last Ready the shell confirmed with advance()."""
        return self._durable_hs

    def set_eligible(self, eligible: bool) -> None:
        """The shell's word on whether this node may lead (False: unrepaired storage corruption,
        a full disk). A node not eligible never starts an election nor takes a transfer; one
        campaigning stops (a leader stays: the shell hands leadership over)."""
        self.eligible = eligible
        if not eligible and self.role in (Role.PRE_CANDIDATE, Role.CANDIDATE):
            self._become_follower(self.term, None)

    def propose(self, payloads: Sequence[bytes]) -> tuple[int, int]:
        """Append payloads as entries of the current term; returns (first_index, term). Raises
        NotLeaderError on a follower and while a leadership transfer is under way."""
        if self.role is not Role.LEADER or self.transfer_target is not None:
            raise NotLeaderError(self.id, None if self.role is Role.LEADER else self.leader)
        first = self.log.last_index + 1
        self.log.append([Entry(p, first + k, self.term) for k, p in enumerate(payloads)])
        self._maybe_commit()  # a group of one
        self._broadcast_append()
        return first, self.term

    def tick(self) -> None:
        """One tick of time passed."""
        if self.role is Role.LEADER:
            self._tick_leader()
            return
        self._election_elapsed += 1
        if self._leader_contact_ticks is not None:
            self._leader_contact_ticks += 1
        if self._election_elapsed >= self._randomized_timeout:
            self._election_elapsed = 0
            self._randomized_timeout = self._new_timeout()
            if self.role is Role.FOLLOWER:
                self.leader = None  # not heard for an election timeout: do not name it any more
            if self.eligible:
                self._start_pre_vote()
            elif self.role is not Role.FOLLOWER:
                self._become_follower(self.term, None)

    def peer_disconnected(self, peer: str) -> None:
        """The shell's word that the connection from `peer` closed: its process died (the
        kernel closed its sockets) or something reset it. When `peer` is the leader this node
        follows, its lease ends now instead of an election timeout after its last message: this
        node grants PreVotes and votes at once, and campaigns itself after one to two heartbeat
        intervals unless the leader is heard again first (a live leader reconnects and sends its
        heartbeat within one). Only timing changes, so safety does not rest on it; a reset while
        the leader lives costs at most an election, the same as a lost heartbeat would."""
        if self.role is not Role.FOLLOWER or self.leader != peer:
            return
        self._leader_contact_ticks = self.config.election_ticks  # out of lease
        hb = self.config.heartbeat_ticks
        wait = hb + self._rng.randrange(hb + 1)  # randomized: both followers notice at once
        self._election_elapsed = max(self._election_elapsed, self._randomized_timeout - wait)

    def step(self, m: Message) -> None:
        """Take one message addressed to this node."""
        if isinstance(m, PreVote):
            self._on_pre_vote(m)
            return
        if isinstance(m, PreVoteResponse):
            self._on_pre_vote_response(m)
            return
        if m.term > self.term:
            if isinstance(m, RequestVote) and not m.transfer and self._in_lease():
                return  # a live leader is heard: this candidate would only disrupt it
            leader = m.sender if isinstance(m, AppendEntries | InstallSnapshot) else None
            self._become_follower(m.term, leader)
        elif m.term < self.term:
            # Tell a stale sender the term (a deposed leader steps down on it); never act on it.
            if isinstance(m, AppendEntries | InstallSnapshot):
                self._send(
                    self._reject(m.sender, m.prev_index if isinstance(m, AppendEntries) else 0)
                )
            elif isinstance(m, RequestVote):
                self._send(VoteResponse(self.id, m.sender, self.term, False))
            return
        if isinstance(m, AppendEntries):
            self._on_append(m)
        elif isinstance(m, AppendResponse):
            self._on_append_response(m)
        elif isinstance(m, InstallSnapshot):
            self._on_snapshot(m)
        elif isinstance(m, RequestVote):
            self._on_request_vote(m)
        elif isinstance(m, VoteResponse):
            self._on_vote_response(m)
        else:
            self._on_timeout_now(m)

    def has_ready(self) -> bool:
        d = self._durable_hs
        return (
            bool(self._msgs)
            or bool(self._leader_msgs)
            or self.term != d.term
            or self.vote != d.vote
            or self.commit != d.commit
            or self._pending_snapshot is not None
            or self._unstable_from <= self.log.last_index
            or self.applied < self.commit
        )

    def ready(self) -> Ready:
        if self._awaiting_advance:
            raise RuntimeError("ready() called again before advance() of the previous Ready")
        hs = self.hard_state()
        entries = tuple(self.log.entries(self._unstable_from, self.log.last_index + 1))
        # Bounded: after a restart the whole journal may be committed but not yet applied.
        apply_to = min(self.commit, self.applied + self.config.max_committed_per_ready)
        if self.apply_payloads:
            committed = tuple(self.log.entries(self.applied + 1, apply_to + 1))
        else:  # positions only: nothing read back from the storage (terms are in memory)
            committed = tuple(
                Entry(b"", i, self.log.term_at(i)) for i in range(self.applied + 1, apply_to + 1)
            )
        rd = Ready(
            hard_state=hs if hs != self._durable_hs else None,
            snapshot=self._pending_snapshot,
            entries=entries,
            messages=tuple(self._msgs),
            leader_messages=tuple(self._leader_msgs),
            committed=committed,
        )
        self._msgs = []
        self._leader_msgs = []
        self._pending_snapshot = None
        self._unstable_from = self.log.last_index + 1
        self.applied = apply_to
        self._awaiting_advance = True
        return rd

    def take_leader_messages(self) -> tuple[Message, ...]:
        """The leader's messages queued since the last Ready (appends, snapshots, TimeoutNow).
        They promise nothing about this node's disk, so a shell whose Ready is stuck on a
        failing persist sends them without waiting for the next Ready: its heartbeats and its
        hand-off's TimeoutNow leave while the other messages wait for the disk."""
        msgs, self._leader_msgs = tuple(self._leader_msgs), []
        return msgs

    def advance(self, rd: Ready) -> None:
        """The shell persisted `rd` (and sent its messages)."""
        self._awaiting_advance = False
        if rd.hard_state is not None:
            self._durable_hs = rd.hard_state
        if rd.snapshot is not None and rd.snapshot.base_index >= self.log.base_index:
            self.durable_index = max(self.durable_index, rd.snapshot.base_index)
        if rd.entries:
            last = rd.entries[-1]
            # Only if nothing replaced them meanwhile (a truncation lowered durable_index).
            if self.log.base_index <= last.index <= self.log.last_index and (
                self.log.term_at(last.index) == last.term
            ):
                self.durable_index = max(self.durable_index, last.index)
                self.log.stable_to(last.index, last.term)
        if self.role is Role.LEADER:
            self._maybe_commit()  # our own persist counts toward commit only now

    def compact(self, up_to_index: int, snapshot_data: bytes) -> Snapshot:
        """The retention cut: drop entries up to `up_to_index` (applied and durable), keeping
        `snapshot_data` (the state machine's state after it) to catch up followers behind it."""
        if not self.log.base_index <= up_to_index <= min(self.applied, self.durable_index):
            raise ValueError(
                f"compact up to {up_to_index}: must lie in [{self.log.base_index}, "
                f"{min(self.applied, self.durable_index)}] (applied and durable)"
            )
        snap = Snapshot(up_to_index, self.log.term_at(up_to_index), snapshot_data)
        self.log.compact(up_to_index)
        self.snapshot = snap
        return snap

    def transfer_leadership(self, target: str | None = None) -> str:
        """Hand leadership to `target` (None: the best follower, election.py's choice). New
        proposals are refused until it took over or an election timeout passed. Returns the
        target."""
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.id, self.leader)
        if target is None:
            views = [
                PeerView(
                    p,
                    # recent_active is cleared at each check-quorum round: a peer heard
                    # within an election timeout is connected whatever the round says.
                    connected=pr.recent_active or pr.heard_ticks < self.config.election_ticks,
                    match_index=pr.match_index,
                    response_age_s=self._ticks_to_s(pr.heard_ticks),
                    can_write=pr.eligible,
                )
                for p, pr in self.progress.items()
            ]
            reach_s = self._ticks_to_s(self.config.election_ticks)
            best = transfer_candidates(views, self.log.last_index, reach_s, {}, 0.0, 0.0, 0.0)
            if not best:
                raise TransferRefusedError(
                    "no follower can take over (none answering and able to write)"
                )
            target = best[0]
        pr = self.progress.get(target)
        if pr is None:
            raise TransferRefusedError(f"{target} is not a follower of this group")
        if not pr.eligible:
            raise TransferRefusedError(
                f"{target} said it cannot lead (storage); repair it first", cannot_write=True
            )
        self.transfer_target = target
        self._transfer_elapsed = 0
        self._maybe_send_timeout_now()
        return target

    # ---- the rules, one method each (tests remove one in a subclass) -----------------------

    def _candidate_log_ok(self, candidate: LogPosition) -> bool:
        """Vote only for a log at least as up-to-date as ours (Raft 5.4.1)."""
        return candidate >= self.log.last_position

    def _may_commit(self, index: int) -> bool:
        """A leader commits by counting replicas only entries of its own term (Raft 5.4.2)."""
        return self.log.term_at(index) == self.term

    def _grant_pre_vote(self, req: PreVoteRequest) -> PreVoteReply:
        """election.py's PreVote rule, from this node's state."""
        contact = self._leader_contact_ticks
        voter = VoterState(
            node_id=self.id,
            term=self.term,
            is_leader=self.role is Role.LEADER,
            log=self.log.last_position,
            leader_contact_age_s=None if contact is None else self._ticks_to_s(contact),
            min_election_timeout_s=self._ticks_to_s(self.config.election_ticks),
        )
        return grant_pre_vote(voter, req)

    def _lost_acknowledged(self, pr: PeerProgress, m: AppendResponse) -> bool:
        """The follower refused an append at or above what it acknowledged and says its log
        ends below that: it lost acknowledged entries (ASYNC_FLUSH acks before the fdatasync,
        so a power cut or a torn tail loses them; or its disk was wiped). Its match goes down
        and it is probed from where its log ends; commit never goes down. A delayed refusal
        can look the same: it costs a re-probe, never safety."""
        return m.rejected_prev >= pr.match_index > 0 and m.next_index <= pr.match_index

    def _self_match(self) -> int:
        """What the leader counts for itself: only what the shell reported durable."""
        return self.durable_index

    # ---- elections ----------------------------------------------------------------------

    def _in_lease(self) -> bool:
        """A leader is live as far as we know (we are it, or heard it within a timeout)."""
        if self.role is Role.LEADER:
            return True
        contact = self._leader_contact_ticks
        return (
            self.leader is not None and contact is not None and contact < self.config.election_ticks
        )

    def _start_pre_vote(self) -> None:
        self._round_seq += 1
        self.role = Role.PRE_CANDIDATE
        self._pre_vote_round = PreVoteRound(
            self.id,
            self._round_seq,
            pre_vote_term(self.term, self._highest_term_heard),
            self.members,
        )
        if self._pre_vote_round.won:  # a group of one
            self._campaign(self._pre_vote_round.term, transfer=False)
            return
        req = self._pre_vote_round.request(self.log.last_position)
        for p in self.peers:
            self._send(PreVote(self.id, p, req))

    def _on_pre_vote(self, m: PreVote) -> None:
        self._send(PreVoteResponse(self.id, m.sender, self._grant_pre_vote(m.request)))

    def _on_pre_vote_response(self, m: PreVoteResponse) -> None:
        self._highest_term_heard = max(self._highest_term_heard, m.reply.term)
        rnd = self._pre_vote_round
        if self.role is Role.PRE_CANDIDATE and rnd is not None and rnd.on_reply(m.reply):
            self._campaign(rnd.term, transfer=False)

    def _campaign(self, term: int, *, transfer: bool) -> None:
        """A real election at `term` (the one the pre-vote round won, above every term its
        voters answered with), voting for ourselves. The ballots leave in the next Ready, after
        its hard state (this term and vote) is durable."""
        self.role = Role.CANDIDATE
        self.term = term
        self.vote = self.id
        self.leader = None
        self._pre_vote_round = None
        self._votes = {self.id: True}
        self._election_elapsed = 0
        self._randomized_timeout = self._new_timeout()
        if self._count_votes() >= self.quorum:
            self._become_leader()
            return
        last = self.log.last_position
        for p in self.peers:
            self._send(RequestVote(self.id, p, self.term, last, transfer))

    def _on_request_vote(self, m: RequestVote) -> None:
        grant = self.vote in (None, m.sender) and self._candidate_log_ok(m.last)
        if grant:
            self.vote = m.sender
            self._election_elapsed = 0
        self._send(VoteResponse(self.id, m.sender, self.term, grant))

    def _on_vote_response(self, m: VoteResponse) -> None:
        if self.role is not Role.CANDIDATE:
            return
        self._votes[m.sender] = m.granted
        if self._count_votes() >= self.quorum:
            self._become_leader()
        elif sum(1 for g in self._votes.values() if not g) >= self.quorum:
            self._become_follower(self.term, None)

    def _count_votes(self) -> int:
        return sum(1 for g in self._votes.values() if g)

    def _on_timeout_now(self, m: TimeoutNow) -> None:
        if self.eligible and self.role is not Role.LEADER:
            self._campaign(self.term + 1, transfer=True)

    def _become_follower(self, term: int, leader: str | None) -> None:
        if term > self.term:
            self.term = term
            self.vote = None
        self.role = Role.FOLLOWER
        self.leader = leader
        self._pre_vote_round = None
        self.progress = {}
        self.transfer_target = None
        self._election_elapsed = 0
        self._randomized_timeout = self._new_timeout()
        if leader is not None:
            self._leader_contact_ticks = 0

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader = self.id
        self._heartbeat_elapsed = 0
        self._election_elapsed = 0
        self.transfer_target = None
        last = self.log.last_index
        self.progress = {p: PeerProgress(match_index=0, next_index=last + 1) for p in self.peers}
        # The no-op: entries of earlier terms commit once it does (they are never counted).
        self.log.append([Entry(NO_OP, last + 1, self.term)])
        self._maybe_commit()
        self._broadcast_append()

    # ---- leader -------------------------------------------------------------------------

    def _tick_leader(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        for pr in self.progress.values():
            pr.heard_ticks += 1
            if pr.mode is PeerMode.SNAPSHOT:
                pr.snapshot_ticks += 1
                if pr.snapshot_ticks >= self.config.snapshot_resend_ticks:
                    self._to_probe(pr, pr.next_index)  # lost on the way: the probe resends it
        if self.transfer_target is not None:
            self._transfer_elapsed += 1
            if self._transfer_elapsed >= self.config.election_ticks:
                self.transfer_target = None  # it did not take over: accept proposals again
        if self._election_elapsed >= self.config.check_quorum_ticks:
            self._election_elapsed = 0
            if not self._check_quorum():
                self._become_follower(self.term, None)
                return
        if self._heartbeat_elapsed >= self.config.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            self._heartbeat()

    def _check_quorum(self) -> bool:
        """Heard from a majority (ourselves included) since the last round? Resets the round."""
        active = 1 + sum(1 for pr in self.progress.values() if pr.recent_active)
        for pr in self.progress.values():
            pr.recent_active = False
        return active >= self.quorum

    def _heartbeat(self) -> None:
        for p, pr in self.progress.items():
            if (
                pr.mode is PeerMode.REPLICATE
                and pr.inflight
                and pr.match_index == pr.match_at_heartbeat
            ):
                # Nothing acknowledged for a whole heartbeat with appends out: assume them lost.
                self._to_probe(pr, pr.match_index + 1)
            pr.match_at_heartbeat = pr.match_index
            if pr.mode is PeerMode.SNAPSHOT:
                continue  # its answer (or the resend timer) moves it on
            if pr.mode is PeerMode.PROBE:
                pr.paused = False
                self._send_append(p, pr)
            elif pr.match_index >= self.log.base_index:
                # prev = match: always accepted (an ack is durable), carries the commit index.
                match_term = self.log.term_at(pr.match_index)
                commit = min(self.commit, pr.match_index)
                self._send(
                    AppendEntries(self.id, p, self.term, pr.match_index, match_term, commit, ())
                )
                self._send_append(p, pr)
            else:
                self._to_probe(pr, pr.match_index + 1)  # behind our base: it needs the snapshot
                self._send_append(p, pr)

    def _broadcast_append(self) -> None:
        for p, pr in self.progress.items():
            self._send_append(p, pr)

    def _send_append(self, peer: str, pr: PeerProgress) -> None:
        """Send what the peer lacks, as far as its mode allows."""
        while True:
            if pr.mode is PeerMode.SNAPSHOT or (pr.mode is PeerMode.PROBE and pr.paused):
                return
            if pr.mode is PeerMode.REPLICATE and (
                len(pr.inflight) >= self.config.max_inflight or pr.next_index > self.log.last_index
            ):
                return
            prev = pr.next_index - 1
            if prev < self.log.base_index:
                if self.snapshot is None:
                    raise RuntimeError(
                        f"{self.id} has compacted to {self.log.base_index} without a snapshot"
                    )
                self._send(InstallSnapshot(self.id, peer, self.term, self.snapshot))
                pr.mode = PeerMode.SNAPSHOT
                pr.inflight.clear()
                pr.snapshot_ticks = 0
                return
            hi = min(self.log.last_index + 1, pr.next_index + self.config.max_entries_per_append)
            try:
                entries = tuple(self.log.entries(pr.next_index, hi))
            except CorruptJournalError as exc:
                # A stored record failed its check (the storage reported it): only this peer's
                # replication waits, retried each heartbeat, until the shell repairs it.
                if self.on_unreadable is not None:
                    self.on_unreadable(peer, exc)
                return
            self._send(
                AppendEntries(
                    self.id, peer, self.term, prev, self.log.term_at(prev), self.commit, entries
                )
            )
            if pr.mode is PeerMode.PROBE:
                pr.paused = True
                return
            pr.inflight.append(hi - 1)
            pr.next_index = hi

    def _on_append_response(self, m: AppendResponse) -> None:
        pr = self.progress.get(m.sender)
        if self.role is not Role.LEADER or pr is None:
            return
        pr.recent_active = True
        pr.heard_ticks = 0
        pr.eligible = m.eligible
        if m.success:
            after = leader_on_ack(
                Progress(pr.match_index, pr.next_index), Ack(m.next_index, True, False)
            )
            pr.match_index, pr.next_index = after.match_index, after.next_index
            while pr.inflight and pr.inflight[0] <= pr.match_index:
                pr.inflight.popleft()
            if pr.mode is PeerMode.SNAPSHOT and pr.match_index < self.log.base_index:
                pass  # an older answer: the snapshot's own is still to come
            elif pr.mode is not PeerMode.REPLICATE:
                pr.mode = PeerMode.REPLICATE
                pr.paused = False
                pr.inflight.clear()
                pr.next_index = pr.match_index + 1
            self._maybe_commit()
            self._maybe_send_timeout_now()
        else:
            if pr.mode is not PeerMode.SNAPSHOT and self._lost_acknowledged(pr, m):
                pr.match_index = max(0, m.next_index - 1)
                self._to_probe(pr, m.next_index)
                self._send_append(m.sender, pr)
                return
            if pr.mode is PeerMode.REPLICATE:
                stale = m.rejected_prev <= pr.match_index
            else:  # a probe answers for the append it sent; a snapshot waits for its own answer
                stale = pr.mode is PeerMode.SNAPSHOT or m.rejected_prev != pr.next_index - 1
            if stale:
                return
            # Resume at the follower's hint, never below what it acknowledged.
            self._to_probe(pr, max(pr.match_index + 1, min(m.next_index, self.log.last_index + 1)))
        self._send_append(m.sender, pr)

    def _to_probe(self, pr: PeerProgress, next_index: int) -> None:
        pr.mode = PeerMode.PROBE
        pr.paused = False
        pr.inflight.clear()
        pr.next_index = next_index

    def _maybe_commit(self) -> None:
        if self.role is not Role.LEADER:
            return
        matches = sorted([self._self_match(), *(pr.match_index for pr in self.progress.values())])
        index = matches[len(matches) - self.quorum]
        if index > self.commit and self._may_commit(index):
            self.commit = index

    def _maybe_send_timeout_now(self) -> None:
        t = self.transfer_target
        if t is not None and self.progress[t].match_index == self.log.last_index:
            self._send(TimeoutNow(self.id, t, self.term))

    # ---- follower -----------------------------------------------------------------------

    def _heard_leader(self, leader: str) -> None:
        if self.role is not Role.FOLLOWER:
            self._become_follower(self.term, leader)
        self.leader = leader
        self._leader_contact_ticks = 0
        self._election_elapsed = 0

    def _on_append(self, m: AppendEntries) -> None:
        self._heard_leader(m.sender)
        base = self.log.base_index
        if m.prev_index < base:
            # The prefix up to our base is compacted here, so committed and applied: judge only
            # what lies beyond it (a term mismatch at the base still raises in follower_append).
            skip = base - m.prev_index
            if skip > len(m.entries):
                self._send(self._accept(m.sender, m.prev_index + len(m.entries) + 1))
                return
            m = AppendEntries(
                m.sender, m.to, m.term, base, m.entries[skip - 1].term, m.commit, m.entries[skip:]
            )
        decision = follower_append(
            self.log, self.commit, AppendRequest(m.prev_index, m.prev_term, m.commit, m.entries)
        )
        if decision.append:
            start = decision.append[0][1]
            self.log.append([Entry(*e) for e in decision.append])
            self._unstable_from = min(self._unstable_from, start)
            self.durable_index = min(self.durable_index, start - 1)
        self.commit = max(self.commit, decision.commit_index)
        reply = decision.reply
        if reply.success:
            self._send(self._accept(m.sender, reply.next_index))
        else:
            self._send(
                AppendResponse(
                    self.id,
                    m.sender,
                    self.term,
                    False,
                    reply.next_index,
                    m.prev_index,
                    self.eligible,
                )
            )

    def _on_snapshot(self, m: InstallSnapshot) -> None:
        self._heard_leader(m.sender)
        snap = m.snapshot
        if snap.base_index <= self.commit:
            self._send(self._accept(m.sender, self.commit + 1))
            return
        has_it = (
            self.log.base_index <= snap.base_index <= self.log.last_index
            and self.log.term_at(snap.base_index) == snap.base_term
        )
        if has_it:
            # Our log already holds the snapshot's last entry: it is committed, keep the log.
            self.commit = snap.base_index
        else:
            self.log.reset(snap.base_index, snap.base_term)
            self.snapshot = snap
            self._pending_snapshot = snap
            self.commit = self.applied = snap.base_index
            self._unstable_from = snap.base_index + 1
            self.durable_index = min(self.durable_index, snap.base_index)
        self._send(self._accept(m.sender, snap.base_index + 1))

    def _accept(self, to: str, next_index: int) -> AppendResponse:
        return AppendResponse(self.id, to, self.term, True, next_index, 0, self.eligible)

    def _reject(self, to: str, prev_index: int) -> AppendResponse:
        return AppendResponse(
            self.id, to, self.term, False, self.log.last_index + 1, prev_index, self.eligible
        )

    # ---- plumbing -----------------------------------------------------------------------

    def _send(self, m: Message) -> None:
        if isinstance(m, AppendEntries | InstallSnapshot | TimeoutNow):
            # A leader's term was durable before its ballots left, and an append promises
            # nothing about its own log: these may leave while the shell persists.
            self._leader_msgs.append(m)
        else:
            self._msgs.append(m)

    def _new_timeout(self) -> int:
        e = self.config.election_ticks
        return e + self._rng.randrange(e)

    def _ticks_to_s(self, ticks: int) -> float:
        return ticks * self.config.tick_ms / 1000
