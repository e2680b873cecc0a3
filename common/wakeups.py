"""LoopWaker: completes the asyncio futures of one event loop from other threads (the broker's
dispatcher and Raft threads, the SDK's I/O loop for its asyncio face), waking the loop once per
burst however many futures a burst completes. It decides nothing; it never blocks the thread
that posts."""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Sequence
from typing import Any

from raftmq.common import timeline

_STAMP = timeline.process_stamp()  # None unless RAFTMQ_TIMELINE is set (bench/w2_timeline.py)


class LoopWaker:
    """`set_result` / `set_exception` from any thread. Completions queue up; the first one after
    a drain schedules one `call_soon_threadsafe`, later ones ride on it (the FrameClient inbox's
    scheme): a dispatch that answers 200 sends and wakes 50 held pulls costs the loop one wake-up.
    A future already done (timed out, cancelled) when its completion arrives is left alone.

    At most `max_per_turn` futures complete per loop turn, the rest in the next turns: each
    resumes a task in the turn after, and a message that wakes a thousand held pulls would
    otherwise run all their reads in one turn, in front of the loop's timers, its reads and
    every other request's answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_per_turn: int = 64) -> None:
        if max_per_turn < 1:
            raise ValueError("max_per_turn must be >= 1")
        self._loop = loop
        self.max_per_turn = max_per_turn
        self._ready: collections.deque[tuple[asyncio.Future[Any], Any, BaseException | None]] = (
            collections.deque()
        )
        self._lock = threading.Lock()
        self._scheduled = False
        # The loop's thread (known when made on it, else learnt at the first drain): a post
        # from it completes the future at once (the asyncio face's answers arrive there).
        self._loop_thread = threading.get_ident() if _running_here(loop) else 0
        self.wakeups = 0  # call_soon_threadsafe calls made (a metric; tests check coalescing)
        self.posted = 0  # futures posted from other threads
        self.direct = 0  # futures completed at once on the loop's own thread

    @property
    def completions(self) -> int:
        """Futures completed through this waker, both ways."""
        return self.posted + self.direct

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def set_result(self, fut: asyncio.Future[Any], value: Any) -> None:
        self._post(fut, value, None)

    def set_exception(self, fut: asyncio.Future[Any], exc: BaseException) -> None:
        self._post(fut, None, exc)

    def set_results(self, futs: Sequence[asyncio.Future[Any]], value: Any) -> None:
        """set_result(fut, value) for each, with one post (and at most one wake-up)."""
        if threading.get_ident() == self._loop_thread:
            for fut in futs:
                self._post(fut, value, None)
            return
        self._ready.extend([(fut, value, None) for fut in futs])
        self._schedule(len(futs))

    def _post(self, fut: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
        if threading.get_ident() == self._loop_thread:
            self.direct += 1  # only the loop's thread writes it
            if not fut.done():
                if exc is not None:
                    fut.set_exception(exc)
                else:
                    fut.set_result(value)
            return
        self._ready.append((fut, value, exc))
        self._schedule(1)

    def _schedule(self, posted: int) -> None:
        """A drain for what was just queued, unless one is scheduled already."""
        with self._lock:
            self.posted += posted
            if self._scheduled:
                return  # the scheduled drain takes this one too
            self._scheduled = True
            self.wakeups += 1
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody awaits these futures any more
            with self._lock:
                self._scheduled = False

    def _drain(self) -> None:
        self._loop_thread = threading.get_ident()
        if _STAMP is not None:
            _STAMP("waker.drain", len(self._ready))
        with self._lock:
            self._scheduled = False
        ready = self._ready
        left = self.max_per_turn
        while ready and left:
            fut, value, exc = ready.popleft()
            if fut.done():
                continue
            left -= 1
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(value)
        if ready:  # the rest after this turn's tasks and the next turn's timers
            with self._lock:
                if self._scheduled:
                    return  # a post from another thread scheduled the next drain already
                self._scheduled = True
            self._loop.call_soon(self._drain)


def _running_here(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
