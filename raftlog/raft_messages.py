"""The values the pure Raft core (raft_core.py) takes in and hands out: log entries, the durable
hard state, the messages between nodes and the Ready that tells the shell what to persist and send.

Values only: nothing here does I/O or decides anything. An entry's payload is opaque bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from raftmq.raftlog.election import LogPosition, PreVoteReply, PreVoteRequest
from raftmq.raftlog.snapshot import Snapshot


class Entry(NamedTuple):
    """One log entry. The field order is replication.py's WireEntry (data, index, term), so an
    Entry is a WireEntry and follower_append takes a tuple of them as they are."""

    data: bytes
    index: int  # type: ignore[assignment]  # shadows tuple.index(), which nothing here calls
    term: int


@dataclass(frozen=True, slots=True)
class HardState:
    """What a node must keep across a crash: its term, whom it voted for in that term, and its
    commit index (the last is only a hint on restart; safety rests on term and vote)."""

    term: int = 0
    vote: str | None = None
    commit: int = 0


@dataclass(frozen=True, slots=True)
class AppendEntries:
    """The leader's append (an empty one is the heartbeat): entries follow prev_index."""

    sender: str
    to: str
    term: int
    prev_index: int
    prev_term: int
    commit: int
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class AppendResponse:
    """success: next_index is one past the last entry the follower proved it shares (durably).
    reject: next_index is where the leader should resume; rejected_prev names the append
    refused, so the leader can tell a stale refusal from a current one."""

    sender: str
    to: str
    term: int
    success: bool
    next_index: int
    rejected_prev: int
    eligible: bool  # the follower's own word: may it be handed leadership?


@dataclass(frozen=True, slots=True)
class InstallSnapshot:
    """The leader's state-machine snapshot for a follower behind its first retained index; the
    payload is the shell's (the core never looks inside)."""

    sender: str
    to: str
    term: int
    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class RequestVote:
    """A real election's ballot; transfer=True when a TimeoutNow started it (voters then vote
    even while they still hear the old leader, who asked for this)."""

    sender: str
    to: str
    term: int
    last: LogPosition
    transfer: bool


@dataclass(frozen=True, slots=True)
class VoteResponse:
    sender: str
    to: str
    term: int
    granted: bool


@dataclass(frozen=True, slots=True)
class PreVote:
    """election.py's PreVoteRequest in an envelope. Its term is the term the candidate would
    ask for: nobody stores it."""

    sender: str
    to: str
    request: PreVoteRequest


@dataclass(frozen=True, slots=True)
class PreVoteResponse:
    sender: str
    to: str
    reply: PreVoteReply


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """The leader hands over: the receiver campaigns at once, skipping PreVote."""

    sender: str
    to: str
    term: int


Message = (
    AppendEntries
    | AppendResponse
    | InstallSnapshot
    | RequestVote
    | VoteResponse
    | PreVote
    | PreVoteResponse
    | TimeoutNow
)


@dataclass(frozen=True, slots=True)
class Ready:
    """What the shell must do, in this order, then call RaftCore.advance(ready):

    0. `leader_messages` (a leader's appends, snapshots, TimeoutNow) may leave at once, before
       or while it persists: they promise nothing about this node's disk (Raft thesis 10.2.1),
       so the leader's write and its followers' overlap;
    1. install `snapshot` if set (it replaces the whole log and the state machine);
    2. persist `entries`: each overwrites any stored entry at its index or above;
    3. persist `hard_state` if set;
    4. only then send `messages` (a vote or an acknowledgement promises what 1-3 made durable);
    5. apply `committed` in order (they may include entries of step 2).

    A crash anywhere in 1-3 may keep any prefix of `entries`; nothing of 4 leaves before 3 is
    done. The core may be stepped while the shell works on a Ready, but hands out the next one
    only after advance(): the leader counts its own new entries toward commit from then on.
    """

    hard_state: HardState | None
    snapshot: Snapshot | None
    entries: tuple[Entry, ...]
    messages: tuple[Message, ...]
    committed: tuple[Entry, ...]
    leader_messages: tuple[Message, ...] = ()
