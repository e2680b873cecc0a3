"""BrokerNode: one node of a broker group. Composes the CommitLog (the replicated log), the
dispatcher and the message store, gates writes on leadership and replicates them; the broker
operations live in one processor each, as in RocketMQ's broker/processor: produce.py, pull.py,
topics.py, offsets.py, queries.py.

No gRPC here (broker/service.py converts); errors are raftmq.common.errors types, each saying
whose fault it is. Only the leader writes (invariant 6); a produce batch whose queue offsets the
leader placed before replication (broker/leader_offsets.py) is answered once its entry is
committed on a majority, with those offsets, which every replica's dispatcher checks; any other
write is answered once committed and dispatched here.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from raftmq.broker.batch_version import accepted_version, reads_version
from raftmq.broker.commit_log import CommitLog
from raftmq.broker.consumer_registry import ConsumerRegistry
from raftmq.broker.delivery_loop import DeliveryLoop
from raftmq.broker.dispatch import Dispatcher
from raftmq.broker.dispatcher_thread import DispatcherSettings, DispatcherThread, DispatchProgress
from raftmq.broker.errors import (
    DispatcherStoppedError,
    StoreError,
    StoreFullError,
    StoreWriteError,
)
from raftmq.broker.index_repair import IndexRepair
from raftmq.broker.leader_offsets import LeaderOffsets
from raftmq.broker.locks import LockProcessor
from raftmq.broker.metrics import BrokerMetrics
from raftmq.broker.offset_resets import ResetBook
from raftmq.broker.offsets import OffsetProcessor
from raftmq.broker.outcomes import OutcomeBook
from raftmq.broker.produce import SendProcessor
from raftmq.broker.pull import PullProcessor
from raftmq.broker.queries import QueryProcessor
from raftmq.broker.retention_service import BrokerSnapshots, RetentionService
from raftmq.broker.rows import Appended, ChunkOutcome, Rejected, StoredRange
from raftmq.broker.send_back import SendBackProcessor
from raftmq.broker.settings import BrokerSettings
from raftmq.broker.stats import NodeStats
from raftmq.broker.store import MessageReader, MessageStore
from raftmq.broker.time_query import TimeQueryProcessor
from raftmq.broker.topics import TopicProcessor
from raftmq.broker.transaction import TxnSettings
from raftmq.broker.txn_apply import TxnApplier
from raftmq.broker.wakeups import LoopWaker
from raftmq.common import record_batch, stored_batch, timeline
from raftmq.common.errors import (
    BrokerUnavailableError,
    DiskPressureError,
    InternalError,
    InvalidArgumentError,
    MessageTooLargeError,
    NotLeaderError,
    OutcomeUnknownError,
    QueueFullError,
    RaftMQError,
)
from raftmq.common.message import MessageLimits
from raftmq.common.quota_gate import QuotaGate
from raftmq.common.scrape_access import metrics_bind
from raftmq.common.topic_config import TopicConfig
from raftmq.common.types import Member
from raftmq.raftlog import errors as rl_errors
from raftmq.raftlog.native_log import NativeLog
from raftmq.raftlog.record import Chunk, CommitResult, Committed, LogStatus, Role, RoleChange
from raftmq.raftlog.storage_health import StorageHealth

log = logging.getLogger("broker.node")
_STAMP = timeline.process_stamp()  # None unless RAFTMQ_TIMELINE is set (bench/w2_timeline.py)


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


LEADER_READY_WAIT_S = (
    2.0  # a new leader indexes earlier terms' entries first; hold writes that long
)
GATE_RECHECK_S = 0.05  # a write held by the gate rechecks leadership this often
# gRPC calls held for their users' byte quotas take at most max_workers // this many handler
# threads (held long polls take at most half: broker/pull.py), so sends and the rest find one.
QUOTA_HELD_THREADS_SHARE = 4


class BrokerNode:
    """Build it with build_broker_node() (the real log and store) or from any CommitLog and a
    MessageStore (tests); start() it, and close() it once: close hands leadership off and stops
    the log, the dispatcher and the store, which the node then owns."""

    def __init__(
        self,
        settings: BrokerSettings,
        rlog: CommitLog,
        store: MessageStore,
        *,
        leader_ready_wait_s: float = LEADER_READY_WAIT_S,
        dispatcher_settings: DispatcherSettings | None = None,
        health: StorageHealth | None = None,
    ) -> None:
        self.settings = settings
        # Every writer of this node (journal, raft meta, index store) reports to one verdict.
        self.health = health if health is not None else StorageHealth(settings.node_id)
        self.me: Member = settings.me
        self.group = settings.broker_group
        self.members = settings.member_list
        self._by_raft = {m.raft_address: m for m in self.members}
        self._reads_version = reads_version()  # what the Raft hello tells the peers
        self.limits = MessageLimits(max_message_bytes=settings.max_message_bytes)
        self.delay_policy = settings.delay_policy()
        self.store = store
        self.rlog = rlog
        self._loop_commits: dict[LoopWaker, _LoopCommits] = {}  # one per data loop
        self._leader_ready_wait_s = leader_ready_wait_s
        self._role_listeners: list[Callable[[RoleChange], None]] = []
        self._topic_listeners: list[Callable[[], None]] = []
        self.outcomes = OutcomeBook(self.store.dispatched_index)
        # Transactions: the replicated table, restored from the store, applied by the dispatcher.
        self.transactions = TxnApplier(
            TxnSettings(
                transaction_timeout_ms=settings.transaction_timeout_ms,
                check_interval_ms=settings.transaction_check_interval_ms,
                max_checks=settings.transaction_max_checks,
                ended_retention_ms=settings.transaction_ended_retention_ms,
            ),
            store.transaction_values(),
        )
        dispatcher = Dispatcher(transactions=self.transactions)
        if dispatcher_settings is None:
            dispatcher_settings = DispatcherSettings(
                follower_round_ms=settings.follower_dispatch_round_ms,
                leader_round_ms=settings.leader_dispatch_round_ms,
            )
        self.dispatcher = DispatcherThread(
            rlog,
            store,
            dispatcher=dispatcher,
            settings=dispatcher_settings,
            on_progress=self._on_progress,
            name=f"dispatch-{self.me.node_id}",
            health=self.health,
            on_stall=self._on_dispatch_stall,
            is_leader=rlog.is_leader,
        )
        rlog.add_role_listener(self._on_role_change)  # (it tells the dispatcher)
        # A request waiting for its dispatched outcome ends a gathered round, and none is
        # gathered while one waits (a leader gathers too: its placed sends wait on no index).
        self.outcomes.on_wait = self.dispatcher.hurry
        self.dispatcher.add_readers(lambda: self.outcomes.waiting)
        # Offsets by the leader (issue 29): placed just before proposal, answered at commit.
        self.leader_offsets = LeaderOffsets(
            store,
            recent_batches_per_producer=dispatcher.recent_batches_per_producer,
        )
        if settings.leader_places_offsets:
            rlog.set_stamper(self._place_offsets)
        # A row failing its checksum: reported, and the store rebuilt from the log (issue 25).
        self.index_repair = IndexRepair(
            self.me.node_id,
            store,
            self.dispatcher,
            self.transactions,
            self.health,
            scrub_rows_per_s=settings.index_scrub_rows_per_s,
        )
        self.reader = MessageReader(self.group, rlog.read)
        self._ready_term = 0  # the leader term whose readiness latch is open (0: none)
        self.leader_gate_waits = 0  # times a write found the latch closed (once per term, ideally)
        self._closed = False
        # The processors, RocketMQ's broker/processor: each owns one family of requests.
        self.topic_admin = TopicProcessor(self)
        self.sends = SendProcessor(self, self.topic_admin)
        self.pulls = PullProcessor(self, self.topic_admin)
        self.offsets = OffsetProcessor(self, self.topic_admin)
        self.queries = QueryProcessor(self, self.topic_admin)
        self.send_backs = SendBackProcessor(self)  # consumer retries and dead letters
        self.locks = LockProcessor(self)  # orderly consumers' queue locks (issue 16)
        # Consumer membership (soft state): one table per node, whatever transport heartbeats.
        self.consumers = ConsumerRegistry()
        self.consumers_lock = threading.Lock()
        self.resets = ResetBook()  # recent offset resets, told to the group's heartbeats
        # Both transports count into it, once per request; nothing is counted without an
        # endpoint that serves the counts.
        self.metrics = BrokerMetrics(
            self, enabled=metrics_bind(settings.metrics_listen) is not None
        )
        # Byte quotas per user (issue 27): one book for both transports, so that a user moves
        # its quota in all, not per port; charged by the data server's loop and gRPC threads.
        self.quota = QuotaGate(
            settings.quota_tables(),
            max_held_threads=max(1, settings.max_workers // QUOTA_HELD_THREADS_SHARE),
            max_held_threads_per_user=settings.quota_max_held_calls_per_user,
        )
        self.metrics.quota_usage = self.quota.usage
        # Resource reports (broker/stats.py): per-minute counts, one call per batch.
        self.stats = NodeStats(
            settings.data_dir / "stats.sqlite3",
            retention_ms=settings.stats_retention_ms,
            flush_interval_ms=settings.stats_flush_interval_ms,
            max_rows=settings.stats_max_rows,
        )
        # Delayed delivery: the leader moves due messages to their queues (broker/delivery.py).
        self.delivery = DeliveryLoop(self, deliver_batch=settings.delay_deliver_batch)
        self.time_queries = TimeQueryProcessor(self, self.topic_admin)
        # Retention (broker/retention_service.py; built with the real log): why sends are
        # refused right now (the disk guard), None while they are accepted.
        self.retention: RetentionService | None = None
        self.disk_pressure: str | None = None
        self.disk_pressure_movable = False  # the disk ratio alone: a follower with room helps

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self.dispatcher.start()
        self.index_repair.start()
        self.delivery.start()
        self.stats.start()
        if self.retention is not None:
            self.retention.start()

    def close(self) -> None:
        """Hand leadership off (writers see no error), then stop the log, dispatcher, store."""
        if self._closed:
            return
        self._closed = True
        self.delivery.stop()
        self.stats.stop()
        if self.retention is not None:
            self.retention.stop()
        self.rlog.close(transfer_leadership=True)
        self.index_repair.close()
        self.dispatcher.stop()
        self.store.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def add_role_listener(self, listener: Callable[[RoleChange], None]) -> None:
        self._role_listeners.append(listener)

    def add_topic_listener(self, listener: Callable[[], None]) -> None:
        """Called (on the dispatcher thread) after topic configuration changed."""
        self._topic_listeners.append(listener)

    def _on_role_change(self, change: RoleChange) -> None:
        log.info(
            "broker.role_change node=%s role=%s term=%d leader=%s",
            self.me.node_id,
            change.role.value,
            change.term,
            change.leader,
        )
        if change.role is Role.LEADER:  # its latch waits for the index: no gathered round
            self.dispatcher.hurry()
        for listener in list(self._role_listeners):
            try:
                listener(change)
            except Exception:
                log.exception("broker.role_listener_failed")

    def _on_dispatch_stall(self, exc: StoreWriteError) -> None:
        """The index store refuses writes: requests waiting for their entry's dispatch here end
        now. Their entries are committed on a majority, so a retry with the same producer
        sequence is answered by the next leader (this one hands leadership off)."""
        self.outcomes.release(
            OutcomeUnknownError(
                f"committed on broker group {self.group} but not indexed on {self.me.node_id}, "
                f"whose disk refuses writes ({exc.cause}); retry with the same producer sequence"
            )
        )

    def _on_progress(self, progress: DispatchProgress) -> None:
        self.outcomes.record(progress)
        for out in progress.outputs:
            if out.offset_rows and any(r.reset for r in out.offset_rows):
                with self.consumers_lock:
                    self.resets.record(out.raft_index, out.offset_rows, _monotonic_ms())
        if any(out.topic_rows for out in progress.outputs):
            for listener in list(self._topic_listeners):
                try:
                    listener()
                except Exception:
                    log.exception("broker.topic_listener_failed")

    def _place_offsets(
        self, term: int, first_index: int, entries: Sequence[Sequence[Chunk]]
    ) -> None:
        """The log's stamper (the Raft loop, in log order): the leader's offset book places
        what it can count exactly, knowing how far this node has dispatched."""
        d = self.dispatcher
        dispatched, installs = d.progress()
        self.leader_offsets.place(term, first_index, dispatched, installs, entries)
        if d.installs != installs:  # the store was replaced while the book read it
            raise StoreError(
                f"node {self.me.node_id}'s index store was replaced while offsets were placed; "
                "nothing was proposed: retry the send"
            )

    # ---- status -------------------------------------------------------------------------------

    def topic(self, name: str) -> TopicConfig | None:
        return self.store.topic(name)

    def topics(self) -> list[TopicConfig]:
        return self.store.topics()

    def status(self) -> LogStatus:
        return self.rlog.status()

    # ---- leadership ---------------------------------------------------------------------------

    def member_for_raft(self, raft_address: str | None) -> Member | None:
        return self._by_raft.get(raft_address) if raft_address else None

    def leader(self) -> Member | None:
        role, _, leader = self.rlog.leadership()
        if role is Role.LEADER:
            return self.me
        return self.member_for_raft(leader)

    def batch_version(self) -> int:
        """The newest stored batch version this group writes and accepts from producers now:
        the oldest any member reads (broker/batch_version.py). Per call O(members)."""
        me = self.me.node_id
        peers = (m.raft_address for m in self.members if m.node_id != me)
        return accepted_version(self._reads_version, self.rlog.peer_features(), peers)

    def term(self) -> int:
        """The log's current term (what an answer names)."""
        return self.rlog.leadership()[1]

    def not_leader(self) -> NotLeaderError:
        leader = self.leader()
        hint = leader.address if leader is not None and leader is not self.me else ""
        return NotLeaderError.for_node(self.me.node_id, self.group, hint)

    def require_leader(self) -> None:
        """The leader gate, a readiness latch per leader term. A new leader answers nothing from
        its tables (topic config, producer sequences, offsets) until its dispatcher has applied
        every entry committed in earlier terms, that is, until it has dispatched an entry of its
        own term (its no-op comes after all of them in the log). From then on the latch stays
        open for the rest of the term, and writes pass without waiting on the dispatcher (a
        send answered at its commit is read back by pulls, bounds and id queries, which catch
        up with the index first)."""
        if self._closed:
            raise BrokerUnavailableError(f"node {self.me.node_id} is shutting down")
        role, term, _ = self.rlog.leadership()
        if role is not Role.LEADER:
            raise self.not_leader()
        if term == self._ready_term:
            return
        # The term is read after the role: if leadership moved on meanwhile, it can only be
        # newer than the term led when the role was read, which errs on the waiting side.
        self.leader_gate_waits += 1
        deadline = time.monotonic() + self._leader_ready_wait_s
        while True:
            ready = self._wait_term(term, min(GATE_RECHECK_S, deadline - time.monotonic()))
            if self._closed:
                raise BrokerUnavailableError(f"node {self.me.node_id} is shutting down")
            if not self.rlog.is_leader():
                raise self.not_leader()
            if ready:
                break
            if time.monotonic() >= deadline:
                raise NotLeaderError.for_node(self.me.node_id, self.group, "")
        self._ready_term = max(self._ready_term, term)

    def leader_gate_open(self) -> bool:
        """`require_leader` would pass at once (no wait): leader, latch of this term open."""
        if self._closed:
            return False
        role, term, _ = self.rlog.leadership()
        return role is Role.LEADER and term == self._ready_term

    def _wait_term(self, term: int, timeout_s: float) -> bool:
        try:
            return self.dispatcher.wait_term(term, timeout_s)
        except DispatcherStoppedError as exc:
            raise self.dispatcher_down(exc) from exc

    def check_disk_pressure(self) -> None:
        """Sends are refused while the disk guard says so (offsets and reads go on), unless
        only this node's disk is too full and a follower could take over: the log hands
        leadership to it (NativeLog.set_disk_pressure) and sends go on until it leads."""
        reason = self.disk_pressure
        if reason is not None and not (self.disk_pressure_movable and self.rlog.can_hand_off()):
            raise DiskPressureError(
                f"node {self.me.node_id} of broker group {self.group} refuses sends: {reason}; "
                "nothing was stored; retry later (retention frees space) or free disk space",
                details={"node_id": self.me.node_id, "retry_after_ms": "1000"},
            )

    def require_readable(self, allow_follower_read: bool) -> None:
        if self._closed:
            raise BrokerUnavailableError(f"node {self.me.node_id} is shutting down")
        if not allow_follower_read and not self.rlog.is_leader():
            raise self.not_leader()

    def wait_dispatched(self, index: int, timeout_s: float) -> bool:
        try:
            return self.dispatcher.wait_dispatched(index, timeout_s)
        except DispatcherStoppedError as exc:
            raise self.dispatcher_down(exc) from exc

    def dispatcher_down(self, exc: BaseException) -> RaftMQError:
        if isinstance(exc, OutcomeUnknownError):
            return exc  # released by a dispatch stall (_on_dispatch_stall): already typed
        if self._closed:
            return BrokerUnavailableError(f"node {self.me.node_id} is shutting down")
        failure = self.dispatcher.failure
        if isinstance(failure, StoreFullError):
            return BrokerUnavailableError(
                f"node {self.me.node_id}'s index store is full ({failure}); raise "
                "store_map_size_bytes and restart it"
            )
        return InternalError(f"node {self.me.node_id}'s dispatcher stopped: {failure or exc}")

    def transfer_leadership(self, target_node_id: str, timeout_s: float) -> bool:
        if not self.rlog.is_leader():
            raise self.not_leader()
        target: str | None = None
        if target_node_id:
            member = next((m for m in self.members if m.node_id == target_node_id), None)
            if member is None:
                raise InvalidArgumentError(
                    f"node {target_node_id!r} is not a member of {self.group} "
                    f"({', '.join(m.node_id for m in self.members)})"
                )
            target = member.raft_address
        return self.rlog.transfer_leadership(target, timeout_s=timeout_s)

    # ---- replication --------------------------------------------------------------------------

    def submit(self, payload: Chunk) -> Future[Committed]:
        try:
            return self.rlog.submit(payload)
        except (rl_errors.EntryTooLargeError, rl_errors.LogClosedError) as exc:
            raise self._submit_error(exc) from exc

    def _submit_error(self, exc: rl_errors.RaftLogError) -> RaftMQError:
        if isinstance(exc, rl_errors.EntryTooLargeError):
            return MessageTooLargeError(
                f"the request encodes to {exc.size_bytes} bytes; one request may carry at most "
                f"{exc.max_bytes}: send fewer or smaller messages per batch",
                details={"size_bytes": str(exc.size_bytes), "max_bytes": str(exc.max_bytes)},
            )
        return BrokerUnavailableError(f"node {self.me.node_id} is shutting down")

    # The error a failed or late replication answers, shared by the blocking and the async
    # path so the two transports cannot drift.

    def _commit_timeout(self) -> OutcomeUnknownError:
        return OutcomeUnknownError(
            f"not committed within {self.settings.send_timeout_ms} ms on broker group "
            f"{self.group}; it may still be: retry with the same producer sequence"
        )

    def _commit_failure(self, exc: BaseException) -> RaftMQError | None:
        """The typed error of a failed commit future; None: not a log error (a bug)."""
        if isinstance(exc, rl_errors.NotLeaderError):
            return self.not_leader()
        if isinstance(exc, rl_errors.QueueFullError):
            return QueueFullError(f"broker group {self.group}: {exc}")
        if isinstance(exc, rl_errors.OutcomeUnknownError):
            return OutcomeUnknownError(
                f"broker group {self.group} lost leadership before the commit was known ({exc}); "
                "retry with the same producer sequence on the new leader"
            )
        if isinstance(exc, rl_errors.LogClosedError):
            return BrokerUnavailableError(f"node {self.me.node_id} is shutting down")
        return None

    def _no_outcome(self, index: int) -> RaftMQError:
        """Committed, but no outcome within the wait (or forgotten)."""
        if self.dispatcher.failure is not None or not self.dispatcher.running:
            return self.dispatcher_down(DispatcherStoppedError("stopped"))
        return OutcomeUnknownError(
            f"entry {index} is committed but not yet indexed on {self.me.node_id}; "
            "retry with the same producer sequence"
        )

    def _await_commit(self, fut: Future[Committed], deadline: float) -> Committed:
        try:
            return fut.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout as exc:
            raise self._commit_timeout() from exc
        except Exception as exc:
            mapped = self._commit_failure(exc)
            if mapped is None:
                raise
            raise mapped from exc

    def _placed_outcome(self, payload: Chunk, c: Committed) -> ChunkOutcome | None:
        """The answer at commit (issue 29): a produce batch whose base offset the leader
        placed is Appended there once its entry commits, without waiting for its dispatch
        (every replica's dispatcher checks the offset and stops on a disagreement). None: the
        dispatcher decides (offsets left to it, or another chunk)."""
        if not stored_batch.is_stored(payload):
            return None
        base = stored_batch.placed_offset(payload)
        if base is None:
            return None
        if self.dispatcher.failure is not None:  # committed, but this node's index is stuck
            raise self.dispatcher_down(self.dispatcher.failure)
        h = stored_batch.read_header(payload)
        return Appended(c.slot, h.topic, h.queue_id, StoredRange(base, h.count, c.index, c.slot))

    def replicate(self, payloads: Sequence[Chunk], timeout_s: float) -> list[ChunkOutcome]:
        """Submit chunks, wait for their commit and dispatch; the dispatcher's verdict of each
        (or, for a batch whose offsets the leader placed, the answer at commit)."""
        deadline = time.monotonic() + timeout_s
        futures = [self.submit(p) for p in payloads]
        committed = [self._await_commit(f, deadline) for f in futures]
        outcomes: list[ChunkOutcome] = []
        for payload, c in zip(payloads, committed, strict=True):
            placed = self._placed_outcome(payload, c)
            if placed is not None:
                outcomes.append(placed)
                continue
            try:
                outcome = self.outcomes.wait(
                    c.index, c.slot, max(0.05, deadline - time.monotonic())
                )
            except Exception as exc:
                raise self.dispatcher_down(exc) from exc
            if outcome is None:
                raise self._no_outcome(c.index)
            outcomes.append(outcome)
        return outcomes

    def replicate_record(self, record: record_batch.BrokerRecord, what: str) -> ChunkOutcome:
        """One admin record (a topic, group or purge change) replicated within the send timeout;
        the dispatcher's refusal is the caller's InvalidArgumentError, saying `what` was refused."""
        outcome = self.replicate(
            [record_batch.encode(record)], self.settings.send_timeout_ms / 1000
        )
        if isinstance(outcome[0], Rejected):
            raise InvalidArgumentError(f"{what} refused: {outcome[0].reason}")
        return outcome[0]

    async def replicate_async(
        self, payloads: Sequence[Chunk], timeout_s: float, waker: LoopWaker
    ) -> list[ChunkOutcome]:
        """`replicate` without a blocked thread, for handlers on `waker`'s event loop: each
        chunk's outcome, or the first chunk's error in order (`replicate`'s errors, by the
        same functions)."""
        outcomes: list[ChunkOutcome] = []
        for r in await self.replicate_each_async(payloads, timeout_s, waker):
            if isinstance(r, RaftMQError):
                raise r
            outcomes.append(r)
        return outcomes

    async def replicate_each_async(
        self, payloads: Sequence[Chunk], timeout_s: float, waker: LoopWaker
    ) -> list[ChunkOutcome | RaftMQError]:
        """`replicate_async` answering each chunk on its own: its outcome or its typed error,
        never raising for one chunk (the fast data path answers each queue batch apart). The
        chunks are submitted in order, so the batcher packs them into one entry when they fit.

        The log reports the commits to this loop's waiter (_LoopCommits) in one batch per
        commit advance, and the request's one loop future is done when its last chunk's
        result is in: one wake-up of the loop per advance, whatever it commits. A batch whose
        offsets the leader placed is answered at its commit; any other chunk then waits, as a
        loop future the dispatcher thread completes, for its dispatched outcome."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout_s
        req = _Request(loop, len(payloads))
        commits = self._loop_commits.get(waker)
        if commits is None:
            commits = self._loop_commits.setdefault(waker, _LoopCommits(waker))
        if _STAMP is not None:
            _STAMP("node.submit", len(payloads))
        refused = self.rlog.submit_to(commits, payloads, [(req, k) for k in range(len(payloads))])
        for k, r in enumerate(refused):
            if r is not None:
                req.put(k, r, waker)
        await _wait_for(req.future, timeout_s)  # never cancels what it waits on
        if _STAMP is not None:
            _STAMP("node.resumed", len(payloads))
        results: list[ChunkOutcome | RaftMQError] = []
        dispatched: list[tuple[int, Committed, asyncio.Future[ChunkOutcome]]] = []
        for k, (payload, c) in enumerate(zip(payloads, req.results, strict=True)):
            if c is None:  # neither committed nor failed yet
                results.append(self._commit_timeout())
            elif isinstance(c, Committed):
                try:
                    placed = self._placed_outcome(payload, c)
                except RaftMQError as down:
                    results.append(down)
                    continue
                if placed is None:  # the dispatcher's verdict: waited for below
                    dispatched.append((k, c, loop.create_future()))
                    results.append(self._no_outcome(c.index))
                else:
                    results.append(placed)
            elif isinstance(c, (rl_errors.EntryTooLargeError, rl_errors.LogClosedError)):
                results.append(self._submit_error(c))
            else:
                mapped = self._commit_failure(c)
                if mapped is None:
                    raise c  # not a typed error: a bug, answered as INTERNAL
                results.append(mapped)
        if dispatched:
            await self._await_outcomes(dispatched, results, deadline, waker)
        return results

    async def _await_outcomes(
        self,
        dispatched: list[tuple[int, Committed, asyncio.Future[ChunkOutcome]]],
        results: list[ChunkOutcome | RaftMQError],
        deadline: float,
        waker: LoopWaker,
    ) -> None:
        """The dispatcher's outcome of each committed chunk in `dispatched`, into `results`
        (left at _no_outcome when it is not known by the deadline)."""
        gather = _Gather(waker, len(dispatched), asyncio.get_running_loop())
        for _k, c, answer in dispatched:
            self._on_dispatched(gather, answer, c)
        try:
            await gather.wait(max(0.05, deadline - time.monotonic()))
            for k, _c, answer in dispatched:
                if not answer.done():
                    continue
                failed = answer.exception()
                if failed is None:
                    results[k] = answer.result()
                elif isinstance(failed, RaftMQError):
                    results[k] = failed
                else:
                    raise failed  # not a typed error: a bug, answered as INTERNAL
        finally:
            for _k, _c, answer in dispatched:
                if answer.done():
                    answer.exception()  # retrieved: an unread failure is not logged as lost
                else:
                    answer.cancel()  # a late completion is dropped by the waker

    def _on_dispatched(
        self, waker: _Gather, answer: asyncio.Future[ChunkOutcome], c: Committed
    ) -> None:
        """The loop: `answer` completes with the committed chunk's dispatched outcome."""

        def on_outcome(outcome: ChunkOutcome | None, failure: BaseException | None) -> None:
            if failure is not None:
                waker.set_exception(answer, self.dispatcher_down(failure))
            elif outcome is None:
                waker.set_exception(answer, self._no_outcome(c.index))
            else:
                waker.set_result(answer, outcome)

        try:
            self.outcomes.on_outcome(c.index, c.slot, on_outcome)
        except RuntimeError as full:
            waker.set_exception(answer, QueueFullError(f"node {self.me.node_id}: {full}"))


class _Request:
    """One request's chunks on their way to commit: each one's result by position (a
    Committed or the log's typed error), and the loop future done once the last is in. Filled
    by the log's loop thread (_LoopCommits) and, for the chunks the log refused at once, by
    the request's own loop: the count is under a lock."""

    __slots__ = ("_left", "_lock", "future", "results")

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self.future: asyncio.Future[None] = loop.create_future()
        self.results: list[CommitResult | None] = [None] * count
        self._left = count
        self._lock = threading.Lock()
        if count == 0:
            self.future.set_result(None)

    def put(self, k: int, result: CommitResult, waker: LoopWaker) -> None:
        """The loop's own: a chunk the log refused."""
        if self.record(k, result):
            waker.set_result(self.future, None)

    def record(self, k: int, result: CommitResult) -> bool:
        """Any thread: True when this was the last result."""
        self.results[k] = result
        with self._lock:
            self._left -= 1
            return self._left == 0


class _LoopCommits:
    """The log's CommitWaiter (raftlog.record) for one event loop's requests: the results of
    one commit advance arrive in one call on the log's loop thread, and every request they
    finish is completed through the loop's waker in one post (one wake-up per advance, where a
    concurrent future per chunk, its callbacks and two posts each cost the Raft loop ~30 % of
    its Python per entry)."""

    __slots__ = ("_waker",)

    def __init__(self, waker: LoopWaker) -> None:
        self._waker = waker

    def committed(self, done: list[tuple[Any, CommitResult]]) -> None:
        finished: list[asyncio.Future[Any]] = []
        for (req, k), result in done:
            if req.record(k, result):
                finished.append(req.future)
        if finished:
            self._waker.set_results(finished, None)


async def _wait_for(fut: asyncio.Future[None], timeout_s: float) -> None:
    """Until `fut` is done or `timeout_s` passed; never raises the timeout or cancels `fut`."""
    if fut.done():
        return
    timer = fut.get_loop().call_later(timeout_s, _finish, fut)
    try:
        await fut
    finally:
        timer.cancel()


class _Gather:
    """The answers of one request, completed through its loop's waker, and one loop future
    done when the last of them is (or at the deadline): the handler awaits that one future, so
    its answer leaves one loop turn after the commit (asyncio.wait took two, and the loop ran
    whatever else was ready in between)."""

    __slots__ = ("_all", "_left", "_lock", "_waker")

    def __init__(self, waker: LoopWaker, count: int, loop: asyncio.AbstractEventLoop) -> None:
        self._waker = waker
        self._left = count
        self._lock = threading.Lock()  # commits complete on the Raft thread or the loop's
        self._all: asyncio.Future[None] = loop.create_future()
        if count == 0:
            self._all.set_result(None)

    def set_result(self, fut: asyncio.Future[ChunkOutcome], value: ChunkOutcome) -> None:
        self._waker.set_result(fut, value)
        self._one_done()

    def set_exception(self, fut: asyncio.Future[ChunkOutcome], exc: BaseException) -> None:
        self._waker.set_exception(fut, exc)
        self._one_done()

    def _one_done(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:  # after its answers: the waker completes in order
            self._waker.set_result(self._all, None)

    async def wait(self, timeout_s: float) -> None:
        """Until every answer is done or `timeout_s` passed; never raises the timeout."""
        await _wait_for(self._all, timeout_s)


def _finish(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def build_broker_node(settings: BrokerSettings) -> BrokerNode:
    """The node of a broker process: its message store and its Raft log (raftmq's own core,
    NativeLog) under settings.data_dir."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = MessageStore(settings.data_dir / "store", map_size_bytes=settings.store_map_size_bytes)
    health = StorageHealth(settings.node_id)
    try:
        cfg = settings.raft_config()
        # The store's dispatched entries were committed: readable at once after a restart.
        rlog = NativeLog(
            cfg,
            health=health,
            applied_hint=store.dispatched_index,
            stamp=timeline.process_stamp(),
        )
    except BaseException:
        store.close()
        raise
    node = BrokerNode(settings, rlog, store, health=health)
    node.retention = RetentionService(node, rlog)
    rlog.set_snapshot_store(BrokerSnapshots(node))
    return node
