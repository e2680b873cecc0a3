"""The POP state machine of one queue (common/pop.py), driven directly: hand-outs, invisibility,
acks with current and stale tokens, FIFO blocking, and the committed offset never passing an
unacknowledged message (a property test over random operation sequences)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.common.pop import AckOutcome, QueuePop


def _take(p: QueuePop, now: int, n: int, invisible: int = 1000, queue_end: int = 10**6) -> list:
    plan = p.plan(now, n)
    out = [d for o in plan.redeliver if (d := p.redeliver(o, now, invisible)) is not None]
    if plan.new_from is not None and plan.new_max > 0:
        offsets = list(range(plan.new_from, min(plan.new_from + plan.new_max, queue_end)))
        if offsets:
            out += p.claim_new(
                plan.new_from, offsets, offsets[-1] + 1, now, invisible, n - len(out)
            )
    return out


def test_hand_out_ack_commit() -> None:
    p = QueuePop(5, fifo=False, max_inflight=100)
    ds = _take(p, 0, 3)
    assert [d.offset for d in ds] == [5, 6, 7] and all(d.attempt == 1 for d in ds)
    assert p.commit_due() is None  # nothing acknowledged yet
    assert p.ack(6, ds[1].token) is AckOutcome.DONE
    assert p.low_watermark() == 5  # 5 is still unacknowledged
    assert p.ack(5, ds[0].token) is AckOutcome.DONE
    assert p.commit_due() == 7
    p.committed(7)
    assert p.commit_due() is None
    assert p.ack(5, ds[0].token) is AckOutcome.ALREADY
    assert p.ack(99, 1) is AckOutcome.UNKNOWN


def test_invisible_then_redelivered_with_new_token() -> None:
    p = QueuePop(0, fifo=False, max_inflight=100)
    [d] = _take(p, 0, 1, invisible=1000)
    old = d.token
    assert _take(p, 999, 1, queue_end=1) == []  # still invisible, nothing new
    [again] = _take(p, 1000, 1, queue_end=1)
    assert again.offset == 0 and again.attempt == 2 and again.token != old
    assert p.ack(0, old) is AckOutcome.STALE
    assert p.ack(0, again.token) is AckOutcome.DONE


def test_change_invisible_extends_and_retokens() -> None:
    p = QueuePop(0, fifo=False, max_inflight=100)
    [d] = _take(p, 0, 1, invisible=1000)
    old = d.token
    outcome, nd = p.change_invisible(0, old, 500, 10_000)
    assert outcome is AckOutcome.DONE and nd is not None and nd.visible_at_ms == 10_500
    assert _take(p, 2000, 1, queue_end=1) == []
    assert nd.token != old
    assert p.change_invisible(0, old, 600, 10)[0] is AckOutcome.STALE
    assert p.ack(0, nd.token) is AckOutcome.DONE


def test_fifo_blocks_until_acked_and_redelivers_in_order() -> None:
    p = QueuePop(0, fifo=True, max_inflight=100)
    ds = _take(p, 0, 2)
    assert [d.offset for d in ds] == [0, 1]
    assert _take(p, 10, 5) == []  # unacknowledged: nothing new
    assert p.ack(1, ds[1].token) is AckOutcome.DONE  # acked out of order: 0 still blocks
    assert _take(p, 10, 5) == []
    again = _take(p, 1000, 5)
    assert [d.offset for d in again] == [0]
    p.ack(0, again[0].token)
    assert [d.offset for d in _take(p, 1001, 2)] == [2, 3]


def test_claim_after_another_receive_moved_the_cursor_is_refused() -> None:
    p = QueuePop(0, fifo=False, max_inflight=100)
    assert p.claim_new(0, [0, 1], 2, 0, 1000, 5)
    assert p.claim_new(0, [0, 1], 2, 0, 1000, 5) == []  # the same pull's answer, again


def test_inflight_bound() -> None:
    p = QueuePop(0, fifo=False, max_inflight=3)
    assert len(_take(p, 0, 10)) == 3
    assert _take(p, 1, 10) == []


def test_filtered_messages_are_skipped_and_committed_past() -> None:
    p = QueuePop(0, fifo=False, max_inflight=10)
    p.skip_to(0, 50)
    assert p.cursor == 50 and p.commit_due() == 50
    ds = p.claim_new(50, [53, 57], 60, 0, 1000, 1)  # took one of two matches
    assert [d.offset for d in ds] == [53] and p.cursor == 54


def test_tokens_shared_across_states_never_repeat() -> None:
    tokens = itertools.count(1)
    a = QueuePop(0, fifo=False, max_inflight=10, tokens=tokens)
    b = QueuePop(0, fifo=False, max_inflight=10, tokens=tokens)
    ta = {d.token for d in _take(a, 0, 3)}
    tb = {d.token for d in _take(b, 0, 3)}
    assert not ta & tb


ops = st.lists(
    st.tuples(st.sampled_from(["take", "ack", "stale_ack", "change", "tick"]), st.integers(0, 20)),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, fifo=st.booleans())
def test_commit_never_passes_an_unacknowledged_message(ops: list, fifo: bool) -> None:
    p = QueuePop(0, fifo=fifo, max_inflight=8)
    now = 0
    acked: set[int] = set()
    handed: dict[int, int] = {}  # offset -> newest token
    for op, n in ops:
        if op == "take":
            for d in _take(p, now, 1 + n % 4, invisible=50, queue_end=40):
                assert d.offset not in acked, "an acknowledged message was handed out again"
                handed[d.offset] = d.token
        elif op in ("ack", "stale_ack") and handed:
            offset = sorted(handed)[n % len(handed)]
            token = handed[offset] - (1 if op == "stale_ack" else 0)
            if p.ack(offset, token) is AckOutcome.DONE:
                assert op == "ack"
                acked.add(offset)
                del handed[offset]
        elif op == "change" and handed:
            offset = sorted(handed)[n % len(handed)]
            _, d = p.change_invisible(offset, handed[offset], now, 10 + n)
            if d is not None:
                handed[offset] = d.token
        else:
            now += 10 * n
        due = p.commit_due()
        if due is not None:
            assert all(
                o in acked for o in range(due) if o in handed or o in acked or o < p.cursor
            ), "committed past an unacknowledged message"
            assert not any(o < due for o in handed), "committed past an unacknowledged message"
            p.committed(due)
        assert set(p.inflight) == set(handed), "in flight is what was handed out and not acked"


def test_exhausted_after_max_attempts_and_dropped_counts_as_done() -> None:
    p = QueuePop(0, fifo=True, max_inflight=100)
    [d] = _take(p, 0, 1, invisible=1000)
    assert not p.exhausted(0, 2)  # delivered once
    [d] = _take(p, 1000, 1, invisible=1000)
    assert d.attempt == 2 and p.exhausted(0, 2) and not p.exhausted(0, 3)
    assert not p.exhausted(1, 2)  # never delivered
    p.drop(0)  # dead-lettered: no longer waited for
    assert not p.exhausted(0, 2) and p.commit_due() == 1
    assert p.ack(0, d.token) is AckOutcome.ALREADY
