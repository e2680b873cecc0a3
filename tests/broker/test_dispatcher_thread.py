"""The dispatch thread against an in-process implementation of the committed-log protocol:
follows commits, batches entries per transaction, notifies, resumes, stops, fails loudly."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from raftmq.broker.dispatcher_thread import DispatcherSettings, DispatcherThread, DispatchProgress
from raftmq.broker.errors import DispatcherStoppedError
from raftmq.broker.rows import Appended
from raftmq.broker.store import MessageStore
from raftmq.raftlog.record import Entry

from .support import InProcessLog, commit, produce

FAST = DispatcherSettings(max_batch_entries=4, max_batch_bytes=1 << 20, poll_timeout_ms=10)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(tmp_path / "store", map_size_bytes=64 << 20)
    yield s
    s.close()


def test_follows_the_log_and_notifies(store: MessageStore) -> None:
    log = InProcessLog()
    seen: list[DispatchProgress] = []
    with DispatcherThread(log, store, settings=FAST, on_progress=seen.append) as t:
        e = log.append([produce("T", 0, 3), commit("g", "T", 0, 1)])
        assert t.wait_dispatched(e.index, 5)
        assert store.queue_bounds("T", 0) == (0, 3)
        assert store.committed_offset("g", "T", 0) == 1
        log.append_control()
        log.append([produce("T", 1, 2)])
        assert t.wait_dispatched(3, 5)
    first = seen[0].outputs[0].outcomes[0]
    assert isinstance(first, Appended) and first.stored.first_offset == 0
    assert seen[-1].dispatched_index == 3
    assert seen[-1].queue_next_offsets[("T", 1)] == 2
    assert not t.running


def test_batches_are_bounded_and_indexes_dense(store: MessageStore) -> None:
    log = InProcessLog()
    for i in range(10):
        log.append([produce("T", i % 2, 1)] if i % 3 else [])
    seen: list[DispatchProgress] = []
    with DispatcherThread(log, store, settings=FAST, on_progress=seen.append) as t:
        assert t.wait_dispatched(10, 5)
    assert all(1 <= len(p.outputs) <= 4 for p in seen)
    indexes = [o.raft_index for p in seen for o in p.outputs]
    assert indexes == list(range(1, 11))
    assert store.dispatched_index == 10


def test_long_poll_wakes_when_a_message_arrives(store: MessageStore) -> None:
    log = InProcessLog()
    with DispatcherThread(log, store, settings=FAST) as t:
        assert not t.wait_for_message("T", 0, 0, 0.05)  # nothing yet: times out
        woke = threading.Event()

        def poll() -> None:
            if t.wait_for_message("T", 0, 0, 5):
                woke.set()

        poller = threading.Thread(target=poll)
        poller.start()
        log.append([produce("T", 1, 1)])  # another queue: does not satisfy the poll
        log.append([produce("T", 0, 1)])
        poller.join(5)
        assert woke.is_set()


def test_resumes_from_the_stored_index(tmp_path: Path) -> None:
    log = InProcessLog()
    for _ in range(5):
        log.append([produce("T", 0, 2)])
    path = tmp_path / "store"
    with MessageStore(path) as store, DispatcherThread(log, store, settings=FAST) as t:
        assert t.wait_dispatched(5, 5)
    for _ in range(3):
        log.append([produce("T", 0, 2)])
    seen: list[DispatchProgress] = []
    with MessageStore(path) as store:
        t = DispatcherThread(log, store, settings=FAST, on_progress=seen.append)
        assert t.dispatched_index == 5  # before start: where it will resume
        with t:
            assert t.wait_dispatched(8, 5)
        assert seen[0].outputs[0].raft_index == 6
        assert [r.queue_offset for r in store.read_queue("T", 0, 0, 100)] == list(range(16))


def test_a_listener_failure_does_not_stop_dispatch(store: MessageStore) -> None:
    log = InProcessLog()

    def boom(_: DispatchProgress) -> None:
        raise RuntimeError("listener bug")

    with DispatcherThread(log, store, settings=FAST, on_progress=boom) as t:
        log.append([produce("T", 0, 1)])
        log.append([produce("T", 0, 1)])
        assert t.wait_dispatched(2, 5)
        assert t.failure is None


class GappyLog(InProcessLog):
    """A broken log that skips an index: the dispatcher must stop, not skip entries."""

    def read_from(self, start: int, *, max_bytes: int, max_entries: int) -> list[Entry]:
        return [Entry(e.index + 1, e.term, e.chunks) for e in super().read_from(
            start, max_bytes=max_bytes, max_entries=max_entries)]  # fmt: skip


def test_a_gap_stops_the_thread_loudly(store: MessageStore) -> None:
    log = GappyLog()
    log.append([produce("T", 0, 1)])
    t = DispatcherThread(log, store, settings=FAST)
    t.start()
    with pytest.raises(DispatcherStoppedError):
        t.wait_dispatched(1, 5)
    assert t.failure is not None and "expected raft index 1" in str(t.failure)
    assert store.dispatched_index == 0
    t.stop()


def test_stop_is_prompt_and_waiters_are_released(store: MessageStore) -> None:
    log = InProcessLog()
    t = DispatcherThread(log, store, settings=FAST)
    t.start()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            t.wait_dispatched(1, 10)
        except DispatcherStoppedError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    t.stop(timeout_s=2)
    waiter.join(2)
    assert not waiter.is_alive() and len(errors) == 1
    assert not t.running


def test_a_thread_waiting_for_dispatch_is_woken_by_it(store: MessageStore) -> None:
    """A round notifies only when some thread waits (most rounds have none): every waiter,
    however many and whatever it waits for, is still woken by the round that satisfies it,
    not by its timeout."""
    log = InProcessLog()
    with DispatcherThread(log, store, settings=FAST) as t:
        assert t.wait_dispatched(log.append([produce("T", 0, 1)]).index, 5)
        woken: list[float] = []
        started = threading.Barrier(4)

        def wait(ready: Callable[[], bool]) -> None:
            started.wait()
            t0 = time.monotonic()
            assert ready()
            woken.append(time.monotonic() - t0)

        waiters = [
            threading.Thread(target=wait, args=(lambda: t.wait_dispatched(2, 30),)),
            threading.Thread(target=wait, args=(lambda: t.wait_term(2, 30),)),
            threading.Thread(target=wait, args=(lambda: t.wait_for_message("T", 0, 1, 30),)),
        ]
        for w in waiters:
            w.start()
        started.wait()
        time.sleep(0.2)  # the three are in their waits (dispatch rounds go on meanwhile)
        log.append([produce("T", 0, 1)], term=2)
        for w in waiters:
            w.join(10)
        assert len(woken) == 3 and max(woken) < 5, woken


def test_a_gathered_round_shares_one_transaction_and_stop_ends_it(store: MessageStore) -> None:
    """A follower's round (here 60 s long) takes every entry committed while it waited into one
    transaction once something ends it (a waiter here); stop() ends a round at once too."""
    log = InProcessLog()
    seen: list[DispatchProgress] = []
    gathering = DispatcherSettings(poll_timeout_ms=10, follower_round_ms=60_000)
    t = DispatcherThread(
        log, store, settings=gathering, on_progress=seen.append, is_leader=lambda: False
    )
    with t:
        for _ in range(3):
            log.append([produce("T", 0, 1)])
        time.sleep(0.2)
        assert t.dispatched_index == 0 and t.rounds_gathered == 1
        assert t.wait_dispatched(3, 5)
        assert [len(p.outputs) for p in seen] == [3]
        log.append([produce("T", 0, 1)])
        time.sleep(0.2)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 2 and not t.running
    assert t.dispatched_index == 3  # stopped within the round: the fourth was never read
