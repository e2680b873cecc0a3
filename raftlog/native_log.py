"""NativeLog: one broker group's CommitLog on raftmq's own Raft core (raft_core + raft_node). It
replaced ReplicatedLog (pysyncobj) for broker groups and keeps its API, so a store either wrote
opens under it; the controllers still run ReplicatedLog.

Its API is thread-safe and returns concurrent futures; everything Raft happens on the node's one
loop thread (group commit, persist, send, apply, completions). It never holds the log in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from raftmq.raftlog import entry_codec
from raftmq.raftlog.config import RaftLogConfig
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
from raftmq.raftlog.journal import SegmentInfo, SegmentJournal
from raftmq.raftlog.meta import MetaStore
from raftmq.raftlog.pressure_handoff import PressureHandoff
from raftmq.raftlog.raft_core import PeerMode, Role, TransferRefusedError
from raftmq.raftlog.raft_messages import Entry as RaftEntry
from raftmq.raftlog.raft_node import ROLE_OF, TICK_MS, RaftNodeShell
from raftmq.raftlog.raft_storage import JournalStorage
from raftmq.raftlog.record import (
    Chunk,
    CommitResult,
    Committed,
    CommitWaiter,
    Entry,
    LogStatus,
    RoleChange,
    Stamper,
    TimelineStamp,
)
from raftmq.raftlog.record import Role as LogRole
from raftmq.raftlog.scrubber import Scrubber
from raftmq.raftlog.snapshot import Snapshot, SnapshotStore
from raftmq.raftlog.storage_health import CorruptRecord, StorageHealth

log = logging.getLogger("raftlog.native_log")

RoleListener = Callable[[RoleChange], None]
_T = TypeVar("_T")
TRANSFER_GRACE_S = 1.0  # a transfer target not answering may be reconnecting: it gets this long
HANDOFF_RETRY_S = 0.05  # a leader whose disk refuses writes asks a follower again this often


@dataclass(slots=True)
class _Submission:
    payload: Chunk
    waiter: CommitWaiter  # told this chunk's result, with `token`
    token: object


@dataclass(slots=True)
class _InFlight:
    term: int
    group: list[_Submission]  # the entry's chunks, by slot
    size_bytes: int
    deadline: float


class _Done:
    """The results one advance or failure sweep decided, per waiter: delivered as one call
    per waiter (record.CommitWaiter), so a broker's data loop is woken once, not per chunk."""

    __slots__ = ("by_waiter",)

    def __init__(self) -> None:
        self.by_waiter: dict[CommitWaiter, list[tuple[object, CommitResult]]] = {}

    def add(self, s: _Submission, result: CommitResult) -> None:
        done = self.by_waiter.get(s.waiter)
        if done is None:
            self.by_waiter[s.waiter] = [(s.token, result)]
        else:
            done.append((s.token, result))

    def fail(self, group: Sequence[_Submission], exc: RaftLogError) -> None:
        for s in group:
            self.add(s, exc)

    def deliver(self) -> None:
        for waiter, done in self.by_waiter.items():
            try:
                waiter.committed(done)
            except Exception:  # a waiter's bug must not stop the loop or the other waiters
                log.exception("raft.commit_waiter_failed")


class _FutureWaiter:
    """submit()'s waiter: each token is the chunk's concurrent future."""

    __slots__ = ()

    def committed(self, done: list[tuple[object, CommitResult]]) -> None:
        for fut, result in done:
            assert isinstance(fut, Future)
            if isinstance(result, Committed):
                _resolve(fut, result)
            else:
                _fail(fut, result)


_FUTURES = _FutureWaiter()


class NativeLog:
    """A node of a replicated log on the native core. close() it to leave the group cleanly."""

    def __init__(
        self,
        cfg: RaftLogConfig,
        on_role_change: RoleListener | None = None,
        health: StorageHealth | None = None,
        applied_hint: int = 0,
        stamp: TimelineStamp | None = None,
    ) -> None:
        """applied_hint: what the state machine applied before a restart (committed, so read at
        once; entries past the journal's end are not). stamp: the process's timeline, called at
        each hop of an entry (record.TimelineStamp); None stamps nothing."""
        self.cfg = cfg
        self._stamp = stamp
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
        self._lock = threading.Lock()  # guards _pending_bytes and _inbox (callers and the loop)
        self._inbox: deque[_Submission] = deque()  # submitted, not yet taken by the loop
        self._inbox_woken = False  # a _take_inbox is scheduled
        self._pending_bytes = 0
        self._inflight: dict[int, _InFlight] = {}  # first index of an entry -> its waiters
        self._applied = 0
        self._applied_cond = threading.Condition()
        self._paused = False  # a leadership transfer is under way: refuse new submissions
        # past the broker's disk threshold: hand off while a follower can take over
        self._pressure = PressureHandoff(
            cfg.node_id, lambda timeout_s: self.transfer_leadership(timeout_s=timeout_s)
        )
        self._next_handoff_s = 0.0
        self._handing_off = False  # a leader whose disk refuses writes is handing off
        self._noop_index: int | None = None
        self._stamper: Stamper | None = None  # the loop's: set through set_stamper
        self._next_snapshot_try = 0.0
        self._loop = _new_loop()
        self._thread = threading.Thread(target=self._run_loop, name="raft-native", daemon=True)
        self._thread.start()
        storage = JournalStorage(self._journal, MetaStore(cfg.data_dir / "raft.meta"))
        self._node: RaftNodeShell
        try:
            self._call(self._build(storage, applied_hint), timeout_s=30)
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._journal.close()
            raise
        self._applied = self._node.applied
        self._scrub_stop = threading.Event()
        self.scrubber: Scrubber | None = None
        self._scrub_thread: threading.Thread | None = None
        if cfg.scrub_bytes_per_s > 0:
            self.scrubber = Scrubber(self._journal, cfg.scrub_bytes_per_s)
            self._scrub_thread = threading.Thread(
                target=self.scrubber.run,
                args=(self._scrub_stop,),
                name="raft-scrubber",
                daemon=True,
            )
            self._scrub_thread.start()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _call(self, coro: Coroutine[Any, Any, _T], timeout_s: float) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _build(self, storage: JournalStorage, applied_hint: int) -> None:
        node = RaftNodeShell(
            self.cfg,
            storage,
            self.health,
            self._on_committed,
            self._on_role,
            self._on_tick,
            applied_hint,
            self._stamp,
        )
        self._node = node  # before start(): its first tick and role change come back here
        try:
            await node.start()
        except OSError as exc:
            raise RaftLogError(
                f"cannot listen on raft address {self.cfg.node_id}: is another process using "
                "the port?"
            ) from exc

    def _on_corrupt(self, exc: CorruptJournalError) -> None:
        rec = CorruptRecord("journal", exc.path, exc.offset, exc.index, exc.reason)
        self.health.corrupt(rec, time.monotonic())

    # ---- writes (any thread) -------------------------------------------------------------------

    def submit(self, payload: Chunk) -> Future[Committed]:
        """One chunk of the next entry; resolves once it is committed (and applied here)."""
        fut: Future[Committed] = Future()
        [refused] = self.submit_to(_FUTURES, [payload], [fut])
        if isinstance(refused, (EntryTooLargeError, LogClosedError)):
            raise refused
        if refused is not None:  # not leader, queue full: the future's error, as a commit's
            fut.set_exception(refused)
        return fut

    def submit_to(
        self, waiter: CommitWaiter, payloads: Sequence[Chunk], tokens: Sequence[object]
    ) -> list[RaftLogError | None]:
        """Chunks in order, handed to the loop in one call; each accepted one (None in the
        answer) is reported to `waiter` with its token once its commit or failure is known
        (record.CommitWaiter); a refused one's error is its entry in the answer."""
        if self._closed:
            return [LogClosedError("the replicated log is closed") for _ in payloads]
        limit = self.cfg.max_entry_bytes
        refused = None
        if not self._may_submit():
            refused = NotLeaderError(self.cfg.node_id, self._leader_hint())
        out: list[RaftLogError | None] = []
        batch: list[_Submission] = []
        with self._lock:
            for p, token in zip(payloads, tokens, strict=True):
                if len(p) > limit:
                    out.append(EntryTooLargeError(len(p), limit))
                elif refused is not None:
                    out.append(refused)
                elif self._pending_bytes + len(p) > self.cfg.max_pending_bytes:
                    out.append(
                        QueueFullError(
                            f"{self._pending_bytes} bytes already wait for replication "
                            f"(max_pending_bytes={self.cfg.max_pending_bytes}); retry later"
                        )
                    )
                else:
                    self._pending_bytes += len(p)
                    batch.append(_Submission(p, waiter, token))
                    out.append(None)
            wake = bool(batch) and not self._inbox_woken
            if batch:
                self._inbox.extend(batch)
                self._inbox_woken = True
        if wake:
            # One loop wake-up for everything submitted until the loop takes the inbox: a
            # callback per submission starved the loop's ticks (its followers then elected).
            self._loop.call_soon_threadsafe(self._take_inbox)
        return out

    def set_stamper(self, stamper: Stamper | None) -> None:
        """What runs on the loop just before each proposal (record.Stamper): the broker's
        placing of queue offsets (broker/leader_offsets.py)."""
        self._loop.call_soon_threadsafe(setattr, self, "_stamper", stamper)

    def _may_submit(self) -> bool:
        core = self._node.core
        return (
            core.role is Role.LEADER
            and core.transfer_target is None
            and not self._paused
            and self.health.error is None
        )

    # ---- the loop: group commit and completions ------------------------------------------------

    def _take_inbox(self) -> None:
        """Propose everything submitted since the last take, now. Group commit is the inbox:
        what other threads submit while the loop is busy waits there and is taken whole. (A
        loop turn between the take and the proposal batched nothing more: a submission from
        another thread lands in the inbox, behind the proposal's callback, and it cost the
        W2 send a turn and a hand-off of the GIL; bench/w2_timeline.py.)"""
        with self._lock:
            pending, self._inbox = self._inbox, deque()
            self._inbox_woken = False
        if self._stamp is not None:
            self._stamp("raft.inbox", len(pending))
        if pending:
            self._propose(pending)

    def _propose(self, pending: deque[_Submission]) -> None:
        max_bytes, max_chunks = self.cfg.batch_max_bytes, self.cfg.max_chunks_per_entry
        entries: list[list[_Submission]] = []
        chunks: list[list[Chunk]] = []  # each entry's payloads, made once for stamp and encode
        sizes: list[int] = []
        while pending:
            group: list[_Submission] = []
            payloads: list[Chunk] = []
            size = 0
            while pending and len(group) < max_chunks:
                p = pending[0].payload
                if group and size + len(p) > max_bytes:
                    break
                group.append(pending.popleft())
                payloads.append(p)
                size += len(p)
            entries.append(group)
            chunks.append(payloads)
            sizes.append(size)
        try:
            if not self._may_submit():
                raise NotLeaderError(self.cfg.node_id, self._leader_hint())
            stamper = self._stamper
            if stamper is not None:  # the chunks as they will be stored, in log order
                core = self._node.core
                stamper(core.term, core.log.last_index + 1, chunks)
            first, term = self._node.propose([entry_codec.encode_data(c) for c in chunks])
            if self._stamp is not None:
                self._stamp("raft.propose", first + len(chunks) - 1)
        except Exception as exc:  # NotLeaderError, or the stamper's: nothing was proposed
            if not isinstance(exc, NotLeaderError):
                log.exception("raft.stamper_failed node=%s", self.cfg.node_id)
                exc = OutcomeUnknownError(f"the entry was not proposed: {exc!r}")
            failed = _Done()
            for g in entries:
                self._release(g)
                failed.fail(g, exc)
            failed.deliver()
            return
        deadline = time.monotonic() + self.cfg.commit_timeout_ms / 1000
        inflight = self._inflight
        for k, g in enumerate(entries):
            inflight[first + k] = _InFlight(term, g, sizes[k], deadline)
        # The batch is whole (the inbox taken at once) and its waiters are registered
        # (whatever Ready commits it must find them): persist and send it now, not a turn later.
        self._node.ready_now()

    def _release(self, group: Sequence[_Submission]) -> None:
        with self._lock:
            self._pending_bytes -= sum(len(s.payload) for s in group)

    def _release_bytes(self, n: int) -> None:
        with self._lock:
            self._pending_bytes -= n

    def _on_committed(self, entries: tuple[RaftEntry, ...]) -> None:
        done: _Done | None = None
        released = 0
        inflight = self._inflight
        for e in entries:
            waiting = inflight.pop(e.index, None) if inflight else None
            if waiting is None:
                continue
            if done is None:
                done = _Done()
            released += waiting.size_bytes
            if waiting.term == e.term:
                for slot, s in enumerate(waiting.group):
                    done.add(s, Committed(e.term, e.index, slot))
            else:  # another leader's entry committed at this index: ours never will
                done.fail(waiting.group, NotLeaderError(self.cfg.node_id, self._leader_hint()))
        if released:
            self._release_bytes(released)
        if done is not None:  # the answers' wake-up before the dispatcher's, as the futures had
            if self._stamp is not None:
                self._stamp("raft.commit", entries[-1].index)
            done.deliver()
        with self._applied_cond:
            self._applied = entries[-1].index
            self._applied_cond.notify_all()

    def _on_role(self, change: RoleChange) -> None:
        log.info(
            "raft.role node=%s role=%s term=%d leader=%s",
            change.node_id,
            change.role.value,
            change.term,
            change.leader,
        )
        core = self._node.core
        if change.role is LogRole.LEADER:
            self._noop_index = core.log.last_index  # _become_leader appended it last
        else:
            self._noop_index = None
        if change.role is not LogRole.LEADER:
            self._fail_all(
                OutcomeUnknownError("this node lost leadership while the entry was in flight"),
                NotLeaderError(self.cfg.node_id, change.leader),
            )
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:
                log.exception("raftlog.role_listener_failed")

    def _fail_all(self, inflight_exc: RaftLogError, pending_exc: RaftLogError) -> None:
        inflight, self._inflight = list(self._inflight.values()), {}
        with self._lock:
            pending, self._inbox = list(self._inbox), deque()
        failed = _Done()  # every waiting proposal answered, each waiter in one call
        for e in inflight:
            self._release_bytes(e.size_bytes)
            failed.fail(e.group, inflight_exc)
        self._release(pending)
        failed.fail(pending, pending_exc)
        failed.deliver()

    def _on_tick(self) -> None:
        now = time.monotonic()
        if self._inflight:
            expired = [k for k, e in self._inflight.items() if e.deadline <= now]
            if expired:
                late = _Done()
                exc = OutcomeUnknownError("no commit within commit_timeout_ms")
                for k in expired:
                    e = self._inflight.pop(k)
                    self._release_bytes(e.size_bytes)
                    late.fail(e.group, exc)
                late.deliver()
        self.health.settle(now)
        core = self._node.core
        if (
            core.snapshot is None
            and core.log.base_index > 0
            and self._snapshots is not None
            and now >= self._next_snapshot_try
        ):
            self._next_snapshot_try = now + 1.0  # a store read: not every tick
            self._compact_to(core.log.base_index + 1)
        health = self.health
        core.set_eligible(health.error is None and not health.has_corrupt and not self._pressure.on)
        self._hand_off_if_pressed(now)
        error = self.health.error
        if error is None or core.role is not Role.LEADER:
            self._handing_off = False
        elif now >= self._next_handoff_s:
            # A leader whose disk refuses writes hands off to the most caught-up follower.
            if not self._handing_off:  # one line per episode, not one per retry
                self._handing_off = True
                log.warning(
                    "raft.handing_off_leadership node=%s reason=%s",
                    self.cfg.node_id,
                    error.describe().replace(" ", "_"),
                )
            self._next_handoff_s = now + HANDOFF_RETRY_S
            self._fail_all(
                OutcomeUnknownError("the leader's disk refused writes; it hands leadership off"),
                NotLeaderError(self.cfg.node_id, None),
            )
            with contextlib.suppress(TransferRefusedError, NotLeaderError):
                core.transfer_leadership(None)

    # ---- reads (any thread, committed entries only) --------------------------------------------

    @property
    def committed_index(self) -> int:
        return self._applied

    @property
    def first_index(self) -> int:
        return self._journal.first_index

    def read(self, index: int) -> Entry:
        first = self._journal.first_index
        if index < first:
            raise CompactedError(index, first)
        if index > self._applied:
            raise IndexError(f"index {index} is not committed yet (committed: {self._applied})")
        try:
            rec = self._journal.get(index)
        except IndexError:
            first = self._journal.first_index
            if index < first:
                raise CompactedError(index, first) from None
            raise
        return Entry(rec.index, rec.term, entry_codec.decode_data(rec.command))

    def read_from(self, start: int, *, max_bytes: int, max_entries: int) -> list[Entry]:
        """Committed entries from `start` on; a leader's no-op comes back with no chunks."""
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
        deadline = time.monotonic() + timeout_s
        with self._applied_cond:
            while self._applied < index:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._applied_cond.wait(left)
        return True

    # ---- retention -----------------------------------------------------------------------------

    def segments(self) -> list[SegmentInfo]:
        return self._journal.segments()

    def delete_prefix(self, before_index: int) -> Future[int]:
        """Delete whole segments below before_index (applied entries only), on the loop. The
        core is compacted first, to the snapshot the state machine keeps for that cut (a
        follower behind it gets the snapshot); without one nothing is deleted."""
        if before_index > self._applied + 1:
            raise ValueError(
                f"delete_prefix({before_index}) beyond the applied index {self._applied}"
            )

        async def cut() -> int:
            core = self._node.core
            if before_index - 1 > core.log.base_index and not self._compact_to(before_index):
                return self._journal.first_index
            return self._journal.delete_prefix(min(before_index, core.log.base_index + 1))

        return asyncio.run_coroutine_threadsafe(cut(), self._loop)

    def _compact_to(self, first_index: int) -> bool:
        """Loop: move the core's base to the state machine's snapshot for a log starting at
        first_index (its base index is at least first_index - 1). False if there is none yet
        or it is past what this node applied and made durable."""
        core = self._node.core
        store = self._snapshots
        snap = store.snapshot_for(first_index) if store is not None else None
        if snap is None or snap.base_index > min(core.applied, core.durable_index):
            return False
        if snap.base_index > core.log.base_index:
            core.compact(snap.base_index, snap.state)
        elif core.snapshot is None and snap.base_index == core.log.base_index:
            core.snapshot = snap
        return True

    _snapshots: SnapshotStore | None = None

    def set_snapshot_store(self, store: SnapshotStore | None) -> None:
        """Where snapshots come from (a follower behind retention) and go to (installed)."""
        self._snapshots = store
        self._loop.call_soon_threadsafe(self._attach_snapshots)

    def _attach_snapshots(self) -> None:
        node = self._node
        node.install_snapshot = self._install_snapshot if self._snapshots is not None else None
        core = node.core
        if core.snapshot is None and core.log.base_index > 0:
            # A restart after retention: the journal starts past 1 and the core has no
            # snapshot to send a follower behind it until it takes the store's.
            self._compact_to(core.log.base_index + 1)

    def _install_snapshot(self, snap: Snapshot, reset_log: Callable[[], None]) -> None:
        """Loop, a Ready's snapshot: the state machine installs it (waiting for the dispatcher
        between two steps), then the journal restarts after it."""
        store = self._snapshots
        assert store is not None
        log.warning(
            "raft.installing_snapshot node=%s base_index=%d bytes=%d",
            self.cfg.node_id,
            snap.base_index,
            len(snap.state),
        )
        store.install_snapshot(snap, reset_log)
        with self._applied_cond:
            self._applied = max(self._applied, snap.base_index)
            self._applied_cond.notify_all()

    # ---- leadership and status -----------------------------------------------------------------

    def peer_features(self) -> Mapping[str, int]:
        """Peer raft address -> the byte its latest hello said (RaftLogConfig.hello_features;
        0: nothing, a node of before); a peer not heard from since this node started is absent."""
        return self._node.peer_features

    def is_leader(self) -> bool:
        return self._node.core.role is Role.LEADER

    def is_leader_ready(self) -> bool:
        noop = self._noop_index
        return self.is_leader() and noop is not None and self._applied >= noop

    def _leader_hint(self) -> str | None:
        leader = self._node.core.leader
        return None if leader == self.cfg.node_id else leader

    def add_role_listener(self, listener: RoleListener) -> None:
        self._listeners.append(listener)

    def set_disk_pressure(self, on: bool) -> None:
        """The broker's disk guard (any thread): past its threshold this node says it cannot
        lead and, while it leads, hands off to a follower that can (the tick sees to it)."""
        self._pressure.on = on

    def _hand_off_if_pressed(self, now: float) -> None:
        """A leader past its disk threshold hands off (pressure_handoff.py); not while closing or
        while the unwritable disk's own hand-off is under way."""
        if self._closed or self.health.error is not None:
            return
        self._pressure.tick(now, lambda: self.is_leader() and self.can_hand_off())

    def scrub_progress(self) -> tuple[int, int]:
        sc = self.scrubber
        return (sc.bytes_total, sc.passes) if sc is not None else (0, 0)

    def can_hand_off(self) -> bool:
        core = self._node.core
        reach = core.config.election_ticks
        return any(
            pr.eligible and pr.heard_ticks < reach and pr.mode is PeerMode.REPLICATE
            for pr in list(core.progress.values())
        )

    def transfer_leadership(self, target: str | None = None, timeout_s: float = 3.0) -> bool:
        """Hand leadership to `target` or the best follower; True once another node leads.
        New submissions are refused meanwhile; False when none can take over."""
        if not self.is_leader():
            return False
        deadline = time.monotonic() + timeout_s
        grace_until = time.monotonic() + TRANSFER_GRACE_S

        async def run() -> bool:
            core = self._node.core
            self._paused = True
            try:
                while time.monotonic() < deadline:
                    if core.role is not Role.LEADER:
                        if core.leader is not None and core.leader != self.cfg.node_id:
                            return True
                    elif core.transfer_target is None:
                        try:
                            core.transfer_leadership(target)
                        except TransferRefusedError as exc:
                            # A follower not answering may be reconnecting: it gets a grace;
                            # one that said it cannot write is refused at once.
                            if not exc.cannot_write and time.monotonic() < grace_until:
                                await asyncio.sleep(TICK_MS / 1000)
                                continue
                            log.warning(
                                "raft.transfer_refused node=%s to=%s reason=%s",
                                self.cfg.node_id,
                                target,
                                str(exc).replace(" ", "_"),
                            )
                            return False
                        self._node.kick()
                    await asyncio.sleep(TICK_MS / 1000)
                return core.role is not Role.LEADER
            finally:
                self._paused = False

        return self._call(run(), timeout_s + 1)

    def block_peers(self, peers: frozenset[str]) -> None:
        """Fault injection for tests and drills: drop every raft message to and from `peers`."""
        unknown = set(peers) - set(self.cfg.peers)
        if unknown:
            raise ValueError(f"not peers of {self.cfg.node_id}: {sorted(unknown)}")
        self._loop.call_soon_threadsafe(setattr, self._node, "blocked", frozenset(peers))

    def leadership(self) -> tuple[LogRole, int, str | None]:
        core = self._node.core
        return ROLE_OF[core.role], core.term, core.leader

    def status(self) -> LogStatus:
        core = self._node.core
        return LogStatus(
            node_id=self.cfg.node_id,
            role=ROLE_OF[core.role],
            term=core.term,
            leader=core.leader,
            commit_index=core.commit,
            applied_index=self._applied,
            first_index=self._journal.first_index,
            last_index=self._journal.last_index,
            match_index={p: pr.match_index for p, pr in list(core.progress.items())},
            pending_bytes=self._pending_bytes,
        )

    def close(self, transfer_leadership: bool = True) -> None:
        """Leave cleanly: hand leadership off, fail what is pending, stop, flush the journal."""
        if self._closed:
            return
        if transfer_leadership and self.is_leader() and self.cfg.peers:
            self.transfer_leadership(timeout_s=2.0)
        self._closed = True

        async def stop() -> None:
            closed = LogClosedError("the replicated log was closed")
            self._fail_all(closed, closed)
            await self._node.stop()

        self._call(stop(), timeout_s=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._scrub_stop.set()
        if self._scrub_thread is not None:
            self._scrub_thread.join(5)
        self._journal.close()
        with self._applied_cond:
            self._applied_cond.notify_all()

    def __enter__(self) -> NativeLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (the `server` extra, as the data path's), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def _resolve(fut: Future[Committed], value: Committed) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: Future[Committed], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
