"""Typed failures of the broker's storage core: the system's fault (a gap in dispatch, a full
store, a stopped dispatcher). The caller's mistakes are raftmq.common.errors; no gRPC here.
"""

from __future__ import annotations


class BrokerError(Exception):
    """Base of every error raised by the broker package."""


class StoreError(BrokerError):
    """The message store cannot do what was asked (system's fault)."""


class DispatchGapError(BrokerError):
    """Entries or outputs arrived out of order: the store would silently miss entries."""

    def __init__(self, expected_index: int, got_index: int) -> None:
        super().__init__(
            f"dispatch expected raft index {expected_index} next but got {got_index}; "
            "the store only accepts committed entries in order, without gaps"
        )
        self.expected_index = expected_index
        self.got_index = got_index


class StoreFullError(StoreError):
    """The lmdb map is full; the broker must be restarted with a larger map_size_bytes."""


class StoreWriteError(StoreError):
    """A write to the store failed in the file system (a full disk, an I/O error): nothing of the
    transaction is stored, and the same write can be retried once the disk takes it."""

    def __init__(self, path: str, cause: BaseException) -> None:
        super().__init__(f"write to the store at {path} failed: {cause}")
        self.path = path
        self.cause = cause


class DispatcherStoppedError(BrokerError):
    """The dispatcher thread is not running (stopped, or stopped itself after a failure)."""


class CorruptRowError(StoreError):
    """A row of the index store failed its checksum when read: its key or value changed on disk
    after it was written. It is never served; the node reports it (storage_error)."""

    def __init__(self, path: str, table: str, key: str, reason: str) -> None:
        super().__init__(
            f"index store {path}: row {key!r} of table {table} is corrupt ({reason}); it was "
            "not served"
        )
        self.path = path
        self.table = table
        self.key = key
        self.reason = reason


class OffsetDisagreementError(BrokerError):
    """A produce batch's base offset, placed by the leader before replication (issue 29), is not
    what this replica's own count of the queue gives: indexing it would make this node's queue
    differ from the leader's. The dispatcher stops here rather than write a divergent index."""

    def __init__(
        self,
        topic: str,
        queue_id: int,
        placed: int,
        counted: int | None,
        raft_index: int,
        slot: int,
        reason: str,
    ) -> None:
        super().__init__(
            f"entry {raft_index} slot {slot}: {topic}/{queue_id} placed at offset {placed} by "
            f"the leader, counted {'nothing' if counted is None else counted} here: {reason}"
        )
        self.topic = topic
        self.queue_id = queue_id
        self.placed = placed
        self.counted = counted
        self.raft_index = raft_index
        self.slot = slot
        self.reason = reason
