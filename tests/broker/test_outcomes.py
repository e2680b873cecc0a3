"""OutcomeBook hands the dispatcher's verdict of a chunk to the request waiting for it."""

from __future__ import annotations

import threading
import time

import pytest

from raftmq.broker.dispatch import DispatchOutput
from raftmq.broker.dispatcher_thread import DispatchProgress
from raftmq.broker.outcomes import OutcomeBook
from raftmq.broker.rows import Rejected


def progress(*indexes: int) -> DispatchProgress:
    outs = tuple(
        DispatchOutput(i, 1, outcomes=(Rejected(0, f"e{i}s0"), Rejected(1, f"e{i}s1")))
        for i in indexes
    )
    return DispatchProgress(max(indexes), outs, {})


def test_waiter_gets_the_outcome_of_its_slot_once_dispatched() -> None:
    book = OutcomeBook(0)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(book.wait(2, 1, 5.0)))
    t.start()
    time.sleep(0.05)
    book.record(progress(1))
    time.sleep(0.05)
    assert got == [], "entry 2 is not dispatched yet"
    book.record(progress(2))
    t.join(5)
    assert got == [Rejected(1, "e2s1")]


def test_already_dispatched_answers_at_once_and_timeouts_return_none() -> None:
    book = OutcomeBook(0)
    book.record(progress(1, 2))
    assert book.wait(1, 0, 0.0) == Rejected(0, "e1s0")
    started = time.monotonic()
    assert book.wait(3, 0, 0.1) is None
    assert time.monotonic() - started >= 0.09
    assert book.wait(2, 5, 0.1) is None, "a slot the entry does not have"


def test_window_is_bounded_and_old_entries_are_forgotten() -> None:
    book = OutcomeBook(0, max_entries=2)
    book.record(progress(1, 2, 3))
    assert book.wait(1, 0, 0.0) is None
    assert book.wait(3, 0, 0.0) == Rejected(0, "e3s0")


def test_failure_wakes_waiters_with_the_error() -> None:
    book = OutcomeBook(0)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            book.wait(5, 0, 5.0)
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.05)
    book.fail(RuntimeError("dispatcher died"))
    t.join(5)
    assert [str(e) for e in errors] == ["dispatcher died"]
    with pytest.raises(RuntimeError):
        book.wait(6, 0, 0.0)


def test_on_outcome_calls_back_once_dispatched_at_once_if_already_and_on_failure() -> None:
    book = OutcomeBook(0)
    got: list[tuple[object, object]] = []

    def keep(outcome: object, failure: object) -> None:
        got.append((outcome, failure))

    book.on_outcome(2, 1, keep)
    book.on_outcome(2, 5, keep)  # a slot the entry does not have: None
    book.record(progress(1))
    assert got == [] and book.pending_callbacks == 2
    book.record(progress(2))
    assert got == [(Rejected(1, "e2s1"), None), (None, None)]
    assert book.pending_callbacks == 0
    got.clear()
    book.on_outcome(1, 0, keep)  # already dispatched: on this thread, now
    assert got == [(Rejected(0, "e1s0"), None)]
    got.clear()
    book.on_outcome(9, 0, keep)
    boom = RuntimeError("dispatcher stopped")
    book.fail(boom)
    book.on_outcome(10, 0, keep)
    assert got == [(None, boom), (None, boom)]


def test_release_ends_the_requests_waiting_now_and_only_those() -> None:
    import threading

    from raftmq.broker.outcomes import OutcomeBook

    book = OutcomeBook(0)
    got: list[BaseException | None] = []
    book.on_outcome(5, 0, lambda outcome, failure: got.append(failure))
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            book.wait(5, 0, 10.0)
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    while not book._waiters:  # the waiter registered
        pass
    book.release(RuntimeError("stalled"))
    t.join(2)
    assert not t.is_alive() and [str(e) for e in errors] == ["stalled"]
    assert [str(f) for f in got] == ["stalled"]
    assert book.wait(5, 0, 0.05) is None  # a later request waits as usual
