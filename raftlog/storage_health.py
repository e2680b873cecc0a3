"""StorageHealth: one node's verdict on its disk, fed by every writer (journal appends and
fsyncs, the Raft meta file, the broker's index store) and every reader that finds a record failing
its checksum, and read by status, logs, metrics and leadership.

A failed write is an episode, not an event per attempt: the first failure of an episode logs one
line (no traceback) naming the path and, for ENOSPC, that the disk is full; writers retry with a
bounded back-off; once writes have succeeded for `settle_s` with no failure, one line says the
episode is over. A corrupt record is not an episode: it stays reported (one line per record)
until it is repaired or deleted, whatever the writes do. It never raises and never blocks: a full
disk or a bad byte must not stop the node.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from dataclasses import dataclass

log = logging.getLogger("raftlog.storage")

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
SETTLE_S = 3.0  # writes succeed this long, with no failure, before the episode is declared over


@dataclass(frozen=True, slots=True)
class StorageError:
    """The failure that opened the current episode."""

    where: str  # which writer: journal, raft meta, index store
    path: str
    reason: str  # strerror, e.g. "No space left on device"
    disk_full: bool
    since_s: float  # monotonic
    corrupt: bool = False  # a stored record failed its check on read (not a refused write)

    def describe(self) -> str:
        if self.corrupt:
            return f"corrupt data: {self.where} at {self.path}: {self.reason}"
        what = "disk full" if self.disk_full else "write failed"
        return f"{what}: {self.where} at {self.path}: {self.reason}"


@dataclass(frozen=True, slots=True)
class CorruptRecord:
    """A record that failed its checksum or framing when read: where it is and what it holds."""

    where: str  # "journal", "index store"
    path: str
    offset: int  # byte offset in `path`
    index: int | None  # the Raft index it should hold, when the reader knew it
    reason: str

    def describe(self) -> str:
        if self.where == "index store":  # the path names the table and key; the log rebuilds it
            return (
                f"{self.reason}; never served, the index store is being rebuilt from the log (if "
                "this stays: stop this node, delete its store directory and start it again)"
            )
        at = f"offset {self.offset}" + (f" (index {self.index})" if self.index is not None else "")
        return (
            f"{at}: {self.reason}; never served, being fetched again from a peer (if this "
            "stays, no peer holds an intact copy: stop this node, empty its data directory and "
            "start it again to rebuild it from its peers)"
        )


def is_disk_full(exc: BaseException, path: str) -> bool:
    """ENOSPC/EDQUOT, or (lmdb says only EIO) a file system with no free block left."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20)


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class StorageHealth:
    """Thread-safe. `failed` and `succeeded` take the time (monotonic seconds) from the caller."""

    def __init__(self, node_id: str, settle_s: float = SETTLE_S) -> None:
        self.node_id = node_id
        self.settle_s = settle_s
        self._lock = threading.Lock()
        self._error: StorageError | None = None
        self._last_failure_s = 0.0
        self._backoff_s: dict[str, float] = {}
        self._retry_at_s: dict[str, float] = {}
        self._corrupt: dict[tuple[str, int], tuple[CorruptRecord, float]] = {}
        self.episodes = 0

    @property
    def error(self) -> StorageError | None:
        """The open episode's first failure, else the first unrepaired corrupt record; None
        while the disk takes writes and every record read back intact."""
        err = self._error
        if err is not None or not self._corrupt:
            return err
        with self._lock:
            if not self._corrupt:
                return None
            rec, since = next(iter(self._corrupt.values()))
        return StorageError(rec.where, rec.path, rec.describe(), False, since, corrupt=True)

    @property
    def has_corrupt(self) -> bool:
        """Cheap (no lock): some record is waiting for its repair."""
        return bool(self._corrupt)

    @property
    def corrupt_records(self) -> list[CorruptRecord]:
        """Every unrepaired corrupt record, in the order they were found."""
        with self._lock:
            return [rec for rec, _ in self._corrupt.values()]

    def corrupt(self, rec: CorruptRecord, now_s: float) -> None:
        """A reader found `rec` failing its check. Logged once per record; it stays reported
        (and the node stays out of leadership) until repaired() or forget_below()."""
        key = (rec.path, rec.offset)
        with self._lock:
            if key in self._corrupt:
                return
            self._corrupt[key] = (rec, now_s)
        log.error(
            "storage.corrupt_record node=%s where=%s path=%s offset=%d index=%s reason=%s: "
            "the record is never served; this node reports it in its status, does not lead and "
            "%s",
            self.node_id,
            rec.where,
            rec.path,
            rec.offset,
            rec.index if rec.index is not None else "unknown",
            rec.reason.replace(" ", "_"),
            "rebuilds its index store from the log"
            if rec.where == "index store"
            else "fetches it again from a peer",
        )

    def repaired(self, path: str, offset: int) -> None:
        """The record at `path`/`offset` reads back intact again (rewritten from a peer)."""
        with self._lock:
            found = self._corrupt.pop((path, offset), None)
        if found is not None:
            log.info(
                "storage.record_repaired node=%s path=%s offset=%d index=%s",
                self.node_id,
                path,
                offset,
                found[0].index,
            )

    def forget_below(self, where: str, first_index: int) -> None:
        """Retention deleted every record of `where` below `first_index`: bad ones included."""
        with self._lock:
            gone = [
                k
                for k, (rec, _) in self._corrupt.items()
                if rec.where == where and rec.index is not None and rec.index < first_index
            ]
            for k in gone:
                del self._corrupt[k]

    def may_try(self, where: str, now_s: float) -> bool:
        """False while `where`'s back-off after its last failure runs."""
        return now_s >= self._retry_at_s.get(where, 0.0)

    def retry_in_s(self, where: str, now_s: float) -> float:
        return max(0.0, self._retry_at_s.get(where, 0.0) - now_s)

    def failed(self, where: str, path: str, exc: BaseException, now_s: float) -> float:
        """A write of `where` failed; the back-off (s) before it should try again."""
        full = is_disk_full(exc, path)
        with self._lock:
            backoff = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, self._backoff_s.get(where, 0.0) * 2))
            self._backoff_s[where] = backoff
            self._retry_at_s[where] = now_s + backoff
            self._last_failure_s = now_s
            opened = self._error is None
            if opened:
                self._error = StorageError(where, path, reason_of(exc), full, now_s)
                self.episodes += 1
        if opened:
            log.error(
                "storage.%s node=%s where=%s path=%s error=%s: %s; the node stays up, "
                "retries every %.1f s at most and recovers by itself once writes succeed",
                "disk_full" if full else "write_failed",
                self.node_id,
                where,
                path,
                reason_of(exc).replace(" ", "_"),
                "the disk is full, free space on it" if full else "the disk refuses writes",
                BACKOFF_MAX_S,
            )
        return backoff

    def succeeded(self, where: str, now_s: float) -> None:
        """A write of `where` went through; may close the episode."""
        if self._error is None and where not in self._backoff_s:
            return  # the hot path: nothing to do
        with self._lock:
            self._backoff_s.pop(where, None)
            self._retry_at_s.pop(where, None)
        self.settle(now_s)

    def settle(self, now_s: float) -> None:
        """Close the episode once no writer is backing off and none failed for settle_s."""
        if self._error is None:
            return
        with self._lock:
            err = self._error
            if err is None or self._backoff_s or now_s - self._last_failure_s < self.settle_s:
                return
            self._error = None
        log.info(
            "storage.recovered node=%s where=%s path=%s failed_for_s=%.1f",
            self.node_id,
            err.where,
            err.path,
            now_s - err.since_s,
        )
