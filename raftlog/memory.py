"""MemoryLog: an in-process, single-node replicated log for tests (etcd's MemoryStorage in spirit).

It offers what NativeLog offers a broker node (submit, read, follow, role and leader, status)
with no sockets, threads or disk: a submission commits at once, unless the test holds commits. It
keeps at most `max_entries` entries (older ones are compacted away) and imports nothing outside
raftmq.raftlog. Never use it to serve data: it has no durability and no peers.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future

from raftmq.raftlog.errors import (
    CompactedError,
    EntryTooLargeError,
    LogClosedError,
    NotLeaderError,
    OutcomeUnknownError,
    RaftLogError,
)
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

RoleListener = Callable[[RoleChange], None]


class MemoryLog:
    """A leader from the start (term 1, its no-op committed) unless `leader=False`. Tests steer it:
    become_follower / become_leader change the role (a new leader term starts with a no-op, as
    in pysyncobj), append() adds entries another leader committed, hold_commits /
    release_commits keep submissions (and no-ops) uncommitted for a while."""

    def __init__(
        self,
        node_id: str = "memory-0",
        *,
        leader: bool = True,
        max_entries: int = 100_000,
        max_entry_bytes: int = 8 << 20,
    ) -> None:
        if max_entries < 1 or max_entry_bytes < 1:
            raise ValueError("max_entries and max_entry_bytes must be positive")
        self.node_id = node_id
        self.max_entries = max_entries
        self.max_entry_bytes = max_entry_bytes
        self._cond = threading.Condition()  # guards everything below; notified on commit
        self._entries: deque[Entry] = deque()
        self._first_index = 1
        self._committed = 0
        self._pending: list[tuple[Entry, Future[Committed] | None]] = []  # appended, uncommitted
        self._held = False
        self._role = Role.FOLLOWER
        self._term = 0
        self._leader: str | None = None
        self._noop_index: int | None = None
        self._closed = False
        self._listeners: list[RoleListener] = []
        self._stamper: Stamper | None = None
        if leader:
            self.become_leader()

    # ---- writes ----------------------------------------------------------------------------------

    def submit(self, payload: Chunk) -> Future[Committed]:
        """One chunk in one entry, committed at once (or on release_commits when held)."""
        if len(payload) > self.max_entry_bytes:
            raise EntryTooLargeError(len(payload), self.max_entry_bytes)
        fut: Future[Committed] = Future()
        with self._cond:
            if self._closed:
                raise LogClosedError("the memory log is closed")
            if self._role is not Role.LEADER:
                fut.set_exception(NotLeaderError(self.node_id, self._leader))
                return fut
            if self._stamper is not None:  # in log order: under the lock that appends
                self._stamper(self._term, self._last_index_locked() + 1, [[payload]])
            self._append_locked((bytes(payload),), self._term, fut)
        return fut

    def set_stamper(self, stamper: Stamper | None) -> None:
        """What runs just before each submission is appended (record.Stamper)."""
        with self._cond:
            self._stamper = stamper

    def submit_to(
        self, waiter: CommitWaiter, payloads: Sequence[Chunk], tokens: Sequence[object]
    ) -> list[RaftLogError | None]:
        """NativeLog's submit_to (record.CommitWaiter) over submit(): one report per chunk."""
        out: list[RaftLogError | None] = []
        for payload, token in zip(payloads, tokens, strict=True):
            try:
                fut = self.submit(payload)
            except RaftLogError as exc:
                out.append(exc)
                continue
            refused = fut.exception() if fut.done() else None
            if isinstance(refused, NotLeaderError):
                out.append(refused)  # refused at once, as NativeLog answers it
                continue
            fut.add_done_callback(functools.partial(_report, waiter, token))
            out.append(None)
        return out

    def append(self, chunks: Sequence[bytes], term: int | None = None) -> Entry:
        """An entry another leader committed (this node follows): committed here at once."""
        with self._cond:
            if self._role is Role.LEADER:
                raise RuntimeError("append() is for followers; a leader submits")
            entry_term = self._term if term is None else term
            if entry_term < self._last_term_locked():
                raise ValueError(f"term {entry_term} is below the log's last term")
            self._term = max(self._term, entry_term)
            return self._append_locked(tuple(chunks), entry_term, None)

    def _append_locked(
        self, chunks: tuple[bytes, ...], term: int, fut: Future[Committed] | None
    ) -> Entry:
        entry = Entry(self._last_index_locked() + 1, term, chunks)
        self._pending.append((entry, fut))
        if not self._held:
            self._commit_pending_locked()
        return entry

    def _commit_pending_locked(self) -> None:
        done, self._pending = self._pending, []
        for entry, fut in done:
            self._entries.append(entry)
            self._committed = entry.index
            if fut is not None and not fut.done():
                fut.set_result(Committed(entry.term, entry.index, 0))
        while len(self._entries) > self.max_entries:
            self._entries.popleft()
            self._first_index += 1
        self._cond.notify_all()

    def hold_commits(self) -> None:
        """Entries appended from now on stay uncommitted (a slow majority) until release."""
        with self._cond:
            self._held = True

    def release_commits(self) -> None:
        with self._cond:
            self._held = False
            self._commit_pending_locked()

    def _last_index_locked(self) -> int:
        if self._pending:
            return self._pending[-1][0].index
        return self._first_index + len(self._entries) - 1

    def _last_term_locked(self) -> int:
        if self._pending:
            return self._pending[-1][0].term
        return self._entries[-1].term if self._entries else 0

    # ---- roles -----------------------------------------------------------------------------------

    def become_leader(self) -> None:
        """Win an election: a new term, whose first entry is this leader's no-op."""
        with self._cond:
            self._term += 1
            self._role = Role.LEADER
            self._leader = self.node_id
            self._noop_index = self._append_locked((), self._term, None).index
            change = RoleChange(self.node_id, Role.LEADER, self._term, self.node_id)
        self._notify(change)

    def become_follower(self, leader: str | None = None, term: int | None = None) -> None:
        """Lose leadership (to `leader`, in `term`, default the current one): uncommitted
        submissions end with OutcomeUnknownError, as on a real deposed leader."""
        with self._cond:
            self._term = max(self._term, term or self._term)
            self._role = Role.FOLLOWER
            self._leader = leader
            self._noop_index = None
            dropped, self._pending = self._pending, []
            change = RoleChange(self.node_id, Role.FOLLOWER, self._term, leader)
        for _entry, fut in dropped:
            if fut is not None and not fut.done():
                fut.set_exception(OutcomeUnknownError("this node lost leadership"))
        self._notify(change)

    def _notify(self, change: RoleChange) -> None:
        for listener in list(self._listeners):
            listener(change)

    def add_role_listener(self, listener: RoleListener) -> None:
        self._listeners.append(listener)

    def is_leader(self) -> bool:
        return self._role is Role.LEADER

    def is_leader_ready(self) -> bool:
        with self._cond:
            noop = self._noop_index
            return self._role is Role.LEADER and noop is not None and self._committed >= noop

    def can_hand_off(self) -> bool:
        return False  # no peer that could take over

    def scrub_progress(self) -> tuple[int, int]:
        return (0, 0)  # nothing on disk to scrub

    def transfer_leadership(self, target: str | None = None, timeout_s: float = 3.0) -> bool:
        """Hands off to `target` (a raft address): this node follows it."""
        if self._role is not Role.LEADER:
            return True
        if target is None:
            return False  # no peer to hand off to
        self.become_follower(target)
        return True

    # ---- reads -----------------------------------------------------------------------------------

    @property
    def committed_index(self) -> int:
        return self._committed

    @property
    def first_index(self) -> int:
        return self._first_index

    def read(self, index: int) -> Entry:
        entries = self.read_from(index, max_bytes=1, max_entries=1)
        if not entries:
            raise IndexError(f"index {index} is not committed yet (committed: {self._committed})")
        return entries[0]

    def read_from(self, start: int, *, max_bytes: int, max_entries: int) -> list[Entry]:
        """Committed entries from `start` on, at least one if any is committed."""
        with self._cond:
            if start < self._first_index:
                raise CompactedError(start, self._first_index)
            out: list[Entry] = []
            size = 0
            for i in range(start - self._first_index, len(self._entries)):
                entry = self._entries[i]
                n = sum(len(c) for c in entry.chunks)
                if out and (size + n > max_bytes or len(out) >= max_entries):
                    break
                out.append(entry)
                size += n
            return out

    def wait_committed(self, index: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._committed < index:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._cond.wait(left)
        return True

    def peer_features(self) -> Mapping[str, int]:
        """No peers: nobody to hear from."""
        return {}

    def leadership(self) -> tuple[Role, int, str | None]:
        with self._cond:
            return self._role, self._term, self._leader

    def status(self) -> LogStatus:
        with self._cond:
            return LogStatus(
                node_id=self.node_id,
                role=self._role,
                term=self._term,
                leader=self._leader,
                commit_index=self._committed,
                applied_index=self._committed,
                first_index=self._first_index,
                last_index=self._last_index_locked(),
            )

    def close(self, transfer_leadership: bool = True) -> None:
        with self._cond:
            self._closed = True
            dropped, self._pending = self._pending, []
            self._cond.notify_all()
        for _entry, fut in dropped:
            if fut is not None and not fut.done():
                fut.set_exception(LogClosedError("the memory log was closed"))

    def __enter__(self) -> MemoryLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _report(waiter: CommitWaiter, token: object, fut: Future[Committed]) -> None:
    exc = fut.exception()
    if exc is None:
        waiter.committed([(token, fut.result())])
    else:
        assert isinstance(exc, RaftLogError)
        waiter.committed([(token, exc)])
