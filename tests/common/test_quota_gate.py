"""common/quota_gate.py's hold on a handler thread (issue 27, the broker's gRPC service): a user
over its quota is held while it holds fewer than its share of threads; past its share (or the
share of all users) its call is refused at once with the wait to honour, and nothing is held;
another user is held or served as if the first were not there; a call that ends wakes its hold."""

from __future__ import annotations

import threading
import time

import pytest

from raftmq.common.quota import Flow, QuotaTable
from raftmq.common.quota_gate import QuotaGate, ThreadHold

RATE = 10_000  # bytes per second: alice's and carol's produce quota (bob has none)


def gate(per_user: int, total: int) -> QuotaGate:
    g = QuotaGate(
        {Flow.PRODUCE: QuotaTable(0, {"alice": RATE, "carol": RATE})},
        max_held_threads=total,
        max_held_threads_per_user=per_user,
    )
    for user in ("alice", "carol"):  # each owes ~10 s: the burst (1 s) and 10 s more
        g.charge(Flow.PRODUCE, user, 11 * RATE)
    return g


class Holder:
    """One call held on its own thread until its `wake` is set."""

    def __init__(self, g: QuotaGate, user: str) -> None:
        self.wake = threading.Event()
        self.result: ThreadHold | None = None
        self.thread = threading.Thread(target=self._run, args=(g, user))
        self.thread.start()

    def _run(self, g: QuotaGate, user: str) -> None:
        self.result = g.hold(Flow.PRODUCE, user, 60_000, self.wake)

    def end(self) -> ThreadHold:
        self.wake.set()
        self.thread.join(10)
        assert self.result is not None
        return self.result


def held_threads(g: QuotaGate, n: int) -> None:
    deadline = time.monotonic() + 10
    while g.held_threads != n:
        assert time.monotonic() < deadline, f"{g.held_threads} held, not {n}"
        time.sleep(0.005)


def test_past_its_share_a_users_call_is_refused_at_once_and_another_user_is_held() -> None:
    g = gate(per_user=2, total=8)
    a1, a2 = Holder(g, "alice"), Holder(g, "alice")
    held_threads(g, 2)
    third = g.hold(Flow.PRODUCE, "alice", 60_000)
    assert third.held_ms == 0 and third.refused is not None  # refused before any wait
    assert third.refused.code == "THROTTLED"
    retry = third.refused.retry_after_ms
    assert retry == third.owed_ms and 9_000 <= retry <= 10_000, (retry, third)
    assert "2 calls of 'alice'" in third.refused.message, third.refused.message
    carol = Holder(g, "carol")  # alice's share is hers only
    held_threads(g, 3)
    assert g.hold(Flow.PRODUCE, "bob", 60_000) == ThreadHold(0, 0)  # no quota: never held
    for h in (a1, a2, carol):
        r = h.end()  # woken: the call ended (cancelled, the server stopping)
        assert r.refused is None and r.owed_ms > 0
    held_threads(g, 0)  # every thread given back: alice may be held again
    again = Holder(g, "alice")
    held_threads(g, 1)
    assert again.end().refused is None


def test_the_share_of_all_users_bounds_the_threads_held_together() -> None:
    g = gate(per_user=2, total=2)
    a, c = Holder(g, "alice"), Holder(g, "carol")
    held_threads(g, 2)
    refused = g.hold(Flow.PRODUCE, "carol", 60_000).refused  # carol's own share is not full
    assert refused is not None and "2 calls of users over their quotas" in refused.message
    a.end()
    c.end()
    held_threads(g, 0)


def test_a_hold_ends_when_the_user_owes_nothing_and_says_how_long() -> None:
    g = QuotaGate({Flow.PRODUCE: QuotaTable(RATE)}, max_held_threads=1)
    g.charge(Flow.PRODUCE, "", RATE + RATE // 2)  # the burst and 500 ms more
    t0 = time.monotonic()
    hold = g.hold(Flow.PRODUCE, "", 60_000)
    took_ms = (time.monotonic() - t0) * 1000
    assert hold.refused is None and hold.owed_ms == 0  # its turn came
    # held what it owed (less the time since the charge), and really slept it
    assert 0 < hold.held_ms <= 500 and took_ms >= hold.held_ms - 5, (hold, took_ms)
    [(_user, _flow, usage)] = [u for u in g.usage() if u[1] == "produce"]
    assert (usage.throttled, usage.throttle_ms) == (1, hold.held_ms)
    # within a budget smaller than the debt: held the budget, still owing
    g.charge(Flow.PRODUCE, "", RATE)
    short = g.hold(Flow.PRODUCE, "", 50)
    assert short.held_ms == 50 and short.owed_ms > 0 and g.held_threads == 0


@pytest.mark.parametrize("budget_ms", [0, -1])
def test_no_budget_holds_nothing_and_tells_the_debt(budget_ms: int) -> None:
    g = gate(per_user=1, total=1)
    hold = g.hold(Flow.PRODUCE, "alice", budget_ms)
    assert hold.held_ms == 0 and hold.refused is None and hold.owed_ms > 9_000
