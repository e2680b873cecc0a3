"""The chaos checkers on hand-made histories (each violation they must flag, each legal
behaviour they must let through) and on generated ones (Hypothesis)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.chaos.checkers import (
    NodeView,
    check_all,
    check_availability,
    check_latency,
    check_leadership,
    check_order,
    check_queue,
    check_rejoined,
    unavailability,
)
from raftmq.chaos.history import Op, OpType, Window, fault_windows


@dataclass
class H:
    """A history builder with explicit times (seconds)."""

    ops: list[Op] = field(default_factory=list)

    def send(
        self,
        msg_id: str,
        invoke: float,
        done: float | None,
        *,
        key: str | None = None,
        outcome: OpType = "ok",
        process: str = "producer-0",
        queue: str | None = None,
        offset: int | None = None,
    ) -> H:
        self.ops.append(Op(invoke, process, "invoke", "send", {"id": msg_id, "key": key}))
        if done is not None:
            value: dict[str, Any] = {"id": msg_id, "key": key}
            if queue is not None and offset is not None:
                value |= {"queue": queue, "offset": offset}
            self.ops.append(Op(done, process, outcome, "send", value))
        return self

    def recv(
        self,
        msg_id: str,
        t: float,
        *,
        key: str | None = None,
        queue: str = "broker-a:0",
        offset: int | None = None,
    ) -> H:
        value: dict[str, Any] = {"id": msg_id, "key": key, "queue": queue}
        if offset is not None:
            value["offset"] = offset
        self.ops.append(Op(t, "consumer-0", "ok", "recv", value))
        return self

    def fault(self, name: str, start: float, stop: float | None) -> H:
        for t, phase in ((start, "start"), (stop, "stop")):
            if t is not None:
                value = {"fault": name, "targets": ["broker-a-0"], "phase": phase}
                self.ops.append(Op(t, "nemesis", "info", "nemesis", value))
        return self

    @property
    def history(self) -> list[Op]:
        return sorted(self.ops, key=lambda op: op.time)


# ---- queue --------------------------------------------------------------------------------------


def test_every_acked_message_delivered_once_is_valid() -> None:
    h = H().send("a", 0, 1).send("b", 2, 3).recv("a", 1.5).recv("b", 3.5)
    q = check_queue(h.history)
    assert q.valid
    assert (q.attempts, q.acked, q.failed, q.unknown, q.delivered) == (2, 2, 0, 0, 2)
    assert (q.lost, q.unexpected, q.duplicated, q.recovered, q.fail_delivered) == (0, 0, 0, 0, 0)
    assert q.to_json()["exactly_once"] is True


def test_lost_acked_message_fails() -> None:
    q = check_queue(H().send("a", 0, 1).send("b", 2, 3).recv("a", 4).history)
    assert not q.valid
    assert q.lost == 1
    assert q.samples["lost"] == ["b"]
    assert q.to_json()["at_least_once"] is False


def test_unexpected_delivery_fails() -> None:
    q = check_queue(H().send("a", 0, 1).recv("a", 2).recv("ghost", 3).history)
    assert not q.valid
    assert q.unexpected == 1
    assert q.samples["unexpected"] == ["ghost"]
    assert q.duplicated == 0


def test_duplicate_is_counted_not_failed() -> None:
    h = H().send("a", 0, 1).send("b", 0, 1).recv("a", 2).recv("a", 3).recv("a", 4).recv("b", 5)
    q = check_queue(h.history)
    assert q.valid
    assert (q.duplicated, q.duplicated_ids, q.delivered, q.delivered_ids) == (2, 1, 4, 2)
    assert q.duplicate_rate == 1.0  # 2 extra copies / 2 acked
    assert q.samples["duplicated"] == ["a"]
    assert q.to_json()["at_most_once"] is False


def test_unknown_send_delivered_is_recovered() -> None:
    h = H().send("a", 0, 1, outcome="info").send("b", 0, None).recv("a", 2).recv("b", 3)
    q = check_queue(h.history)
    assert q.valid
    assert (q.unknown, q.recovered, q.acked) == (2, 2, 0)
    assert q.samples["recovered"] == ["a", "b"]


def test_unknown_send_never_delivered_is_not_lost() -> None:
    q = check_queue(H().send("a", 0, 1, outcome="info").history)
    assert q.valid
    assert q.lost == 0


def test_failed_send_delivered_fails() -> None:
    q = check_queue(H().send("a", 0, 1, outcome="fail").recv("a", 2).history)
    assert not q.valid
    assert (q.failed, q.fail_delivered) == (1, 1)
    assert q.samples["fail_delivered"] == ["a"]


def test_malformed_history_is_counted() -> None:
    ops = [
        Op(0, "producer-0", "invoke", "send", {"id": "a", "key": None}),
        Op(1, "producer-0", "invoke", "send", {"id": "a", "key": None}),
        Op(2, "producer-0", "ok", "send", {"id": "a"}),
        Op(3, "producer-0", "ok", "send", {"id": "a"}),
        Op(4, "producer-0", "ok", "send", {"id": "b"}),
        Op(5, "consumer-0", "info", "recv", {"id": "a"}),
    ]
    q = check_queue(ops)
    assert q.anomalies == {
        "completed_twice": 1,
        "completed_without_invoke": 1,
        "invoked_twice": 1,
        "recv_not_ok": 1,
    }
    assert q.lost == 2  # "b" was acked too, although never invoked


def test_empty_history_checks_to_empty_results() -> None:
    for ops in ([], H().fault("kill", 1, 2).history):
        report = check_all(ops, scenario="noop", seed=1)
        assert report.valid
        assert report.queue.attempts == 0
        assert report.order.keys == 0
        assert report.latency.send_outside_fault.count == 0
        assert report.outages == ()
        assert report.verdict().startswith("PASS noop seed=1: 0 acked, 0 lost")
        assert report.to_json()["valid"] is True


# ---- order --------------------------------------------------------------------------------------


def test_sequential_sends_delivered_in_order_are_valid() -> None:
    h = H().send("a", 0, 1, key="k").send("b", 2, 3, key="k").recv("a", 4, key="k")
    o = check_order(h.recv("b", 5, key="k").history)
    assert o.valid
    assert (o.keys, o.ordered_sends, o.constrained) == (1, 2, 1)


def test_swapped_sequential_sends_are_a_reorder() -> None:
    h = H().send("a", 0, 1, key="k").send("b", 2, 3, key="k")
    o = check_order(h.recv("b", 4, key="k").recv("a", 5, key="k").history)
    assert not o.valid
    assert o.reorder == 1
    assert o.samples["reorder"] == ["b before a"]


def test_concurrent_sends_on_a_key_are_free() -> None:
    # b was invoked before a's acknowledgement: no order is promised between them.
    h = H().send("a", 0, 2, key="k").send("b", 1, 3, key="k")
    o = check_order(h.recv("b", 4, key="k").recv("a", 5, key="k").history)
    assert o.valid
    assert o.constrained == 0


def test_sends_of_different_producers_are_free() -> None:
    h = H().send("a", 0, 1, key="k").send("b", 2, 3, key="k", process="producer-1")
    o = check_order(h.recv("b", 4, key="k").recv("a", 5, key="k").history)
    assert o.valid


def test_unkeyed_sends_are_free() -> None:
    h = H().send("a", 0, 1).send("b", 2, 3)
    o = check_order(h.recv("b", 4).recv("a", 5).history)
    assert o.valid
    assert o.ordered_sends == 0


def test_reorder_across_a_concurrent_send_is_found() -> None:
    # a < c is required (a acked at 10, c invoked at 11), though b overlaps both.
    h = H().send("a", 0, 10, key="k").send("b", 1, 12, key="k").send("c", 11, 20, key="k")
    o = check_order(h.recv("c", 21, key="k").recv("b", 22, key="k").recv("a", 23, key="k").history)
    assert o.reorder == 1
    assert o.samples["reorder"] == ["c before a"]


def test_undelivered_predecessor_is_a_gap() -> None:
    h = H().send("a", 0, 1, key="k").send("b", 2, 3, key="k").send("c", 4, 5, key="k")
    report = check_all(h.recv("a", 6, key="k").recv("c", 7, key="k").history)
    assert report.order.gap == 1
    assert report.order.samples["gap"] == ["b missing before c"]
    assert report.order.reorder == 0
    assert report.queue.lost == 1
    assert not report.valid


def test_undelivered_tail_is_lost_but_no_gap() -> None:
    h = H().send("a", 0, 1, key="k").send("b", 2, 3, key="k")
    o = check_order(h.recv("a", 4, key="k").history)
    assert o.gap == 0


def test_rewind_is_reported_and_stays_valid() -> None:
    h = H().send("a", 0, 1, key="k").send("b", 2, 3, key="k")
    h.recv("a", 4, key="k").recv("b", 5, key="k").recv("a", 6, key="k").recv("b", 7, key="k")
    report = check_all(h.history)
    assert report.order.rewind == 1  # a after b; b's copy then follows a, in order
    assert report.order.valid
    assert report.queue.duplicated == 2
    assert report.valid


def test_immediate_redelivery_is_no_rewind() -> None:
    h = H().send("a", 0, 1, key="k").send("b", 2, 3, key="k")
    o = check_order(h.recv("a", 4, key="k").recv("a", 5, key="k").recv("b", 6, key="k").history)
    assert o.rewind == 0


def test_same_time_deliveries_are_ordered_by_offset() -> None:
    h = H().send("a", 0, 1, key="k").send("b", 2, 3, key="k")
    h.recv("b", 4, key="k", offset=8).recv("a", 4, key="k", offset=7)
    assert check_order(h.ops).valid  # ops in the "wrong" list order, same time


def test_inconsistent_offsets_fail() -> None:
    h = H().send("a", 0, 1, queue="broker-a:1", offset=5).recv("a", 2, queue="broker-a:1", offset=5)
    h.send("b", 0, 1, queue="broker-a:1", offset=6).recv("b", 2, queue="broker-a:1", offset=5)
    report = check_all(h.history, ordered=False)
    assert report.order.inconsistent_offsets == 1
    assert report.order.samples["inconsistent_offsets"] == ["broker-a:1@5: a, b"]
    assert not report.order.valid
    assert not report.valid  # offsets count even for an unordered run


def test_one_message_at_two_offsets_is_reported_only() -> None:
    h = H().send("a", 0, 1, queue="broker-a:1", offset=5)
    h.recv("a", 2, queue="broker-a:1", offset=5).recv("a", 3, queue="broker-a:1", offset=6)
    o = check_order(h.history)
    assert o.multi_offset_ids == 1
    assert o.valid


def test_unordered_run_ignores_reorders() -> None:
    h = H().send("a", 0, 1, key="k").send("b", 2, 3, key="k")
    h.recv("b", 4, key="k").recv("a", 5, key="k")
    assert not check_all(h.history).valid
    report = check_all(h.history, ordered=False)
    assert report.valid
    assert "reorder" not in report.verdict()


# ---- availability -------------------------------------------------------------------------------


def _steady(h: H, start: float, stop: float, step: float = 0.5, tag: str = "s") -> H:
    t, n = start, 0
    while t < stop:
        h.send(f"{tag}{n}", t, t + 0.01)
        t += step
        n += 1
    return h


def test_rto_in_fault() -> None:
    h = _steady(H(), 0, 10).fault("leader-kill", 10, 20)
    h.send("x", 11, 13, outcome="info").send("y", 13.5, 14)
    _steady(h, 14.5, 30, tag="t")
    (w,) = check_availability(h.history).windows
    assert w.failed_sends == 1
    assert w.rto_s == 3.0  # 11 (x invoked) -> 14 (y acked)
    assert w.recovered_in_fault is True
    assert w.after_heal_s is None
    assert w.service_return_s == 4.0  # 10 (start) -> 14
    assert w.first_ack_s == 4.0  # y, invoked at 13.5, is the first fresh send acked
    assert w.longest_gap_s == pytest.approx(4.0)  # 10 -> 14
    assert w.max_ok_gap_s == pytest.approx(4.49)  # 9.51 (last ack before) -> 14
    assert w.served_after_heal is True
    report = check_all(h.history, scenario="leader-kill", seed=7)
    assert report.verdict().endswith("worst rto 3.00 s (in fault), longest gap in a fault 4.00 s")


def test_rto_after_heal() -> None:
    h = _steady(H(), 0, 10).fault("partition", 10, 20)
    h.send("x", 11, 13, outcome="info").send("y", 14, 16, outcome="fail")
    h.send("z", 17, 21)
    _steady(h, 21, 30, tag="t")
    (w,) = check_availability(h.history).windows
    assert w.failed_sends == 2
    assert w.rto_s == 10.0  # 11 -> 21
    assert w.recovered_in_fault is False
    assert w.after_heal_s == 1.0  # 20 -> 21
    assert w.service_return_s == 11.0
    assert "worst rto 10.00 s (after heal)" in check_all(h.history).verdict()


def test_window_without_failures_has_no_rto() -> None:
    h = _steady(H(), 0, 30).fault("leader-pause", 10, 12)
    (w,) = check_availability(h.history).windows
    assert (w.failed_sends, w.rto_s, w.recovered_in_fault, w.service_return_s) == (
        0,
        None,
        None,
        None,
    )
    assert w.first_ack_s == pytest.approx(0.01)
    assert w.longest_gap_s == pytest.approx(0.5)
    assert "no failed send in a fault" in check_all(h.history).verdict()


def test_service_that_never_returns_after_heal_fails_the_run() -> None:
    h = _steady(H(), 0, 10).fault("kill-all", 10, 12)
    h.send("x", 11, 13, outcome="info").send("y", 14, 16, outcome="info")
    (w,) = check_availability(h.history).windows
    assert w.rto_s is None
    assert w.recovered_in_fault is False
    assert w.served_after_heal is False
    report = check_all(h.history)
    assert not report.availability.valid
    assert not report.valid
    assert "worst rto never" in report.verdict()


def test_unhealed_window_lasts_to_the_end() -> None:
    h = _steady(H(), 0, 10).fault("kill", 5, None)
    h.send("x", 6, 7, outcome="info")
    _steady(h, 8, 10, tag="t")
    (w,) = check_availability(h.history).windows
    assert w.stop is None
    assert w.recovered_in_fault is True
    assert w.served_after_heal is None


def test_outages_merge_within_two_seconds() -> None:
    h = H().send("a", 0, 0.5)
    h.send("f1", 1, 2, outcome="info").send("ok1", 2.5, 3)  # outage 1 -> 3
    h.send("f2", 4, 4.5, outcome="fail").send("ok2", 5, 6)  # 4 <= 3 + 2: reopens 1 -> 6
    h.send("f3", 9, 9.5, outcome="fail").send("ok3", 9.6, 10)  # 9 > 6 + 2: new 9 -> 10
    h.send("f4", 13, 14, outcome="info")  # never closed
    spans = [(o.start, o.stop) for o in unavailability(h.history)]
    assert spans == [(1, 6), (9, 10), (13, None)]


def test_windows_default_to_the_nemesis_ops() -> None:
    h = _steady(H(), 0, 5).fault("a", 1, 2).fault("b", 3, 4)
    explicit = check_availability(h.history, fault_windows(h.history))
    assert check_availability(h.history) == explicit
    assert [w.fault for w in explicit.windows] == ["a", "b"]


# ---- latency ------------------------------------------------------------------------------------


def test_latency_inside_and_outside_faults_and_end_to_end_buckets() -> None:
    h = H().send("a", 0, 0.002).send("b", 5, 6).send("c", 5.5, 5.6).send("d", 9, 9.004)
    h.recv("a", 0.0005).recv("b", 6.05).recv("c", 10).recv("d", 9.01).recv("d", 9.02)
    lat = check_latency(h.history, [Window("pause", ("n1",), 4, 8)])
    assert lat.valid
    assert (lat.send_in_fault.count, lat.send_outside_fault.count) == (2, 2)
    assert lat.send_in_fault.max_s == 1.0
    assert lat.send_in_fault.p50_s == pytest.approx(0.1)
    assert lat.send_outside_fault.p99_s == pytest.approx(0.004)
    assert lat.end_to_end.count == 4  # first deliveries only
    assert lat.end_to_end_buckets == {
        "<=1ms": 1,  # a: 0.5 ms
        "<=5ms": 0,
        "<=10ms": 1,  # d: 10 ms
        "<=100ms": 0,
        "<=1000ms": 0,
        "<=3000ms": 1,  # b: 1.05 s
        ">3000ms": 1,  # c: 4.5 s
    }
    assert lat.to_json()["send_in_fault"]["max_ms"] == 1000.0


# ---- generated histories ------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    ops: list[Op]
    acked: list[str]  # acked ids
    sequential: list[tuple[str, str]]  # (a, b): a acked before b invoked, same producer and key


OUTCOMES: list[OpType] = ["ok", "ok", "ok", "fail", "info"]  # mostly acknowledged


@st.composite
def correct_runs(draw: st.DrawFn) -> Run:
    """Producers sending sequentially on a few keys, some sends failing or unknown; every acked
    message delivered (some twice in a row) in send order per key, keys interleaved."""
    producers = draw(st.integers(1, 3))
    ops: list[Op] = []
    per_key: dict[str, list[str]] = {}
    acked: list[str] = []
    sequential: list[tuple[str, str]] = []
    t = 0.0
    for p in range(producers):
        last_by_key: dict[str, str] = {}
        for n in range(draw(st.integers(0, 12))):
            key = draw(st.sampled_from([f"k{p}-0", f"k{p}-1", None]))
            outcome = draw(st.sampled_from(OUTCOMES))
            msg_id = f"p{p}-{n}"
            t += draw(st.floats(0.001, 1.0))
            ops.append(Op(t, f"producer-{p}", "invoke", "send", {"id": msg_id, "key": key}))
            t += draw(st.floats(0.001, 1.0))
            ops.append(Op(t, f"producer-{p}", outcome, "send", {"id": msg_id, "key": key}))
            if outcome != "ok":
                continue
            acked.append(msg_id)
            per_key.setdefault(key or msg_id, []).append(msg_id)
            if key is not None:
                if key in last_by_key:
                    sequential.append((last_by_key[key], msg_id))
                last_by_key[key] = msg_id
    streams = [list(ids) for ids in per_key.values()]
    while streams:
        stream = streams[draw(st.integers(0, len(streams) - 1))]
        msg_id = stream.pop(0)
        for _ in range(draw(st.integers(1, 2))):
            t += draw(st.floats(0.0, 0.5))
            key = next((op.value["key"] for op in ops if op.value["id"] == msg_id), None)
            ops.append(Op(t, "consumer-0", "ok", "recv", {"id": msg_id, "key": key}))
        streams = [s for s in streams if s]
    return Run(ops, acked, sequential)


@settings(max_examples=60, deadline=None)
@given(correct_runs())
def test_correct_history_is_valid(run: Run) -> None:
    report = check_all(run.ops)
    assert report.valid, report.to_json()
    assert report.order.rewind == 0
    assert report.queue.acked == len(run.acked)


@settings(max_examples=60, deadline=None)
@given(correct_runs(), st.data())
def test_swapping_sequential_deliveries_is_a_reorder(run: Run, data: st.DataObject) -> None:
    if not run.sequential:
        return
    a, b = data.draw(st.sampled_from(run.sequential))
    # Swap the first deliveries of a and b, keeping their times.
    ia = next(i for i, op in enumerate(run.ops) if op.f == "recv" and op.value["id"] == a)
    ib = next(i for i, op in enumerate(run.ops) if op.f == "recv" and op.value["id"] == b)
    ops = list(run.ops)
    ops[ia] = Op(run.ops[ia].time, "consumer-0", "ok", "recv", dict(run.ops[ib].value))
    ops[ib] = Op(run.ops[ib].time, "consumer-0", "ok", "recv", dict(run.ops[ia].value))
    order = check_order(ops)
    assert order.reorder > 0
    assert not order.valid


@settings(max_examples=60, deadline=None)
@given(correct_runs(), st.data())
def test_dropping_an_acked_delivery_is_a_loss(run: Run, data: st.DataObject) -> None:
    if not run.acked:
        return
    gone = data.draw(st.sampled_from(run.acked))
    ops = [op for op in run.ops if not (op.f == "recv" and op.value["id"] == gone)]
    queue = check_queue(ops)
    assert queue.lost == 1
    assert queue.samples["lost"] == [gone]
    assert not queue.valid


def test_leadership_kept_or_what_changed() -> None:
    assert check_leadership(("n0", 3), ("n0", 3)) is None
    assert check_leadership(("n0", 3), ("n1", 5)) == "leader changed: n0 (term 3) -> n1 (term 5)"
    assert "an election was forced" in (check_leadership(("n0", 3), ("n0", 6)) or "")


def test_rejoined_only_when_every_node_follows_the_leader_and_caught_up() -> None:
    n0 = NodeView("n0", True, "FOLLOWER", 2, "n1", 90)
    rest = [
        NodeView("n1", True, "LEADER", 2, "n1", 91),
        NodeView("n2", True, "FOLLOWER", 2, "n1", 90),
    ]
    assert check_rejoined([n0, *rest], 90) is None
    # What chaos found on native: the restarted old leader stayed at its term, with no leader.
    stuck = replace(n0, term=1, leader="", commit_index=2)
    assert "n0 FOLLOWER term 1 leader none" in (check_rejoined([stuck, *rest], 90) or "")
    behind = replace(n0, commit_index=40)
    assert check_rejoined([behind, *rest], 90) == "behind the leader's commit index 90: n0 at 40"
    two = replace(n0, role="LEADER", term=1, leader="n0")
    assert "2 nodes say they lead" in (check_rejoined([two, *rest], 90) or "")
    mute = NodeView("n0", False, "-", 0, "", 0)
    assert check_rejoined([mute, *rest], 90) == "no status from n0"
