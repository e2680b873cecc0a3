"""Concurrent calls to one server, coalesced into one request.

While a request to an address is in flight, the calls that threads make for that address wait;
when it is answered they go together in the next request (at most `max_items` each). So one
request is in flight per address, and the busier the callers, the larger the batches: the plain
producer's sticky batching, for requests whose items are answered apart (a transactional
producer's half sends and ends: client/producer/transaction.py).

Sans-I/O apart from `send`, which starts the request and returns a Future of the per-item
answers (an answer or the typed error that refused that item). Its completion callback sends the
next batch; with a DataPool that runs on the pool's loop thread, so the next request needs no
wake-up. Bounded: `max_waiting` items per address, past which a call is refused at once.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Generic, TypeVar

from raftmq.common.errors import InternalError, QueueFullError, RaftMQError

__all__ = ["Coalescer"]

I = TypeVar("I")  # noqa: E741  # an item of a request
R = TypeVar("R")  # its answer


class Coalescer(Generic[I, R]):
    """Thread-safe. `send(key, items)` must not block; it may fail at once (raise, or return a
    failed Future): the items then fail with that error."""

    def __init__(
        self,
        send: Callable[[str, list[I]], Future[Sequence[R | RaftMQError]]],
        *,
        max_items: int = 256,
        max_waiting: int = 4096,
    ) -> None:
        if max_items < 1 or max_waiting < max_items:
            raise ValueError("need 1 <= max_items <= max_waiting")
        self._send_fn = send
        self._max_items = max_items
        self._max_waiting = max_waiting
        self._lock = threading.Lock()
        self._waiting: dict[str, list[tuple[I, Future[R]]]] = {}
        self._busy: set[str] = set()  # keys with a request in flight
        self.requests = 0  # sent so far (for tests and benchmarks: items per request)
        self.items = 0

    def submit(self, key: str, item: I) -> Future[R]:
        """A Future of `item`'s answer (or its typed error)."""
        out: Future[R] = Future()
        with self._lock:
            waiting = self._waiting.setdefault(key, [])
            if len(waiting) >= self._max_waiting:
                raise QueueFullError(
                    f"{len(waiting)} requests to {key} are waiting for the one in flight; "
                    "slow down or use fewer threads"
                )
            waiting.append((item, out))
            if key in self._busy:
                return out  # goes with the next request, when this one is answered
            self._busy.add(key)
            batch = self._take(key)
        self._send(key, batch)
        return out

    def _take(self, key: str) -> list[tuple[I, Future[R]]]:
        waiting = self._waiting[key]
        batch = waiting[: self._max_items]
        del waiting[: self._max_items]
        if not waiting:
            del self._waiting[key]
        return batch

    def _send(self, key: str, batch: list[tuple[I, Future[R]]]) -> None:
        self.requests += 1
        self.items += len(batch)
        try:
            answer = self._send_fn(key, [item for item, _ in batch])
        except RaftMQError as exc:
            answer = Future()
            answer.set_exception(exc)
        answer.add_done_callback(functools.partial(self._answered, key, batch))

    def _answered(
        self,
        key: str,
        batch: list[tuple[I, Future[R]]],
        answer: Future[Sequence[R | RaftMQError]],
    ) -> None:
        failed = answer.exception()
        results: Sequence[R | RaftMQError] = ()
        if failed is None:
            results = answer.result()
            if len(results) != len(batch):
                failed = InternalError(
                    f"{key} answered {len(results)} of {len(batch)} items of a batched request"
                )
        for i, (_, out) in enumerate(batch):
            r = results[i] if failed is None else failed
            try:
                if isinstance(r, BaseException):
                    out.set_exception(r)
                else:
                    out.set_result(r)
            except InvalidStateError:
                pass  # cancelled by its caller: nobody wants the answer
        with self._lock:
            if self._waiting.get(key):
                nxt = self._take(key)
            else:
                self._busy.discard(key)
                return
        self._send(key, nxt)
