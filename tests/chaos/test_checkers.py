"""The checkers catch what they claim to: hand-made histories with one bug each, and Hypothesis
histories that are correct by construction (valid) or broken in one known way (invalid)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.checkers import (
    check_all,
    check_latency,
    check_order,
    check_queue,
    check_windows,
    required_pairs,
    unavailability,
)
from chaos.history import Op, OpType, Window, fault_windows


class H:
    """A history builder with explicit times."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.t = 0.0

    def op(self, process: str, type: OpType, f: str, **value: Any) -> H:
        self.t += 0.01
        self.ops.append(Op(self.t, process, type, f, value))  # type: ignore[arg-type]
        return self

    def send(self, p: str, i: str, key: str | None = "k", outcome: OpType = "ok", **v: Any) -> H:
        self.op(p, "invoke", "send", id=i, key=key)
        return self.op(p, outcome, "send", id=i, key=key, **v)

    def recv(self, i: str, key: str | None = "k", **v: Any) -> H:
        return self.op("consumer-0", "ok", "recv", id=i, key=key, **v)

    def nemesis(self, phase: str, fault: str = "kill(leader)") -> H:
        return self.op("nemesis", "info", "nemesis", fault=fault, targets=["n0"], phase=phase)


def test_clean_history_is_valid() -> None:
    h = H().send("p0", "a").send("p0", "b").recv("a").recv("b")
    r = check_all(h.ops, [], scenario="s", seed=1)
    assert r.valid and r.queue.acked == 2 and r.order.pairs == 1
    assert r.verdict().startswith("PASS s seed=1: 2 acked, 0 lost")


def test_lost_acknowledged_message() -> None:
    h = H().send("p0", "a").send("p0", "b").recv("a")
    q = check_queue(h.ops)
    assert not q.valid and q.lost == 1 and q.samples["lost"] == ["b"]
    assert check_all(h.ops, [], scenario="s", seed=1).verdict().startswith("FAIL")


def test_unexpected_duplicate_recovered_and_failed_delivered() -> None:
    h = (
        H()
        .send("p0", "a")
        .send("p0", "b", outcome="info")
        .send("p0", "c", outcome="fail")
        .recv("a")
        .recv("a")
        .recv("b")
        .recv("zz")
    )
    q = check_queue(h.ops)
    assert (q.unexpected, q.duplicated, q.duplicated_ids, q.recovered) == (1, 1, 1, 1)
    assert q.fail_delivered == 0 and not q.valid  # unexpected alone fails
    q2 = check_queue(H().send("p0", "c", outcome="fail").recv("c").ops)
    assert q2.fail_delivered == 1 and not q2.valid


def test_an_unknown_send_never_delivered_is_not_lost() -> None:
    q = check_queue(H().send("p0", "a", outcome="info").ops)
    assert q.valid and q.unknown == 1 and q.lost == 0


def test_injected_reordering_of_sequential_sends_fails() -> None:
    h = H().send("p0", "a").send("p0", "b").recv("b").recv("a")
    o = check_order(h.ops)
    assert not o.valid and o.reorder == 1 and o.samples["reorder"] == ["a<b"]


def test_concurrent_sends_on_a_key_may_arrive_in_any_order() -> None:
    h = H()
    h.op("p0", "invoke", "send", id="a", key="k")
    h.op("p0", "invoke", "send", id="b", key="k")  # before a's ack: concurrent
    h.op("p0", "ok", "send", id="a", key="k")
    h.op("p0", "ok", "send", id="b", key="k")
    h.recv("b").recv("a")
    assert required_pairs(h.ops) == [] and check_order(h.ops).valid


def test_other_producers_and_keys_are_not_ordered_with_each_other() -> None:
    h = H().send("p0", "a", key="k1").send("p1", "b", key="k1").send("p0", "c", key="k2")
    h.recv("c", key="k2").recv("b", key="k1").recv("a", key="k1")
    assert check_order(h.ops).valid


def test_gap_is_a_violation_rewind_is_not() -> None:
    gap = H().send("p0", "a").send("p0", "b").recv("b")
    assert check_order(gap.ops).gap == 1 and not check_order(gap.ops).valid
    rewind = H().send("p0", "a").send("p0", "b").recv("a").recv("b").recv("a").recv("b")
    o = check_order(rewind.ops)
    assert o.valid and o.rewind == 1


def test_inconsistent_offsets() -> None:
    h = H().send("p0", "a", queue="g:0", offset=5).send("p0", "b", queue="g:0", offset=5)
    o = check_order(h.ops)
    assert o.inconsistent_offsets == 1 and not o.valid
    ok = H().send("p0", "a", queue="g:0", offset=5).recv("a", queue="g:0", offset=5)
    assert check_order(ok.ops).valid


def test_windows_failover_in_fault_and_after_heal() -> None:
    h = H().send("p0", "a").nemesis("start")
    h.t += 1.0
    h.send("p0", "b", outcome="info")  # fails inside the fault...
    h.t += 0.5
    h.send("p0", "c")  # ...and service returns before the heal
    h.t += 2.0
    h.nemesis("stop")
    h.send("p0", "d")
    [w] = check_windows(h.ops, fault_windows(h.ops))
    assert w.recovered_in_fault and w.rto_s is not None and 0.5 < w.rto_s < 0.6
    assert 2.0 < w.longest_gap_s < 2.1  # from c's ack to the heal
    assert w.first_ack_s is not None and 1.5 < w.first_ack_s < 1.6
    h2 = H().nemesis("start").send("p0", "x", outcome="info")
    h2.t += 3
    h2.nemesis("stop").send("p0", "y")
    [w2] = check_windows(h2.ops, fault_windows(h2.ops))
    assert not w2.recovered_in_fault and w2.longest_gap_s > 3
    assert unavailability(h2.ops) and unavailability(h2.ops)[0][1] == h2.ops[-1].time


def test_unhealed_window_and_latency() -> None:
    h = H().send("p0", "a").nemesis("start").send("p0", "b").recv("a").recv("b")
    [w] = fault_windows(h.ops)
    assert w.stop is None
    lat = check_latency(h.ops, [w])
    assert lat["send_in_fault"]["count"] == 1 and lat["send_outside_fault"]["count"] == 1
    assert sum(lat["end_to_end"].values()) == 2


def test_empty_history() -> None:
    r = check_all([], [], scenario="s", seed=0)
    assert r.valid and r.queue.attempts == 0 and r.worst_gap_s is None


# ---- properties ---------------------------------------------------------------------------------

histories = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(["k0", "k1", None])), min_size=1, max_size=60
)


def correct(sends: list[tuple[int, str | None]]) -> tuple[H, list[str]]:
    """Sequential sends by 3 producers, every one acknowledged and delivered once, in order."""
    h = H()
    ids = []
    for n, (p, key) in enumerate(sends):
        h.send(f"p{p}", f"m{n}", key=key, queue=f"g:{p}", offset=n)
        ids.append(f"m{n}")
    for n, (p, key) in enumerate(sends):
        h.recv(f"m{n}", key=key, queue=f"g:{p}", offset=n)
    return h, ids


@settings(max_examples=80, deadline=None)
@given(histories)
def test_correct_histories_are_valid(sends: list[tuple[int, str | None]]) -> None:
    h, _ = correct(sends)
    assert check_all(h.ops, [], scenario="p", seed=0).valid


@settings(max_examples=80, deadline=None)
@given(histories, st.integers(0, 10_000))
def test_dropping_any_acked_delivery_is_lost(sends: list[tuple[int, str | None]], k: int) -> None:
    h, ids = correct(sends)
    victim = ids[k % len(ids)]
    ops = [op for op in h.ops if not (op.f == "recv" and op.value["id"] == victim)]
    q = check_queue(ops)
    assert q.lost == 1 and q.samples["lost"] == [victim]


@settings(max_examples=80, deadline=None)
@given(histories, st.integers(0, 10_000))
def test_swapping_a_required_pair_is_reorder(sends: list[tuple[int, str | None]], k: int) -> None:
    h, _ = correct(sends)
    pairs = required_pairs(h.ops)
    if not pairs:
        return
    a, b = pairs[k % len(pairs)]
    recvs = [op for op in h.ops if op.f == "recv"]
    ia = next(i for i, op in enumerate(recvs) if op.value["id"] == a)
    ib = next(i for i, op in enumerate(recvs) if op.value["id"] == b)
    recvs[ia], recvs[ib] = recvs[ib], recvs[ia]
    sends_only = [op for op in h.ops if op.f != "recv"]
    t = sends_only[-1].time
    swapped = [Op(t + 0.01 * (n + 1), op.process, op.type, op.f, op.value) for n, op in
               enumerate(recvs)]  # fmt: skip
    assert check_order(sends_only + swapped).reorder >= 1


def test_window_pairs_starts_and_stops_by_fault() -> None:
    h = H().nemesis("start", "a").nemesis("start", "b").nemesis("stop", "a").nemesis("stop", "b")
    ws = fault_windows(h.ops)
    assert [(w.fault, w.stop is not None) for w in ws] == [("a", True), ("b", True)]
    assert ws[0].stop is not None and ws[0].stop < (ws[1].stop or 0)
    assert isinstance(ws[0], Window)
