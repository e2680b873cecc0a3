"""Read-ahead of a Spark partition: its batches are made (pulled and converted to Arrow) on a
thread of their own while Spark consumes the one before, at most `depth` finished ahead.

Holds one bounded queue and one thread per read; never buffers more than `depth` items, and
never outlives its consumer by more than the producer's current step (it is told to stop when
the consumer closes, and it closes the producer's generator).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.1  # how soon a producer blocked on a full queue notices that its consumer left


@dataclass(frozen=True, slots=True)
class _End:
    """The producer finished: with `error`, it failed (raised to the consumer as it was)."""

    error: BaseException | None = None


def read_ahead(produce: Callable[[], Iterator[T]], depth: int, *, name: str) -> Iterator[T]:
    """The items of `produce()` in order, made on a thread named `name` up to `depth` ahead of
    the caller. An exception of the producer reaches the caller after the items made before it;
    closing this generator stops the producer at its next item."""
    if depth < 1:
        raise ValueError(f"read-ahead depth must be at least 1, got {depth}")
    return _ahead(produce, depth, name)


def _ahead(produce: Callable[[], Iterator[T]], depth: int, name: str) -> Iterator[T]:
    """read_ahead's generator: the thread starts at the first item asked for."""
    ready: queue.Queue[T | _End] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def hand(item: T | _End) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        end = _End()
        items: Iterator[T] | None = None
        try:
            items = produce()
            for item in items:
                if not hand(item):
                    return
        except BaseException as exc:  # handed to the consumer, who raises it
            end = _End(exc)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # a generator's own finally (its channels, its pull thread) runs now
        hand(end)

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    try:
        while True:
            got = ready.get()
            if isinstance(got, _End):
                if got.error is not None:
                    raise got.error
                return
            yield got
    finally:
        stop.set()
