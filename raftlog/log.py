"""ReplicatedLog: the controllers' replicated log on pysyncobj (submit, read, follow, hand off).

Broker groups ran on it before raftmq's own core (native_log.py) replaced it there; a group store
it wrote opens under the native core. What only a broker group used (retention's segment cuts and
snapshot catch-up, the disk-pressure hand-off, submit_many) went with them. The thin shell around
pysyncobj: threads for group commit, completions and flushing. It never runs user code or slow
work in pysyncobj's tick thread, and never holds the log in memory.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from pysyncobj.config import FAIL_REASON

from raftmq.raftlog import entry_codec
from raftmq.raftlog.config import FlushPolicy, RaftLogConfig
from raftmq.raftlog.errors import (
    CompactedError,
    CorruptJournalError,
    EntryTooLargeError,
    LogClosedError,
    NotLeaderError,
    OutcomeUnknownError,
    QueueFullError,
    RaftLogError,
)
from raftmq.raftlog.journal import SegmentJournal
from raftmq.raftlog.meta import MetaStore
from raftmq.raftlog.pysyncobj_compat import ROLE_OF_STATE, JournalAdapter, RaftNode
from raftmq.raftlog.record import Chunk, Committed, Entry, LogStatus, Role, RoleChange
from raftmq.raftlog.scrubber import Scrubber
from raftmq.raftlog.storage_health import CorruptRecord, StorageHealth

log = logging.getLogger("raftlog.log")

RoleListener = Callable[[RoleChange], None]
# A leader that cannot write asks a follower to take over this often; a follower that was asked
# and did not take over is skipped for election_timeout_min_ms (pysyncobj_compat), so a retry
# goes to the next one.
HANDOFF_RETRY_S = 0.05
# A transfer target that is not connected or not answering may be reconnecting: it gets this long.
TRANSFER_GRACE_S = 1.0


@dataclass(slots=True)
class _Submission:
    payload: Chunk
    future: Future[Committed]


@dataclass(slots=True)
class _InFlight:
    """One raft entry submitted to pysyncobj, waiting for its commit callback."""

    futures: list[Future[Committed]]
    size_bytes: int
    deadline: float
    done: bool = field(default=False)


class ReplicatedLog:
    """A node of a replicated log. Create it from a thread that outlives it (pysyncobj's tick
    thread stops when its creating thread exits); close() it to leave the group cleanly."""

    def __init__(
        self,
        cfg: RaftLogConfig,
        on_role_change: RoleListener | None = None,
        health: StorageHealth | None = None,
    ) -> None:
        self.cfg = cfg
        self.health = health if health is not None else StorageHealth(cfg.node_id)
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        self._journal = SegmentJournal(
            cfg.data_dir / "journal",
            segment_bytes=cfg.segment_bytes,
            cache_bytes=cfg.cache_bytes,
            max_record_bytes=cfg.max_entry_bytes
            + entry_codec.HEADER_BYTES
            + entry_codec.PER_CHUNK_BYTES * cfg.max_chunks_per_entry,
        )
        self._journal.on_corrupt = self._on_corrupt
        self._listeners: list[RoleListener] = [on_role_change] if on_role_change else []
        self._closed = False
        self._lock = threading.Condition()  # guards _pending, _pending_bytes, _inflight
        self._pending: collections.deque[_Submission] = collections.deque()
        self._pending_bytes = 0
        self._paused = False  # leadership hand-off in progress: new submissions are refused
        self._inflight: dict[int, _InFlight] = {}
        self._next_batch_id = 0
        self._events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._applied = 0
        self._applied_cond = threading.Condition()
        self._role_key: tuple[int, int, str | None] = (-1, -1, None)
        self._async_flush = cfg.flush_policy is FlushPolicy.ASYNC_FLUSH
        self._handing_off = False  # leader with an unwritable disk, transferring leadership
        self._next_handoff_s = 0.0
        self._next_flush = 0.0
        adapter = JournalAdapter(self._journal, MetaStore(cfg.data_dir / "raft.meta"), self.health)
        self._node = RaftNode(cfg, adapter, self._on_tick)
        try:
            self._node.waitBinded()
        except Exception as exc:
            self._node.destroy()
            raise RaftLogError(
                f"cannot listen on raft address {cfg.node_id}: is another process using the port?"
            ) from exc
        self._threads = [
            threading.Thread(target=self._batch_loop, name="raftlog-batcher", daemon=True),
            threading.Thread(target=self._event_loop, name="raftlog-events", daemon=True),
        ]
        self._scrub_stop = threading.Event()
        self.scrubber: Scrubber | None = None
        if cfg.scrub_bytes_per_s > 0:
            self.scrubber = Scrubber(self._journal, cfg.scrub_bytes_per_s)
            self._threads.append(
                threading.Thread(
                    target=self.scrubber.run,
                    args=(self._scrub_stop,),
                    name="raftlog-scrubber",
                    daemon=True,
                )
            )
        for t in self._threads:
            t.start()

    def _on_corrupt(self, exc: CorruptJournalError) -> None:
        """Any reader's thread: a journal record failed its checks (it was not served)."""
        rec = CorruptRecord("journal", exc.path, exc.offset, exc.index, exc.reason)
        self.health.corrupt(rec, time.monotonic())

    # ---- writes ----------------------------------------------------------------------------------

    def submit(self, payload: Chunk) -> Future[Committed]:
        """Append `payload` as one chunk of the next entry; the future resolves once the entry is
        committed on a majority (and applied here). Raises EntryTooLargeError at once."""
        limit = self.cfg.max_entry_bytes
        if len(payload) > limit:
            raise EntryTooLargeError(len(payload), limit)
        if self._closed:
            raise LogClosedError("the replicated log is closed")
        fut: Future[Committed] = Future()
        if self._paused or not self._node.is_leader() or self.health.error is not None:
            fut.set_exception(NotLeaderError(self.cfg.node_id, self._leader_hint()))
            return fut
        with self._lock:
            if self._pending_bytes + len(payload) > self.cfg.max_pending_bytes:
                fut.set_exception(
                    QueueFullError(
                        f"{self._pending_bytes} bytes already wait for replication "
                        f"(max_pending_bytes={self.cfg.max_pending_bytes}); retry later"
                    )
                )
                return fut
            self._pending.append(_Submission(payload, fut))
            self._pending_bytes += len(payload)
            self._lock.notify_all()
        return fut

    def _batch_loop(self) -> None:
        linger_s = self.cfg.batch_linger_ms / 1000
        max_bytes, max_chunks = self.cfg.batch_max_bytes, self.cfg.max_chunks_per_entry
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._lock.wait(0.5)
                if self._closed:
                    return
                if linger_s > 0 and self._queued_bytes() < max_bytes:
                    self._lock.wait(linger_s)
                batch: list[_Submission] = []
                size = 0
                while self._pending and len(batch) < max_chunks:
                    nxt = len(self._pending[0].payload)
                    if batch and size + nxt > max_bytes:
                        break
                    batch.append(self._pending.popleft())
                    size += nxt
                batch_id = self._next_batch_id
                self._next_batch_id += 1
                if self._node.is_leader() and not self._paused and self.health.error is None:
                    self._inflight[batch_id] = _InFlight(
                        [s.future for s in batch],
                        size,
                        time.monotonic() + self.cfg.commit_timeout_ms / 1000,
                    )
                else:
                    self._pending_bytes -= size
                    err = NotLeaderError(self.cfg.node_id, self._leader_hint())
                    for s in batch:
                        s.future.set_exception(err)
                    continue
            command = entry_codec.encode_data([s.payload for s in batch])
            self._node.submit_command(command, self._commit_callback(batch_id))

    def _queued_bytes(self) -> int:
        return sum(len(s.payload) for s in self._pending)

    def _commit_callback(self, batch_id: int) -> Callable[[Any, int], None]:
        def on_commit(_result: Any, err: int) -> None:
            # Tick thread: record and hand over; futures' callbacks must not run here.
            index = self._node.applying_index() if err == FAIL_REASON.SUCCESS else 0
            self._events.put(("commit", (batch_id, index, err)))

        return on_commit

    # ---- the event thread: completions, role changes, timeouts -----------------------------------

    def _event_loop(self) -> None:
        while True:
            try:
                kind, data = self._events.get(timeout=0.1)
            except queue.Empty:
                kind, data = "tick", None
            if kind == "stop":
                return
            if kind == "commit":
                self._complete(*data)
            elif kind == "role":
                self._on_role(data)
            now = time.monotonic()
            self._expire(now)
            self.health.settle(now)
            self._hand_off_if_unwritable(now)

    def _complete(self, batch_id: int, index: int, err: int) -> None:
        with self._lock:
            entry = self._inflight.pop(batch_id, None)
            if entry is None:
                return  # already failed by a timeout or a leadership loss
            self._pending_bytes -= entry.size_bytes
        if err == FAIL_REASON.SUCCESS:
            term = self._journal.term_at(index)
            for slot, fut in enumerate(entry.futures):
                _resolve(fut, Committed(term, index, slot))
            return
        exc: RaftLogError
        if err in (FAIL_REASON.DISCARDED, FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER):
            exc = NotLeaderError(self.cfg.node_id, self._leader_hint())  # definitely not stored
        elif err == FAIL_REASON.QUEUE_FULL:
            exc = QueueFullError("the raft command queue is full; retry later")
        else:
            exc = OutcomeUnknownError(f"leadership changed before the entry committed (code {err})")
        for fut in entry.futures:
            _fail(fut, exc)

    def _fail_all(self, inflight_exc: RaftLogError, pending_exc: RaftLogError) -> None:
        with self._lock:
            inflight, self._inflight = list(self._inflight.values()), {}
            pending, self._pending = list(self._pending), collections.deque()
            self._pending_bytes = 0
        for entry in inflight:
            for fut in entry.futures:
                _fail(fut, inflight_exc)
        for s in pending:
            _fail(s.future, pending_exc)

    def _expire(self, now: float) -> None:
        with self._lock:
            expired = [k for k, e in self._inflight.items() if e.deadline <= now]
            entries = [self._inflight.pop(k) for k in expired]
            for e in entries:
                self._pending_bytes -= e.size_bytes
        for e in entries:
            for fut in e.futures:
                _fail(fut, OutcomeUnknownError("no commit within commit_timeout_ms"))

    def _hand_off_if_unwritable(self, now: float) -> None:
        """A leader whose disk refuses writes hands leadership to a follower that can append
        (the most caught-up one), retrying every HANDOFF_RETRY_S; writes are refused meanwhile
        and what was in flight ends unknown at once (it may still commit under the next leader)."""
        if self.health.error is None or self._closed or not self._node.is_leader():
            self._handing_off = False
            return
        if not self._handing_off:
            self._handing_off = True
            log.warning(
                "raft.handing_off_leadership node=%s reason=%s",
                self.cfg.node_id,
                self.health.error.describe().replace(" ", "_"),
            )
            self._fail_all(
                OutcomeUnknownError("the leader's disk refused writes; it hands leadership off"),
                NotLeaderError(self.cfg.node_id, None),
            )
        if now >= self._next_handoff_s:
            self._next_handoff_s = now + HANDOFF_RETRY_S
            self._node.request_transfer_best()

    def _on_role(self, change: RoleChange) -> None:
        log.info(
            "raft.role node=%s role=%s term=%d leader=%s",
            change.node_id,
            change.role.value,
            change.term,
            change.leader,
        )
        if change.role is not Role.LEADER:
            self._fail_all(
                OutcomeUnknownError("this node lost leadership while the entry was in flight"),
                NotLeaderError(self.cfg.node_id, change.leader),
            )
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:
                log.exception("raftlog.role_listener_failed")

    def add_role_listener(self, listener: RoleListener) -> None:
        self._listeners.append(listener)

    # ---- the tick hook (pysyncobj's thread: cheap comparisons only) ------------------------------

    def _on_tick(self) -> None:
        if self._async_flush:
            # ASYNC_FLUSH group fsync, in this thread: a flusher thread's fdatasync would hold the
            # inode lock against this thread's appends (measured: slower than SYNC_FLUSH).
            now = time.monotonic()
            if now >= self._next_flush and self._journal.dirty:
                self._next_flush = now + self.cfg.flush_interval_ms / 1000
                try:
                    self._journal.sync()
                except OSError as exc:  # retried at the next flush; the health says why
                    self._next_flush = now + self.health.failed(
                        "journal sync", str(self._journal.directory), exc, now
                    )
                else:
                    self.health.succeeded("journal sync", now)
        key = self._node.role_key()
        if key != self._role_key:
            self._role_key = key
            state, term, leader = key
            self._events.put(
                ("role", RoleChange(self.cfg.node_id, ROLE_OF_STATE[state], term, leader))
            )
        applied = self._node.applied_index()
        if applied > self._applied:
            with self._applied_cond:
                self._applied = applied
                self._applied_cond.notify_all()

    # ---- reads (any node, committed entries only) ------------------------------------------------

    @property
    def committed_index(self) -> int:
        """Highest index that is committed and readable on this node."""
        return self._applied

    @property
    def first_index(self) -> int:
        return self._journal.first_index

    def read(self, index: int) -> Entry:
        """One committed entry, through the journal's record cache: a pull reads one entry and
        the next pulls of a consumer come back to it (a batch of 1024 messages is 32 pulls of
        32), so an old entry is read from disk and checked once, not once per pull (issue 14
        bar 3: pulls at the tail of a 10^7 backlog were ~0.1 ms slower than at the head, each
        re-reading and re-checking a ~130 KB record). read_from's streams do not fill it."""
        first = self._journal.first_index
        if index < first:
            raise CompactedError(index, first)
        if index > self._applied:
            raise IndexError(f"index {index} is not committed yet (committed: {self._applied})")
        try:
            rec = self._journal.get(index)
        except IndexError:
            first = self._journal.first_index
            if index < first:  # retention deleted it meanwhile
                raise CompactedError(index, first) from None
            raise
        return Entry(rec.index, rec.term, entry_codec.decode_data(rec.command))

    def read_from(self, start: int, *, max_bytes: int, max_entries: int) -> list[Entry]:
        """Committed entries from `start` on (at least one if any is committed). Entries that
        carry no data (pysyncobj's no-ops) come back with empty chunks, keeping indexes dense."""
        if start < self._journal.first_index:
            raise CompactedError(start, self._journal.first_index)
        limit = self._applied
        if start > limit:
            return []
        records = self._journal.read_range(
            start, max_bytes=max_bytes, max_count=min(max_entries, limit - start + 1)
        )
        return [
            Entry(r.index, r.term, entry_codec.decode_data(r.command))
            for r in records
            if r.index <= limit
        ]

    def wait_committed(self, index: int, timeout_s: float) -> bool:
        """Block until `index` is committed here or the timeout passes (long polling)."""
        deadline = time.monotonic() + timeout_s
        with self._applied_cond:
            while self._applied < index:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._applied_cond.wait(left)
        return True

    # ---- retention -------------------------------------------------------------------------------

    # ---- leadership and status -------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self._node.is_leader()

    def is_leader_ready(self) -> bool:
        """Leader whose own no-op is applied: every earlier entry is committed and readable here."""
        v = self._node.view()
        return v.role is Role.LEADER and v.noop_index is not None and self._applied >= v.noop_index

    def _leader_hint(self) -> str | None:
        leader = self._node.leader_id()
        return None if leader == self.cfg.node_id else leader

    def transfer_leadership(self, target: str | None = None, timeout_s: float = 3.0) -> bool:
        """Hand leadership to `target`, or to the best follower that can take over now (caught
        up, heard from lately, not reporting a full disk; election.transfer_candidates): new
        submissions are refused meanwhile so the target can catch up. Gives up, False, when no
        follower (or not `target`) can take over: at once if its disk refuses writes, after
        TRANSFER_GRACE_S if it is not connected or not answering (it may be reconnecting, or
        campaigning after a TimeoutNow). Without a target, one that does not take over within
        the minimum election timeout is passed over for the next. True once
        another node leads: stepping down is not enough, since the election that follows can
        bring this node back (then it tries again while time is left)."""
        start = time.monotonic()
        deadline = start + timeout_s
        grace_until = start + TRANSFER_GRACE_S
        takeover_s = (
            self.cfg.election_timeout_min_ms if target is None else self.cfg.election_timeout_max_ms
        ) / 1000
        self._paused = True
        try:
            while time.monotonic() < deadline:
                if not self._node.is_leader():
                    if self._another_leads(deadline):
                        return True
                    continue  # elected again: hand over again
                if target is not None:
                    reason = self._node.cannot_take_over(target)
                    if reason not in (None, "cannot_write") and time.monotonic() < grace_until:
                        time.sleep(0.01)
                        continue
                    if reason is not None:
                        log.warning(
                            "raft.transfer_refused node=%s to=%s reason=%s",
                            self.cfg.node_id,
                            target,
                            reason,
                        )
                        return False
                    outcome = "sent" if self._node.transfer_to(target, timeout_s=0.5) else "wait"
                else:
                    outcome = self._node.transfer_to_best(timeout_s=0.5)
                if outcome == "none" and time.monotonic() < grace_until:
                    outcome = "wait"  # a follower may be reconnecting
                if outcome == "none":
                    log.warning(
                        "raft.transfer_refused node=%s reason=no_follower_can_take_over",
                        self.cfg.node_id,
                    )
                    return False
                if outcome == "sent":
                    grace_until = time.monotonic() + TRANSFER_GRACE_S  # it goes quiet to campaign
                    wait_until = min(deadline, time.monotonic() + takeover_s)
                    while time.monotonic() < wait_until and self._node.is_leader():
                        time.sleep(0.005)
                else:
                    time.sleep(0.01)  # the target is catching up, or one was asked a moment ago
            return not self._node.is_leader()
        finally:
            self._paused = False

    def _another_leads(self, deadline: float) -> bool:
        """After stepping down: wait until a leader is known; whether it is another node."""
        while time.monotonic() < deadline:
            v = self._node.view()
            if v.leader is not None and v.leader != self.cfg.node_id and not self._node.is_leader():
                return True
            if self._node.is_leader():
                return False
            time.sleep(0.005)
        return not self._node.is_leader()

    def block_peers(self, peers: frozenset[str]) -> None:
        """Fault injection for tests and drills: drop every raft message to and from `peers`
        (connections stay up, timers keep running, as with a firewall dropping packets); an
        empty set heals. Not for production use: it partitions this node on purpose."""
        unknown = set(peers) - set(self.cfg.peers)
        if unknown:
            raise ValueError(f"not peers of {self.cfg.node_id}: {sorted(unknown)}")
        self._node.set_blocked_peers(frozenset(peers))

    def leadership(self) -> tuple[Role, int, str | None]:
        v = self._node.view()
        return v.role, v.term, v.leader

    def status(self) -> LogStatus:
        v = self._node.view()
        return LogStatus(
            node_id=self.cfg.node_id,
            role=v.role,
            term=v.term,
            leader=v.leader,
            commit_index=v.commit_index,
            applied_index=v.applied_index,
            first_index=self._journal.first_index,
            last_index=self._journal.last_index,
            match_index=v.match_index,
            pending_bytes=self._pending_bytes,
        )

    def close(self, transfer_leadership: bool = True) -> None:
        """Leave cleanly: hand leadership off first (so writers see no error), fail what is
        pending, stop the node and flush the journal."""
        if self._closed:
            return
        if transfer_leadership and self._node.is_leader() and self.cfg.peers:
            self.transfer_leadership(timeout_s=2.0)
        self._closed = True
        with self._lock:
            self._lock.notify_all()
        closed = LogClosedError("the replicated log was closed")
        self._fail_all(closed, closed)
        self._events.put(("stop", None))
        self._scrub_stop.set()
        self._node.destroy_synchronous()  # pysyncobj closes the journal adapter on its thread
        for t in self._threads:
            t.join(timeout=5)
        with self._applied_cond:
            self._applied_cond.notify_all()

    def __enter__(self) -> ReplicatedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _resolve(fut: Future[Committed], value: Committed) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: Future[Committed], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
