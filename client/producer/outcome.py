"""Where a message's outcome goes, as the sender sets it (`Outcome`: the part of a future's
interface the sender and the trace hook use): a `concurrent.futures.Future` (the threaded API),
a `Slot` of a batch's one future (the batch-first call of messages with fields), or a `LoopSlot`
that completes an asyncio future through a LoopWaker (the asyncio face). No lock, Future or
callback per message in the last two: a `concurrent.futures.Future` costs a Condition each
(issue 24). The batch-first call's bare bodies have no outcome per message at all: each part of
the call (one buffered item) settles a `Part` of the call's `PartsOutcome` with the results of
all its messages at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

from raftmq.client.messages import SendResult, SendResults
from raftmq.common.wakeups import LoopWaker

__all__ = [
    "LoopPart",
    "LoopSlot",
    "Outcome",
    "Part",
    "PartsOutcome",
    "RunOutcome",
    "Settled",
    "Slot",
]


class Outcome(Protocol):
    """One message's outcome: set once by the sender, read after it is set."""

    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def set_result(self, result: SendResult) -> None: ...
    def set_exception(self, error: BaseException) -> None: ...
    def exception(self) -> BaseException | None: ...
    def result(self) -> SendResult: ...


class _SetOnce:
    """A message's outcome, set once, read after it is set: the part of a future's interface
    the sender and the trace hook use. Subclasses say where the outcome goes (`_deliver`)."""

    __slots__ = ("_done", "_error", "_result")

    def __init__(self) -> None:
        self._done = False
        self._result: SendResult | None = None
        self._error: BaseException | None = None

    def _deliver(self, result: SendResult | None, error: BaseException | None) -> None:
        raise NotImplementedError

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def set_result(self, result: SendResult) -> None:
        if self._done:
            return
        self._done, self._result = True, result
        self._deliver(result, None)

    def set_exception(self, error: BaseException) -> None:
        if self._done:
            return
        self._done, self._error = True, error
        self._deliver(None, error)

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> SendResult:
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise RuntimeError("the slot has no outcome yet")
        return self._result


class Slot(_SetOnce):
    """One message's outcome inside a PartsOutcome: a part of one message (the batch call of
    messages with fields)."""

    __slots__ = ("_batch", "_i")

    def __init__(self, batch: PartsOutcome, i: int) -> None:
        super().__init__()
        self._batch, self._i = batch, i

    def _deliver(self, result: SendResult | None, error: BaseException | None) -> None:
        self._batch._settle(self._i, () if result is None else (result,), error)


class LoopSlot(_SetOnce):
    """One message's outcome posted to an asyncio future of the caller's loop through its
    LoopWaker (one wake-up per burst of completions)."""

    __slots__ = ("_out", "_waker")

    def __init__(self, waker: LoopWaker, out: asyncio.Future[SendResult]) -> None:
        super().__init__()
        self._waker, self._out = waker, out

    def _deliver(self, result: SendResult | None, error: BaseException | None) -> None:
        if error is not None:
            self._waker.set_exception(self._out, error)
        else:
            assert result is not None
            self._waker.set_result(self._out, result)


class Settled(_SetOnce):
    """An outcome known already (a part's message as the trace hook reads it)."""

    __slots__ = ()

    def _deliver(self, result: SendResult | None, error: BaseException | None) -> None:
        pass


class PartsOutcome:
    """The one future of a batch-first call, sent as `n` parts (bare bodies: one buffered item
    each, `parts()`; messages with fields: one message each, `slots()`): `SendResults` in the
    call's order once every part is stored, else the first error (parts before it may be
    stored; each part is stored whole or not at all)."""

    __slots__ = ("_error", "_left", "_lock", "_runs", "future")

    def __init__(self, n: int) -> None:
        self.future: Future[Sequence[SendResult]] = Future()
        self._runs: list[Sequence[SendResult]] = [()] * n
        self._left = n
        self._error: BaseException | None = None
        self._lock = threading.Lock()  # parts complete on the loop and the timer thread
        if n == 0:
            self.future.set_result(SendResults(()))

    def parts(self) -> list[Part]:
        return [Part(self, i) for i in range(len(self._runs))]

    def slots(self) -> list[Slot]:
        return [Slot(self, i) for i in range(len(self._runs))]

    def _settle(self, i: int, run: Sequence[SendResult], error: BaseException | None) -> None:
        with self._lock:
            self._runs[i] = run
            if error is not None and self._error is None:
                self._error = error
            self._left -= 1
            if self._left:
                return
        if self._error is not None:
            self.future.set_exception(self._error)
        else:
            self.future.set_result(SendResults(self._runs))


class _RunOnce:
    """The outcome of a run of messages (one buffered item of bare bodies), set once with the
    results of all of them (a lazy `StoredRun`, or a list from an older broker's per-message
    answer) or an error. Subclasses say where it goes (`_deliver`)."""

    __slots__ = ("_done", "_error", "_results")

    def __init__(self) -> None:
        self._done = False
        self._results: Sequence[SendResult] = ()
        self._error: BaseException | None = None

    def _deliver(self, results: Sequence[SendResult], error: BaseException | None) -> None:
        raise NotImplementedError

    def done(self) -> bool:
        return self._done

    def set_results(self, results: Sequence[SendResult]) -> None:
        if self._done:
            return
        self._done, self._results = True, results
        self._deliver(results, None)

    def set_exception(self, error: BaseException) -> None:
        if self._done:
            return
        self._done, self._error = True, error
        self._deliver((), error)

    def exception(self) -> BaseException | None:
        return self._error

    def results(self) -> Sequence[SendResult]:
        """What the run was set with (empty after an error)."""
        return self._results


class Part(_RunOnce):
    """One part's outcome inside a PartsOutcome (the batch call's one future)."""

    __slots__ = ("_i", "_outcome")

    def __init__(self, outcome: PartsOutcome, i: int) -> None:
        super().__init__()
        self._outcome, self._i = outcome, i

    def _deliver(self, results: Sequence[SendResult], error: BaseException | None) -> None:
        self._outcome._settle(self._i, results, error)


class LoopPart(_RunOnce):
    """The outcomes of the asyncio face's plain sends gathered into one buffered item (one per
    queue per loop turn, client/aio.py): each message's result posted to its own asyncio future
    through the loop's LoopWaker; an error fails them all."""

    __slots__ = ("_outs", "_waker")

    def __init__(self, waker: LoopWaker, outs: list[asyncio.Future[SendResult]]) -> None:
        super().__init__()
        self._waker, self._outs = waker, outs

    def _deliver(self, results: Sequence[SendResult], error: BaseException | None) -> None:
        if error is not None:
            post_error = self._waker.set_exception
            for out in self._outs:
                post_error(out, error)
            return
        post = self._waker.set_result
        for k, out in enumerate(self._outs):
            post(out, results[k])


RunOutcome = Part | LoopPart  # the outcome of a buffered item of bare bodies (sender.Bodies)
