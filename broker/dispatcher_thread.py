"""The dispatch loop: one thread follows the committed log, runs the Dispatcher and writes outputs
to the MessageStore, several entries per transaction. It decides nothing, and on any failure it
stops loudly rather than skip an entry, except a write the disk refused (full): that transaction
is retried with a bounded back-off, reported through the node's StorageHealth."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from raftmq.broker.dispatch import Dispatcher, DispatchOutput, PendingState
from raftmq.broker.errors import (
    CorruptRowError,
    DispatcherStoppedError,
    OffsetDisagreementError,
    StoreWriteError,
)
from raftmq.broker.retention_store import log_cut
from raftmq.broker.rows import Rejected
from raftmq.broker.store import MessageStore
from raftmq.common import timeline
from raftmq.common.frozen_init import frozen_init
from raftmq.raftlog.errors import CompactedError
from raftmq.raftlog.record import Entry
from raftmq.raftlog.storage_health import StorageHealth

log = logging.getLogger("broker.dispatcher")

MIB = 1 << 20
CORRUPT_ROW_WAIT_S = 0.1  # a step that read a corrupt row waits this long for the rebuild


class CommittedLog(Protocol):
    """The part of raftlog's NativeLog the dispatcher follows."""

    @property
    def committed_index(self) -> int: ...

    def wait_committed(self, index: int, timeout_s: float) -> bool: ...

    def read_from(self, start: int, *, max_bytes: int, max_entries: int) -> list[Entry]: ...


@dataclass(frozen=True, slots=True)
class DispatcherSettings:
    max_batch_entries: int = 256  # entries dispatched per lmdb transaction, at most
    max_batch_bytes: int = 16 * MIB  # entry bytes read per transaction (one entry may exceed it)
    poll_timeout_ms: int = 100  # longest wait for a commit before checking for stop()
    # A follower nobody reads from dispatches in rounds: at most this long after the first
    # committed entry waiting (0: at once, every node). See DispatcherThread._gather.
    follower_round_ms: int = 0
    # The same for a leader whose index no reader and no outcome waits on (its sends are
    # answered at their commit).
    leader_round_ms: int = 0

    def __post_init__(self) -> None:
        if self.max_batch_entries < 1 or self.max_batch_bytes < 1 or self.poll_timeout_ms < 1:
            raise ValueError("dispatcher batch limits and poll timeout must be positive")
        if self.follower_round_ms < 0 or self.leader_round_ms < 0:
            raise ValueError("follower_round_ms and leader_round_ms must be >= 0")


@frozen_init
@dataclass(frozen=True, slots=True)
class DispatchProgress:
    """What one transaction dispatched: for answering producers and waking long polls."""

    dispatched_index: int
    outputs: tuple[DispatchOutput, ...]
    queue_next_offsets: Mapping[tuple[str, int], int]  # (topic, queue id) -> max offset exclusive


ProgressListener = Callable[[DispatchProgress], None]
_STAMP = timeline.process_stamp()  # None unless RAFTMQ_TIMELINE is set (bench/w2_timeline.py)


class DispatcherThread:
    """Follows `rlog` from the store's dispatched index. Start it once; stop() it to leave."""

    def __init__(
        self,
        rlog: CommittedLog,
        store: MessageStore,
        *,
        dispatcher: Dispatcher | None = None,
        settings: DispatcherSettings | None = None,
        on_progress: ProgressListener | None = None,
        name: str = "broker-dispatcher",
        health: StorageHealth | None = None,
        on_stall: Callable[[StoreWriteError], None] | None = None,
        is_leader: Callable[[], bool] | None = None,
    ) -> None:
        self._log = rlog
        # None: a lone log, a bench: no round is gathered.
        self._is_leader = is_leader
        self._on_stall = on_stall
        self.health = health if health is not None else StorageHealth(name)
        self._store = store
        self._dispatcher = dispatcher if dispatcher is not None else Dispatcher()
        self._settings = settings if settings is not None else DispatcherSettings()
        self._listeners: list[ProgressListener] = [on_progress] if on_progress else []
        self._cond = threading.Condition()  # guards _index, _failure; notified on progress
        self._waiting = 0  # threads in _wait's cond.wait (guarded by _cond)
        self._index = store.dispatched_index
        self._term = 0  # term of the last entry dispatched by this thread (0: none yet)
        self.installs = 0  # store replacements (install): the leader's offset book forgets
        self._failure: BaseException | None = None
        self._stopping = threading.Event()
        # Set when someone wants this node's index now: a thread in _wait, a held pull, a
        # leader elected here (hurry()); ends a gathered round early.
        self._hurry = threading.Event()
        # Readers parked elsewhere than _wait (the data server's held pulls, the requests
        # waiting for their outcome): their count.
        self._readers: list[Callable[[], int]] = []
        self.rounds_gathered = 0  # rounds this node delayed to share their fixed costs
        self._step_lock = threading.Lock()  # held per loop step: a snapshot install waits for it
        self._name = name
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        self._hurry.set()  # a gathered round ends now
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> DispatcherThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stopping.is_set()

    @property
    def failure(self) -> BaseException | None:
        """Why the thread stopped itself, if it did (a gap, a full store, a bug)."""
        return self._failure

    def add_listener(self, listener: ProgressListener) -> None:
        """Listeners run on the dispatcher thread after each transaction: keep them quick."""
        self._listeners.append(listener)

    def add_readers(self, count: Callable[[], int]) -> None:
        """`count()`: readers of this node's index parked outside wait_* (held pulls); while
        it is above 0 no round is gathered. Its owner calls hurry() when one parks."""
        self._readers.append(count)

    def hurry(self) -> None:
        """Someone wants this node's index as of its commit: end a gathered round now."""
        self._hurry.set()

    # ---- waiting (any thread) -----------------------------------------------------------------

    @property
    def dispatched_index(self) -> int:
        return self._index

    def progress(self) -> tuple[int, int]:
        """(dispatched index, store replacements) read together: the leader's offset book
        trusts the store's rows up to that index only while no install replaced it."""
        with self._cond:
            return self._index, self.installs

    @property
    def committed_index(self) -> int:
        """The log's commit index: what dispatch follows."""
        return self._log.committed_index

    @property
    def dispatched_term(self) -> int:
        """Term of the last entry this thread dispatched; 0 before the first."""
        return self._term

    def wait_term(self, term: int, timeout_s: float) -> bool:
        """Block until an entry of `term` (or later) is dispatched: by Raft's log order every
        entry of earlier terms is then dispatched too. False on timeout."""
        return self._wait(lambda: self._term >= term, timeout_s)

    def wait_dispatched(self, index: int, timeout_s: float) -> bool:
        """Block until `index` is dispatched (its rows are readable); False on timeout."""
        return self._wait(lambda: self._index >= index, timeout_s)

    def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Long polling: block until the queue holds a message at `offset` (or beyond)."""
        return self._wait(lambda: self._store.queue_bounds(topic, queue_id)[1] > offset, timeout_s)

    def _wait(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not ready():
                if self._failure is not None or self._stopping.is_set():
                    raise DispatcherStoppedError(
                        f"the dispatcher is not running (failure: {self._failure!r})"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._waiting += 1
                self._hurry.set()  # after the count: a round gathered from now on sees it
                try:
                    self._cond.wait(left)
                finally:
                    self._waiting -= 1
        return True

    # ---- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        s = self._settings
        poll_s = s.poll_timeout_ms / 1000
        try:
            while not self._stopping.is_set():
                if not self._log.wait_committed(self._index + 1, poll_s):
                    continue
                self._gather()  # outside the step lock: an install or rebuild never waits on it
                if self._stopping.is_set():  # stop() ended the round: leave, as between rounds
                    break
                with self._step_lock:
                    nxt = self._index + 1
                    if self._log.committed_index < nxt:  # an install moved the index past it
                        continue
                    entries = self._log.read_from(
                        nxt, max_bytes=s.max_batch_bytes, max_entries=s.max_batch_entries
                    )
                    if len(entries) > s.max_batch_entries:
                        entries = entries[: s.max_batch_entries]
                    if entries:
                        self._dispatch_or_back_off(entries)
        except CompactedError as exc:
            log.critical(
                "broker.dispatcher_behind_retention index=%d first_index=%d: this node's index "
                "store is older than its journal, whose prefix retention deleted (an index store "
                "deleted or lost since); stop the node and empty its data directory: it then "
                "gets a snapshot from the leader",
                self._index,
                exc.first_index,
            )
            with self._cond:
                self._failure = exc
                self._cond.notify_all()
        except OffsetDisagreementError as exc:
            log.critical(
                "broker.offset_disagreement node=%s topic=%s queue=%d placed=%d counted=%s "
                "index=%d slot=%d: %s; this node's dispatch stopped rather than index its "
                "queue differently from the leader's (a forged or corrupted entry, or a bug): "
                "it serves no reads or writes that need its index; keep the journal and "
                "report it",
                self._name.removeprefix("dispatch-"),
                exc.topic,
                exc.queue_id,
                exc.placed,
                "none" if exc.counted is None else exc.counted,
                exc.raft_index,
                exc.slot,
                exc.reason,
            )
            with self._cond:
                self._failure = exc
                self._cond.notify_all()
        except Exception as exc:
            log.exception("broker.dispatcher_failed index=%d", self._index)
            with self._cond:
                self._failure = exc
                self._cond.notify_all()

    def _gather(self) -> None:
        """On a node that nobody reads from, wait up to its round (follower_round_ms, or
        leader_round_ms while it leads; from the first committed entry waiting) so that one
        round dispatches the entries committed meanwhile: a round's fixed costs (the wake-up,
        the journal read, the listeners, one lmdb transaction and each touched queue's head
        and producer rows) are then paid once per round instead of once per entry. No send
        placed by the leader waits on an index (it is answered at its commit); whoever does
        wait on it ends the round at once: a thread in wait_* (a blocking pull's catch-up or
        long poll, the leader latch of a node just elected), a held pull or a request
        waiting for its dispatched outcome (add_readers, and their owners' hurry()), the node
        elected leader (hurry()). A backlog of a whole round is dispatched at once."""
        is_leader = self._is_leader
        if is_leader is None:
            return
        leading = is_leader()
        s = self._settings
        round_ms = s.leader_round_ms if leading else s.follower_round_ms
        if round_ms <= 0:
            return
        self._hurry.clear()  # before the checks: a reader arriving after them sets it again
        if (
            self._waiting
            or any(count() for count in self._readers)
            # (again: elected since, its hurry() may have come before clear())
            or is_leader() is not leading
            or self._log.committed_index - self._index >= s.max_batch_entries
        ):
            return
        self.rounds_gathered += 1
        self._hurry.wait(round_ms / 1000)

    def install(self, replace: Callable[[], tuple[int, int]]) -> None:
        """Run `replace` (a snapshot install: it swaps the store and the log and returns the
        new dispatched index and its term) between two steps, then go on from there."""
        with self._step_lock:
            index, term = replace()
            with self._cond:
                self.installs += 1
                self._index = index
                self._term = max(self._term, term)
                self._cond.notify_all()

    def _dispatch_or_back_off(self, entries: list[Entry]) -> None:
        now = time.monotonic()
        try:
            self._dispatch(entries)
        except StoreWriteError as exc:
            backoff_s = self.health.failed("index store", exc.path, exc.cause, now)
            self._reload_transactions()
            if self._on_stall is not None:
                self._on_stall(exc)
            self._stopping.wait(backoff_s)  # then the same entries again: nothing was stored
            return
        except CorruptRowError:
            # A row dispatch read failed its check (already reported: broker/index_repair.py
            # rebuilds the store between two steps). Nothing was stored; wait, then go on from
            # wherever the rebuild left the store, rather than stop the node's dispatch.
            self._reload_transactions()
            self._stopping.wait(CORRUPT_ROW_WAIT_S)
            return
        self.health.succeeded("index store", now)

    def _reload_transactions(self) -> None:
        txns = self._dispatcher.transactions
        if txns is not None:  # it applied entries in memory: back to the store's state
            txns.reload(self._store.transaction_values())

    def _dispatch(self, entries: list[Entry]) -> None:
        if _STAMP is not None:
            _STAMP("dispatch.start", entries[-1].index)
        pending = PendingState(self._store)
        outputs: list[DispatchOutput] = []
        for entry in entries:
            out = self._dispatcher.apply(entry, pending)
            pending.absorb(out)
            outputs.append(out)
            for err in out.outcomes:
                if isinstance(err, Rejected):
                    log.warning(
                        "broker.chunk_rejected index=%d slot=%d reason=%s",
                        out.raft_index,
                        err.slot,
                        err.reason,
                    )
        self._store.apply(outputs)
        for cut in self._store.cuts_applied:
            log_cut(self._name.removeprefix("dispatch-"), cut)
        heads = {(h.topic, h.queue_id): h.next_offset for o in outputs for h in o.queue_heads}
        progress = DispatchProgress(outputs[-1].raft_index, tuple(outputs), heads)
        with self._cond:
            self._index = progress.dispatched_index
            self._term = max(self._term, outputs[-1].term)
            if self._waiting:  # most rounds have no waiter: no notify to pay for
                self._cond.notify_all()
        for listener in list(self._listeners):
            try:
                listener(progress)
            except Exception:
                log.exception("broker.dispatch_listener_failed index=%d", progress.dispatched_index)
        if _STAMP is not None:
            _STAMP("dispatch.end", progress.dispatched_index)
