"""One timer thread for an SDK client: retries after a back-off, linger deadlines, periodic work.

Bounded (at most `max_pending` timers) and never runs a task concurrently with itself; a task
that raises is logged and dropped, never silently swallowed.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("raftmq.client")


class Scheduler:
    def __init__(self, name: str, max_pending: int = 100_000) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._max = max_pending
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call_later(self, delay_s: float, task: Callable[[], None]) -> None:
        with self._cond:
            if self._closed:
                return
            if len(self._heap) >= self._max:
                raise RuntimeError(f"more than {self._max} timers pending")
            heapq.heappush(
                self._heap, (time.monotonic() + max(0.0, delay_s), next(self._seq), task)
            )
            self._cond.notify()

    def every(self, period_s: float, task: Callable[[], None]) -> None:
        """Run `task` every period_s until close()."""

        def again() -> None:
            try:
                task()
            finally:
                self.call_later(period_s, again)

        self.call_later(period_s, again)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
                if self._closed:
                    return
                _, _, task = heapq.heappop(self._heap)
            try:
                task()
            except Exception:
                log.exception("client.timer_task_failed")
