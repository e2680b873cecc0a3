"""IndexRepair: hears every index-store row that fails its checksum (broker/checked_tables.py),
reports it to the node's StorageHealth (storage_error, the corrupt-records metric, the alarm, one
log line with table and key) and rebuilds the index store from the log without stopping the
node: the base of the current retention cut, then dispatch of every entry after it. It never
serves a row, never touches the journal, and clears the report only once the rebuild is done.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from raftmq.broker.errors import CorruptRowError, DispatcherStoppedError, StoreError
from raftmq.broker.store import ScrubAt
from raftmq.raftlog.storage_health import CorruptRecord, StorageHealth

if TYPE_CHECKING:
    from raftmq.broker.dispatcher_thread import DispatcherThread
    from raftmq.broker.store import MessageStore
    from raftmq.broker.txn_apply import TxnApplier

log = logging.getLogger("broker.index_repair")

WHERE = "index store"
CATCH_UP_WAIT_S = 0.5  # between checks of the rebuild's progress (and of stop())
REBUILD_RETRY_S = 30.0  # after a rebuild that could not start (a bad base): one line per try
SCRUB_TICK_S = 0.1  # the index scrub reads scrub_rows_per_s / 10 rows this often
# A pass over a small store takes a few ticks; the next one starts this much later, so that an
# idle node's scrub costs nothing (a bad row waits at most this long plus a pass to be found).
SCRUB_PASS_GAP_S = 5.0
# A long pass (a large store) rests this many times its own length before the next, so the scrub
# reads on average at most scrub_rows_per_s / (1 + this): at the default 20 000 rows/s a store of
# 10^6 rows cost ~8 % of a core per node at ~4 us a row, read back to back (issue 24's profile).
# A pass shorter than SCRUB_PASS_GAP_S / 4 (every store the chaos scenarios build) rests as before.
SCRUB_REST_PER_PASS = 4.0


def scrub_rest_s(pass_s: float) -> float:
    """How long the index scrub rests after a pass that took `pass_s` seconds."""
    return max(SCRUB_PASS_GAP_S, SCRUB_REST_PER_PASS * pass_s)


def record_of(exc: CorruptRowError) -> CorruptRecord:
    """The StorageHealth record of a bad row: one per (table, key), path naming both."""
    key = exc.key.replace(" ", "\\x20")  # the log line's key=value pairs stay one word each
    return CorruptRecord(WHERE, f"{exc.path}/{exc.table}/{key}", 0, None, exc.reason)


class IndexRepair:
    """Start it once; close() it to stop. `rebuilding` is True from the first bad row until
    dispatch has derived the index again up to where it had got."""

    def __init__(
        self,
        node_id: str,
        store: MessageStore,
        dispatcher: DispatcherThread,
        transactions: TxnApplier | None,
        health: StorageHealth,
        *,
        scrub_rows_per_s: int = 0,
    ) -> None:
        self._node_id = node_id
        self._store = store
        self._dispatcher = dispatcher
        self._transactions = transactions
        self._health = health
        self._wanted = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rebuilds = 0
        # The index scrub: every row of every table re-read and checked, pass after pass, at
        # most scrub_rows_per_s (0: off), so a bad row nobody reads is found too.
        self._scrub_rows_per_tick = (
            max(1, int(scrub_rows_per_s * SCRUB_TICK_S)) if scrub_rows_per_s > 0 else 0
        )
        self._scrub_at: ScrubAt | None = None
        self._next_pass_s = 0.0  # monotonic: when the next pass may start
        self._pass_started_s = 0.0  # monotonic: when the pass under way started
        self.scrubbed_rows = 0
        self.scrub_passes = 0
        store.report_corrupt_to(self._on_corrupt)

    @property
    def rebuilding(self) -> bool:
        health = self._health
        return self._wanted.is_set() or (
            health.has_corrupt and any(r.where == WHERE for r in health.corrupt_records)
        )

    def report(self, exc: StoreError) -> None:
        """A row that passed its checksum but disagrees with the log or the request (a pull's
        cross-checks): the same report and rebuild as a bad checksum."""
        path = str(self._store.path)
        self._on_corrupt(CorruptRowError(path, "consume_queue", "(served rows)", str(exc)))

    def _on_corrupt(self, exc: CorruptRowError) -> None:
        """Any thread (a reader, the dispatcher): report it, and wake the rebuild."""
        self._health.corrupt(record_of(exc), time.monotonic())
        self._wanted.set()

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"index-repair-{self._node_id}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wanted.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._wanted.wait(SCRUB_TICK_S if self._scrub_rows_per_tick else None):
                self._scrub()
                continue
            if self._stop.is_set():
                return
            self._wanted.clear()
            self._rebuild()
            self._scrub_at = None  # a rebuilt store: the next pass starts over

    def _scrub(self) -> None:
        if self._scrub_at is None:
            now = time.monotonic()
            if now < self._next_pass_s:
                return
            self._pass_started_s = now
        try:
            at, n = self._store.scrub_step(self._scrub_at, self._scrub_rows_per_tick)
        except CorruptRowError:
            return  # reported by the check itself: the rebuild comes next
        except Exception:  # never stop the repair thread; the next tick tries again
            log.exception("broker.index_scrub_failed node=%s", self._node_id)
            return
        self.scrubbed_rows += n
        if at is None:
            self.scrub_passes += 1
            now = time.monotonic()
            self._next_pass_s = now + scrub_rest_s(now - self._pass_started_s)
        self._scrub_at = at

    def _rebuild(self) -> None:
        reached = self._dispatcher.dispatched_index
        started = time.monotonic()
        failed: list[BaseException] = []

        def replace() -> tuple[int, int]:
            try:
                index, term = self._store.rebuild()
            except StoreError as exc:  # a bad cut or base: nothing changed
                failed.append(exc)
                return self._store.dispatched_index, 0
            if self._transactions is not None:
                self._transactions.reload(self._store.transaction_values())
            return index, term

        self._dispatcher.install(replace)
        if failed:
            log.error(
                "broker.index_rebuild_failed node=%s error=%s: the index store cannot be rebuilt "
                "here; it stays reported and this node does not lead: stop it, delete its store "
                "directory and start it again (it then takes a snapshot from the leader)",
                self._node_id,
                str(failed[0]).replace(" ", "_"),
            )
            self._stop.wait(REBUILD_RETRY_S)  # the same bad row is found again meanwhile
            return
        log.warning(
            "broker.index_rebuild_started node=%s from_index=%d to_index=%d",
            self._node_id,
            self._store.dispatched_index,
            reached,
        )
        try:
            # Back where it was, then at the commit index of that moment: until then pulls
            # are refused (a store behind its log would answer them from an older state).
            for step in range(2):
                goal = reached if step == 0 else self._dispatcher.committed_index
                while not self._stop.is_set():
                    if self._dispatcher.wait_dispatched(goal, CATCH_UP_WAIT_S):
                        break
        except DispatcherStoppedError:
            return  # the node is going away, or dispatch failed (it logged why)
        if self._stop.is_set() or self._wanted.is_set():
            return  # stopping, or a row went bad again meanwhile: the next rebuild clears
        for rec in self._health.corrupt_records:
            if rec.where == WHERE:
                self._health.repaired(rec.path, rec.offset)
        self.rebuilds += 1
        log.warning(
            "broker.index_rebuilt node=%s index=%d seconds=%.2f: every row derived again from "
            "the log",
            self._node_id,
            reached,
            time.monotonic() - started,
        )
