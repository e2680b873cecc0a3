"""Typed failures of the replicated log.

Each error says whose fault it is: the caller's (bad argument) or the system's (not leader, closed,
corrupt storage). The broker maps these to wire status codes in one place; nothing here knows gRPC.
"""

from __future__ import annotations


class RaftLogError(Exception):
    """Base of every error raised by raftlog."""


class EntryTooLargeError(RaftLogError, ValueError):
    """The caller submitted more bytes than one entry may hold; refused before replication."""

    def __init__(self, size_bytes: int, max_bytes: int) -> None:
        super().__init__(
            f"entry of {size_bytes} bytes exceeds the limit of {max_bytes} bytes; "
            "split it into smaller submissions or raise max_entry_bytes on every node"
        )
        self.size_bytes = size_bytes
        self.max_bytes = max_bytes


class NotLeaderError(RaftLogError):
    """This node cannot accept writes; `leader` is the last known leader's raft address or None."""

    def __init__(self, node_id: str, leader: str | None) -> None:
        hint = f"the leader is {leader}" if leader else "no leader is known yet; retry shortly"
        super().__init__(f"node {node_id} is not the leader: {hint}")
        self.node_id = node_id
        self.leader = leader


class OutcomeUnknownError(RaftLogError):
    """Leadership changed while the entry was in flight: it may or may not have been committed.

    Callers must retry with an idempotency key (the broker's producer sequence), never blindly.
    """


class QueueFullError(RaftLogError):
    """More bytes are waiting for replication than max_pending_bytes allows; back off and retry."""


class LogClosedError(RaftLogError):
    """The log was closed (node shutting down); no further submissions or reads."""


class CorruptJournalError(RaftLogError):
    """A record on disk failed its checksum or framing; it is never served."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"corrupt journal record in {path} at byte offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason
        self.index: int | None = None  # the Raft index being read, set by the journal's readers


class CompactedError(RaftLogError):
    """The requested index is below the first index still kept in the journal."""

    def __init__(self, index: int, first_index: int) -> None:
        super().__init__(f"index {index} was deleted by retention; the log starts at {first_index}")
        self.index = index
        self.first_index = first_index


class CommittedEntryConflictError(RaftLogError):
    """The leader's log disagrees with an entry this node already counts as committed.

    Raft's safety argument no longer holds (a lost fsync, a copied or mixed-up data directory, a
    bug): the node must stop, never truncate committed entries and never keep serving them.
    """

    def __init__(self, index: int, commit_index: int, our_term: int, leader_term: int) -> None:
        super().__init__(
            f"the leader has term {leader_term} at index {index} where this node holds term "
            f"{our_term}, at or below its commit index {commit_index}: the logs diverged"
        )
        self.index = index
        self.commit_index = commit_index
        self.our_term = our_term
        self.leader_term = leader_term
