"""Snapshots for a follower behind retention: the seam between the log and its state machine.

Retention deletes a prefix of the journal on every node. A follower whose log ends before the
leader's first index cannot be sent entries; it gets the state machine's state as of a base index
instead (the state machine keeps such bases; raftlog never looks inside), then entries from
base + 1. The journal keeps the base's term, so the leader's next append checks against it.
Values and a Protocol only: no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The state machine's state after applying entry `base_index` (of term `base_term`)."""

    base_index: int
    base_term: int
    state: bytes


class SnapshotStore(Protocol):
    """What the log asks of its state machine (the broker's index store)."""

    def snapshot_for(self, first_index: int) -> Snapshot | None:
        """Leader, Raft thread (keep it quick): the newest base with base_index + 1 >=
        first_index (so the journal holds every entry after it); None if there is none."""
        ...

    def install_snapshot(self, snapshot: Snapshot, reset_log: Callable[[], None]) -> None:
        """Follower, Raft thread: replace the state with the snapshot's, calling `reset_log`
        (which empties the journal to start at base_index + 1) while nothing reads the log."""
        ...
