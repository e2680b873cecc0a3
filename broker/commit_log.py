"""CommitLog: what a broker node needs from its replicated log, as a Protocol (the seam).

raftlog's NativeLog satisfies it in a broker process; raftlog's MemoryLog satisfies it in
tests. Nothing here does I/O or holds state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Protocol

from raftmq.broker.dispatcher_thread import CommittedLog
from raftmq.raftlog.errors import RaftLogError
from raftmq.raftlog.record import (
    Chunk,
    Committed,
    CommitWaiter,
    Entry,
    LogStatus,
    Role,
    RoleChange,
    Stamper,
)


class CommitLog(CommittedLog, Protocol):
    """The dispatcher's part (committed index, wait, read committed entries) plus writes and
    leadership: submit a chunk and learn where it committed, the role, term and leader, role
    changes, leadership hand-off and close."""

    def submit(self, payload: Chunk) -> Future[Committed]: ...

    def submit_to(
        self, waiter: CommitWaiter, payloads: Sequence[Chunk], tokens: Sequence[object]
    ) -> list[RaftLogError | None]:
        """The chunks in order, waking the batcher once, without a future per chunk: each one
        accepted (None in the answer) is reported to `waiter` with its token, batched per
        commit advance (record.CommitWaiter); a refused one's error is its entry."""
        ...

    def read(self, index: int) -> Entry: ...

    def set_stamper(self, stamper: Stamper | None) -> None:
        """Run `stamper` on each proposal, in log order (the broker places queue offsets:
        broker/leader_offsets.py); a log that cannot keep that order ignores it."""
        ...

    def is_leader(self) -> bool: ...

    def peer_features(self) -> Mapping[str, int]:
        """Peer raft address -> the byte its latest hello said (RaftLogConfig.hello_features:
        the stored batch version it reads; broker/batch_version.py)."""
        ...

    def status(self) -> LogStatus: ...

    def leadership(self) -> tuple[Role, int, str | None]:
        """(role, term, leader) as status() has them, without the rest: the leader gate and
        every send read it, several times per request."""
        ...

    def add_role_listener(self, listener: Callable[[RoleChange], None]) -> None: ...

    def transfer_leadership(self, target: str | None = None, timeout_s: float = 3.0) -> bool: ...

    def scrub_progress(self) -> tuple[int, int]:
        """(bytes the journal scrubber read and checked, complete passes)."""
        ...

    def can_hand_off(self) -> bool:
        """Some follower could take over now (the disk guard refuses sends only if none can)."""
        ...

    def close(self, transfer_leadership: bool = True) -> None: ...
