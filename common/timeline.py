"""Wall-clock stamps of one process for bench/w2_timeline.py: where a synchronous send's time goes,
hop by hop, across the client and the group's nodes (CLOCK_MONOTONIC is one clock for every
process of a machine).

Off unless RAFTMQ_TIMELINE names a directory: then `PROCESS` is one bounded ring of (ns, point,
value) stamps, written to `<directory>/<pid>.json` when the process exits. It never logs and never
does I/O on the path it stamps; when off a stamp site costs one comparison with None.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

ENV = "RAFTMQ_TIMELINE"
MAX_STAMPS = 1 << 18  # per process: ~250 000 stamps, a few thousand sends with every hop

Stamp = Callable[[str, int], None]  # (point, value): what a stamp site calls


class Timeline:
    """A ring of the last `capacity` stamps. `stamp` may be called from any thread: the slot
    comes from an itertools counter (atomic under the GIL) and the store is one list item."""

    __slots__ = ("_capacity", "_next", "_ring", "directory")

    def __init__(self, directory: Path, capacity: int = MAX_STAMPS) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.directory = directory
        self._capacity = capacity
        self._ring: list[tuple[int, str, int] | None] = [None] * capacity
        self._next = itertools.count()

    def stamp(self, point: str, value: int = 0) -> None:
        self._ring[next(self._next) % self._capacity] = (time.monotonic_ns(), point, value)

    def stamps(self) -> list[tuple[int, str, int]]:
        """What the ring holds, oldest first (in time: threads may store out of order)."""
        return sorted(s for s in self._ring if s is not None)

    def dump(self) -> Path:
        """Write the stamps to `<directory>/<pid>.json`; its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "stamps": self.stamps()}))
        tmp.replace(path)
        return path


def from_env() -> Timeline | None:
    """The process's timeline when RAFTMQ_TIMELINE names a directory (dumped at exit), else None."""
    directory = os.environ.get(ENV, "")
    if not directory:
        return None
    tl = Timeline(Path(directory))
    atexit.register(tl.dump)
    return tl


PROCESS: Timeline | None = from_env()


def process_stamp() -> Stamp | None:
    """The process timeline's stamp function, or None when stamps are off: what a stamp site
    binds once (at import or construction) and tests against None."""
    return PROCESS.stamp if PROCESS is not None else None
