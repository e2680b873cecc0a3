"""Resource reports (issue 18 item 2): per-minute message counts per topic (produced) and per
(topic, consumer group) (consumed), kept on each broker node for a retention in a small sqlite
table, queried by time range (the `QueryStats` RPC; Admin sums every node's rows).

The request path makes one call per batch (`on_send`, `on_pull`): a dict add under a lock. A
flusher thread moves the counted minutes to sqlite every `stats_flush_interval_ms` and, once a
minute, deletes minutes past the retention, then the oldest minutes while the table holds more
than `stats_max_rows` rows. Soft state, not replicated: each batch is counted once, by the node that
served it, so a query sums over every node of every group (docs/design.md).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("raftmq.broker.stats")

MINUTE_MS = 60_000
MAX_KEYS_PER_FLUSH = 10_000  # distinct (minute, topic, group) keys held between two flushes
OTHER = "_other"  # where counts of keys past the bound go (same spirit as the metrics' labels)
PRODUCED = ""  # the group of a produced row


@dataclass(frozen=True, slots=True)
class StatsRow:
    minute_ms: int  # the minute's start, epoch ms
    topic: str
    group: str  # "" = produced to the topic; otherwise consumed by this group
    count: int


def minute_of(now_ms: int) -> int:
    return now_ms - now_ms % MINUTE_MS


class MinuteCounts:
    """Pure: counts added per (minute, topic, group) until drained. Bounded: past
    `max_keys` distinct keys, new keys count under (minute, _other, _other)."""

    def __init__(self, max_keys: int = MAX_KEYS_PER_FLUSH) -> None:
        self.max_keys = max_keys
        self._counts: dict[tuple[int, str, str], int] = {}

    def add(self, topic: str, group: str, count: int, now_ms: int) -> None:
        if count <= 0:
            return
        key = (minute_of(now_ms), topic, group)
        counts = self._counts
        if key not in counts and len(counts) >= self.max_keys:
            key = (key[0], OTHER, OTHER if group else PRODUCED)
        counts[key] = counts.get(key, 0) + count

    def drain(self) -> list[StatsRow]:
        rows = [StatsRow(m, t, g, n) for (m, t, g), n in self._counts.items()]
        self._counts = {}
        return rows

    def __len__(self) -> int:
        return len(self._counts)


class StatsStore:
    """The sqlite table of one node. Thread-safe (one lock; writes are one transaction per
    flush)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS counts (minute INTEGER NOT NULL, topic TEXT NOT NULL, "
            "grp TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (minute, topic, grp)) "
            "WITHOUT ROWID"
        )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def write(
        self, rows: list[StatsRow], *, keep_after_ms: int, max_rows: int, prune: bool = True
    ) -> int:
        """Add `rows`, then (with `prune`) delete minutes before `keep_after_ms` and the oldest
        minutes past `max_rows`; the rows deleted."""
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            try:
                db.executemany(
                    "INSERT INTO counts (minute, topic, grp, n) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (minute, topic, grp) DO UPDATE SET n = n + excluded.n",
                    [(r.minute_ms, r.topic, r.group, r.count) for r in rows],
                )
                removed = 0
                total = 0
                if prune:
                    removed = db.execute(
                        "DELETE FROM counts WHERE minute < ?", (keep_after_ms,)
                    ).rowcount
                    (total,) = db.execute("SELECT COUNT(*) FROM counts").fetchone()
                if total > max_rows:
                    # Whole minutes go, oldest first, so a kept minute is never partial.
                    cut = db.execute(
                        "SELECT minute FROM counts ORDER BY minute DESC LIMIT 1 OFFSET ?",
                        (max_rows,),
                    ).fetchone()
                    if cut is not None:
                        removed += db.execute(
                            "DELETE FROM counts WHERE minute <= ?", (cut[0],)
                        ).rowcount
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return removed

    def query(
        self, *, topic: str, group: str, since_ms: int, until_ms: int, limit: int
    ) -> list[StatsRow]:
        """Rows with since_ms <= minute < until_ms. topic "" = every topic; group None-like
        selection: group "" = produced rows only, "*" = every consumed row, else that group."""
        where = ["minute >= ?", "minute < ?"]
        args: list[object] = [since_ms, until_ms]
        if topic:
            where.append("topic = ?")
            args.append(topic)
        if group == "*":
            where.append("grp != ''")
        else:
            where.append("grp = ?")
            args.append(group)
        sql = (
            "SELECT minute, topic, grp, n FROM counts WHERE "
            + " AND ".join(where)
            + " ORDER BY minute, topic, grp LIMIT ?"
        )
        args.append(limit)
        with self._lock:
            return [StatsRow(*r) for r in self._db.execute(sql, args).fetchall()]

    def row_count(self) -> int:
        with self._lock:
            (n,) = self._db.execute("SELECT COUNT(*) FROM counts").fetchone()
        return int(n)


class NodeStats:
    """A broker node's reports: the counter the request path feeds, its flusher thread and the
    store. `retention_ms` 0 turns reports off (nothing counted, no file)."""

    def __init__(
        self,
        path: Path,
        *,
        retention_ms: int,
        flush_interval_ms: int,
        max_rows: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.enabled = retention_ms > 0
        self.retention_ms = retention_ms
        self.flush_interval_s = flush_interval_ms / 1000
        self.max_rows = max_rows
        self._path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._counts = MinuteCounts()
        self._store: StatsStore | None = None
        self._store_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pruned_minute = -1  # the minute the table was last pruned in

    # ---- the request path: one call per batch -------------------------------------------------

    def on_send(self, topic: str, count: int) -> None:
        if self.enabled and count > 0:
            now_ms = int(self._clock() * 1000)
            with self._lock:
                self._counts.add(topic, PRODUCED, count, now_ms)

    def on_pull(self, group: str, topic: str, count: int) -> None:
        if self.enabled and count > 0 and group:
            now_ms = int(self._clock() * 1000)
            with self._lock:
                self._counts.add(topic, group, count, now_ms)

    # ---- the shell ----------------------------------------------------------------------------

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="stats-flush", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.enabled:
            try:
                self.flush()
            except sqlite3.Error as exc:
                log.warning("broker.stats_flush_failed error=%s", exc)
        with self._store_lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            try:
                self.flush()
            except sqlite3.Error as exc:  # a full disk: the counts of this flush are lost
                log.warning("broker.stats_flush_failed error=%s", exc)

    def _open(self) -> StatsStore:
        with self._store_lock:
            if self._store is None:
                self._store = StatsStore(self._path)
            return self._store

    def flush(self) -> int:
        """Move the counted minutes to the table and apply the retention; rows deleted."""
        with self._lock:
            rows = self._counts.drain()
        now_ms = int(self._clock() * 1000)
        # The retention and the row cap once per minute: counting a big table every flush
        # would cost more than the counts.
        prune = minute_of(now_ms) != self._pruned_minute
        removed = self._open().write(
            rows,
            keep_after_ms=minute_of(now_ms - self.retention_ms),
            max_rows=self.max_rows,
            prune=prune,
        )
        self._pruned_minute = minute_of(now_ms)
        return removed

    def query(
        self, *, topic: str, group: str, since_ms: int, until_ms: int, limit: int
    ) -> list[StatsRow]:
        if not self.enabled:
            return []
        self.flush()  # what was counted up to now is in the answer
        return self._open().query(
            topic=topic, group=group, since_ms=since_ms, until_ms=until_ms, limit=limit
        )

    def row_count(self) -> int:
        return self._open().row_count() if self.enabled else 0
