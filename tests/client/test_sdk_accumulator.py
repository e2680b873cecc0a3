"""The producer's accumulator: linger and size rules, one batch in flight per queue by default
and up to max_inflight_per_queue sealed late (the fast path), idempotent sequence numbers (kept
by a retry, handed out again only when a batch surely never left), and the buffer bound. Time is
passed in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.client.accumulator import Accumulator, Batch
from raftmq.common.types import QueueRef

Q0 = QueueRef("T", "broker-a", 0)
Q1 = QueueRef("T", "broker-b", 1)


def acc(linger_ms: int = 0, max_messages: int = 4, max_bytes: int = 1000) -> Accumulator[str]:
    return Accumulator(
        linger_ms=linger_ms,
        batch_max_messages=max_messages,
        batch_max_bytes=max_bytes,
        max_buffered_messages=10,
        max_buffered_bytes=10_000,
    )


def items(*names: str, size: int = 10) -> list[tuple[str, int]]:
    return [(n, size) for n in names]


def test_without_linger_the_first_message_leaves_at_once_and_the_rest_wait_for_it() -> None:
    a = acc()
    first = a.append(Q0, items("m0"), now_ms=0)
    assert first.batch is not None and first.batch.items == ("m0",) and first.wake_at_ms is None
    # While m0's request is in flight, later messages accumulate: that is the batching.
    for i in range(1, 6):
        assert a.append(Q0, items(f"m{i}"), now_ms=i).batch is None
    nxt = a.complete(first.batch, now_ms=10)
    assert nxt is not None and nxt.items == ("m1", "m2", "m3", "m4"), "batch_max_messages=4"
    assert nxt.first_sequence == 1
    last = a.complete(nxt, now_ms=11)
    assert last is not None and last.items == ("m5",) and last.first_sequence == 5
    assert a.complete(last, now_ms=12) is None
    assert a.buffered_messages == 0 and a.buffered_bytes == 0


def test_linger_holds_a_batch_until_it_is_due_or_full() -> None:
    a = acc(linger_ms=5, max_messages=3)
    r = a.append(Q0, items("a"), now_ms=100)
    assert r.batch is None and r.wake_at_ms == 105, "the first waiting message starts the linger"
    r = a.append(Q0, items("b"), now_ms=101)
    assert r.batch is None and r.wake_at_ms is None, "the timer is armed already"
    batch = a.due(Q0, now_ms=105)
    assert batch is not None and batch.items == ("a", "b")
    # Full before the linger ends: it leaves at once (when nothing is in flight).
    a.complete(batch, now_ms=106)
    r = a.append(Q0, items("c", "d", "e", "f"), now_ms=107)
    assert r.batch is not None and r.batch.items == ("c", "d", "e")
    assert a.pending_count(Q0) == 1


def test_the_byte_limit_cuts_a_batch_but_never_leaves_one_empty() -> None:
    a = acc(max_messages=100, max_bytes=25)
    r = a.append(Q0, [("big", 40), ("s1", 10), ("s2", 10), ("s3", 10)], now_ms=0)
    assert r.batch is not None and r.batch.items == ("big",), "an oversize item goes alone"
    nxt = a.complete(r.batch, now_ms=1)
    assert nxt is not None and nxt.items == ("s1", "s2") and nxt.size_bytes == 20


def test_queues_are_independent_and_sequences_are_per_queue() -> None:
    a = acc()
    b0 = a.append(Q0, items("x"), now_ms=0).batch
    b1 = a.append(Q1, items("y"), now_ms=0).batch
    assert b0 is not None and b1 is not None
    assert (b0.first_sequence, b1.first_sequence) == (0, 0)
    a.complete(b0, now_ms=1)
    b0b = a.append(Q0, items("z"), now_ms=2).batch
    assert b0b is not None and b0b.first_sequence == 1 and a.next_sequence(Q1) == 1


def test_a_retry_is_the_same_batch_and_an_abandoned_one_returns_its_sequences() -> None:
    a = acc()
    b = a.append(Q0, items("m0", "m1"), now_ms=0).batch
    assert b is not None and a.inflight(Q0) is b
    # A failed attempt is retried with the very same value: same queue, same first sequence.
    a.append(Q0, items("m2"), now_ms=1)
    assert a.inflight(Q0) is b and a.next_sequence(Q0) == 2
    # It never reached a broker and moves to another group: the queue's next batch reuses 0..
    nxt = a.abandon(b, now_ms=2)
    assert nxt is not None and nxt.items == ("m2",) and nxt.first_sequence == 0
    moved = a.append(Q1, items("m0", "m1"), now_ms=2).batch
    assert moved is not None and moved.first_sequence == 0
    with pytest.raises(ValueError, match="not in flight"):
        a.complete(b, now_ms=3)


def test_buffer_bound_counts_in_flight_messages_and_admits_anything_when_empty() -> None:
    a = Accumulator[str](
        linger_ms=0,
        batch_max_messages=100,
        batch_max_bytes=10_000,
        max_buffered_messages=3,
        max_buffered_bytes=100,
    )
    assert a.has_room(50, 5_000), "an empty buffer takes a request larger than the bound"
    b = a.append(Q0, items("a", "b"), now_ms=0).batch
    assert b is not None
    assert a.has_room(1, 10) and not a.has_room(2, 10), "in-flight messages still count"
    assert not a.has_room(1, 90), "the byte bound"
    a.complete(b, now_ms=1)
    assert a.has_room(3, 100)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["append", "due", "complete", "abandon"]),
            st.integers(0, 1),  # which queue
            st.integers(1, 5),  # messages appended
            st.integers(0, 30),  # size of each
            st.integers(0, 7),  # ms passing
            st.integers(1, 3),  # messages per item (a batch-first call's bodies are one item)
        ),
        max_size=80,
    ),
    st.integers(0, 10),
)
def test_invariants_under_any_interleaving(
    ops: list[tuple[str, int, int, int, int, int]], linger_ms: int
) -> None:
    """Whatever happens: every message leaves exactly once per queue in order (abandoned ones
    are sent again elsewhere by the caller, so here they are re-appended), one batch is in
    flight per queue, stored sequences are contiguous from 0 with each item of n messages
    taking n of them, no batch holds more than batch_max_messages messages, and the buffer
    counts add up."""
    a = Accumulator[tuple[int, int, int]](
        linger_ms=linger_ms,
        batch_max_messages=3,
        batch_max_bytes=40,
        max_buffered_messages=1_000,
        max_buffered_bytes=100_000,
        count_of=lambda item: item[2],
    )
    queues = (Q0, Q1)
    now = 0
    serial = 0
    inflight: dict[QueueRef, Batch[tuple[int, int, int]]] = {}
    stored: dict[QueueRef, list[tuple[int, int]]] = {Q0: [], Q1: []}  # (sequence, item id)
    appended: dict[QueueRef, list[int]] = {Q0: [], Q1: []}

    def took(q: QueueRef, batch: Batch[tuple[int, int, int]] | None) -> None:
        if batch is not None:
            assert q not in inflight, "two batches of one queue in flight"
            assert batch.queue == q and batch.items
            assert batch.count == sum(item[2] for item in batch.items) <= 3
            inflight[q] = batch

    def store(q: QueueRef, b: Batch[tuple[int, int, int]]) -> None:
        seq = b.first_sequence
        for item in b.items:
            for _ in range(item[2]):  # each message of the item: (its sequence, the item)
                stored[q].append((seq, item[0]))
                seq += 1

    for op, qi, count, size, dt, per_item in ops:
        now += dt
        q = queues[qi]
        if op == "append":
            new = []
            for _ in range(count):
                new.append(((serial, size, per_item), size))
                appended[q].extend([serial] * per_item)
                serial += 1
            took(q, a.append(q, new, now).batch)
        elif op == "due":
            took(q, a.due(q, now))
        elif q in inflight:
            b = inflight.pop(q)
            if op == "complete":
                store(q, b)
                took(q, a.complete(b, now))
            else:
                took(q, a.abandon(b, now))
                other = queues[1 - qi]
                for item in b.items:
                    for _ in range(item[2]):
                        appended[q].remove(item[0])
                        appended[other].append(item[0])
                took(other, a.append(other, [(item, item[1]) for item in b.items], now).batch)
    # Drain: flush lingers, complete everything.
    for _ in range(10_000):
        progressed = False
        for q in queues:
            took(q, a.due(q, now))
            if q in inflight:
                b = inflight.pop(q)
                store(q, b)
                took(q, a.complete(b, now))
                progressed = True
        if not progressed:
            break
    assert a.buffered_messages == 0 and a.buffered_bytes == 0
    for q in queues:
        seqs = [s for s, _ in stored[q]]
        assert seqs == list(range(len(seqs))), "sequences contiguous from 0, no gap"
        assert [i for _, i in stored[q]] == appended[q], "each item once, in append order"


def windowed(max_inflight: int = 3) -> Accumulator[str]:
    return Accumulator(
        linger_ms=0,
        batch_max_messages=4,
        batch_max_bytes=1000,
        max_buffered_messages=100,
        max_buffered_bytes=10_000,
        max_inflight_per_queue=max_inflight,
        seal_on_send=True,
    )


def test_several_batches_in_flight_are_sealed_with_what_arrived_meanwhile() -> None:
    """The fast path: a batch cut on the caller's thread takes, when the I/O loop seals it, the
    messages that arrived meanwhile; then up to max_inflight_per_queue batches fly at once,
    with contiguous sequences; the oldest is the one that may skip a gap."""
    a = windowed()
    first = a.append(Q0, items("m0"), now_ms=0).batch
    assert first is not None
    for i in (1, 2):  # arrive before the loop sealed it: they wait, no second batch is cut
        assert a.append(Q0, items(f"m{i}"), now_ms=i).batch is None
    sealed, nxt = a.seal(first, now_ms=3)
    assert sealed.items == ("m0", "m1", "m2") and nxt is None
    assert a.seal(sealed, now_ms=3) == (sealed, None)  # sealed once
    second = a.append(Q0, items("m3"), now_ms=4).batch
    assert second is not None and second.first_sequence == 3
    second, _ = a.seal(second, now_ms=4)
    third = a.append(Q0, items("m4"), now_ms=5).batch
    assert third is not None and third.first_sequence == 4
    third, _ = a.seal(third, now_ms=5)
    assert a.append(Q0, items("m5"), now_ms=6).batch is None  # window of 3 full
    assert a.inflight_count(Q0) == 3 and a.is_oldest(sealed) and not a.is_oldest(second)
    # answers may come in any order; the window moves on when any completes
    fourth = a.complete(second, now_ms=7)
    assert fourth is not None and fourth.items == ("m5",) and fourth.first_sequence == 5
    assert a.is_oldest(sealed)
    assert a.complete(sealed, now_ms=8) is None
    assert a.is_oldest(third)


def test_abandoning_an_older_batch_leaves_a_gap_the_next_oldest_skips() -> None:
    a = windowed()
    b0 = a.append(Q0, items("m0"), now_ms=0).batch
    assert b0 is not None
    b0, _ = a.seal(b0, now_ms=0)
    b1 = a.append(Q0, items("m1"), now_ms=1).batch
    assert b1 is not None
    b1, _ = a.seal(b1, now_ms=1)
    a.abandon(b0, now_ms=2)  # surely never sent, but b1 (sequence 1) is in flight: no reuse
    assert a.is_oldest(b1) and a.next_sequence(Q0) == 2
    a.abandon(b1, now_ms=3)  # the newest: its sequences are handed out again
    assert a.next_sequence(Q0) == 1


def test_seal_fills_up_to_the_batch_limit_and_cuts_the_next() -> None:
    a = windowed()
    b = a.append(Q0, items("m0"), now_ms=0).batch
    assert b is not None
    assert a.append(Q0, items("m1", "m2", "m3", "m4", "m5"), now_ms=1).batch is None
    sealed, nxt = a.seal(b, now_ms=2)
    assert sealed.items == ("m0", "m1", "m2", "m3")
    assert nxt is not None and nxt.items == ("m4", "m5") and nxt.first_sequence == 4
    assert a.seal(nxt, now_ms=2) == (nxt, None)  # nothing more waited
    assert a.buffered_messages == 6
