"""Scrubber: re-reads the journal's sealed segments off the disk at a bounded rate, pass after
pass, so a byte that rots in a record nobody reads is found (the journal reports it to the node's
StorageHealth). It never writes, never serves what it reads and never exceeds its rate.
"""

from __future__ import annotations

import threading

from raftmq.raftlog.errors import LogClosedError
from raftmq.raftlog.journal import SegmentJournal

CHUNK_BYTES = 1 << 20  # read per step at most (then the pause that keeps the rate)
IDLE_S = 1.0  # nothing sealed to scrub yet: look again after this


class Scrubber:
    """Thread-safe counters; run() loops in the caller's thread until `stop` is set."""

    def __init__(self, journal: SegmentJournal, bytes_per_s: int) -> None:
        if bytes_per_s <= 0:
            raise ValueError(f"bytes_per_s must be > 0, got {bytes_per_s}")
        self._journal = journal
        self._rate = bytes_per_s
        self.bytes_total = 0  # read and checked since start
        self.passes = 0  # complete passes over the sealed segments
        self.next_index = 0  # where the current pass is

    def step(self) -> float:
        """Verify the next chunk; the pause (s) before the next step keeps the rate."""
        start = self.next_index
        nxt, n = self._journal.verify_sealed(start, min(CHUNK_BYTES, self._rate))
        self.next_index = nxt
        self.bytes_total += n
        if nxt > start:
            return n / self._rate  # went on (past a bad record too: n is 0 then)
        if nxt == start:
            return IDLE_S  # nothing sealed yet
        self.passes += 1  # back to the first index: the pass is over
        return 0.0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                pause = self.step()
            except LogClosedError:
                return
            stop.wait(pause)
