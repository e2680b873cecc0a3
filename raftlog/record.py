"""The value types that cross the raftlog API: a stored record, a committed position, a status.

Plain frozen values with no behaviour beyond accessors; nothing here does I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from raftmq.raftlog.errors import RaftLogError


@dataclass(frozen=True, slots=True)
class Record:
    """One journal record: a Raft entry as stored, `command` being pysyncobj's command bytes."""

    index: int
    term: int
    command: bytes


class Role(enum.Enum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class Committed:
    """Where a submission landed: entry (term, index) and its slot among the entry's chunks."""

    term: int
    index: int
    slot: int


@dataclass(frozen=True, slots=True)
class Entry:
    """A committed data entry as readers see it: the submissions packed into it, in order."""

    index: int
    term: int
    chunks: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class RoleChange:
    node_id: str
    role: Role
    term: int
    leader: str | None


@dataclass(frozen=True, slots=True)
class LogStatus:
    node_id: str
    role: Role
    term: int
    leader: str | None
    commit_index: int
    applied_index: int
    first_index: int
    last_index: int
    match_index: dict[str, int] = field(default_factory=dict)
    pending_bytes: int = 0


# A submitted chunk: a bytearray, or a writable memoryview (a produce batch in place in the
# request's own buffer, broker/produce.py), may be rewritten in place by the log's stamper.
Chunk = bytes | bytearray | memoryview

# A log's stamper (set_stamper): called with (term, index of the first entry, each entry's
# chunks) just before a leader proposes those entries, in log order, on the thread that
# proposes; it may rewrite chunks that are bytearrays or writable views in place (the broker
# places queue offsets into its produce batches) and must not block. What it raises fails
# those submissions.
Stamper = Callable[[int, int, Sequence[Sequence[Chunk]]], None]

# A timeline's stamp (the broker's common/timeline.py, for bench/w2_timeline.py): called with
# (point, value) on the loop thread at each hop of an entry through the node (inbox, propose,
# journal write, each send and receive, commit); it stores a tuple and never blocks. None, as
# in production, stamps nothing.
TimelineStamp = Callable[[str, int], None]


# What submit_to reports per chunk: where it committed, or the typed error it ended with.
CommitResult = Committed | RaftLogError


class CommitWaiter(Protocol):
    """Where a log reports the chunks submitted with `submit_to(waiter, ...)`: `committed(done)`
    with every (token, result) of this waiter that one commit advance (or one failure sweep:
    a lost leadership, a timeout, a close) decided, in log order. Called on the log's one loop
    thread (never two calls at once), so it must be quick and must not block or raise: one
    batch per advance is the point (a broker's data loop is woken once per advance, not once
    per chunk)."""

    def committed(self, done: list[tuple[object, CommitResult]]) -> None: ...
