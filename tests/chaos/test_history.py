"""The history model: ops checked when recorded and when loaded, the recorder's clock, copy and
bound, JSON lines round trips, malformed lines named by number, stable merges and fault
windows."""

from __future__ import annotations

import itertools
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.chaos.history import Op, Recorder, Window, fault_windows, load_jsonl, merge, write_jsonl


def ticking(start: float = 100.0, step: float = 0.25) -> Recorder:
    times = itertools.count()
    return Recorder(clock=lambda: start + step * next(times))


def test_recorder_times_ops_with_its_clock_and_copies_values() -> None:
    rec = ticking()
    value: dict[str, Any] = {"id": "p0-0", "key": "k"}
    rec.invoke("producer-0", "send", value)
    value["key"] = "changed later"
    rec.ok("producer-0", "send", {"id": "p0-0", "key": "k", "queue": "broker-a:3", "offset": 7})
    rec.fail("producer-0", "send", {"id": "p0-1", "key": None})
    rec.info("producer-0", "send", {"id": "p0-2", "key": None})
    rec.nemesis("leader-kill", ["broker-a-0"], "start")
    ops = rec.ops
    assert [op.time for op in ops] == [100.0, 100.25, 100.5, 100.75, 101.0]
    assert [op.type for op in ops] == ["invoke", "ok", "fail", "info", "info"]
    assert ops[0].value["key"] == "k"
    assert ops[4] == Op(
        101.0,
        "nemesis",
        "info",
        "nemesis",
        {"fault": "leader-kill", "targets": ["broker-a-0"], "phase": "start"},
    )
    ops.clear()
    assert len(rec) == 5  # `ops` is a copy


def test_recorder_under_threads_keeps_every_op_in_time_order() -> None:
    rec = Recorder()

    def produce(n: int) -> None:
        for i in range(300):
            rec.record(f"producer-{n}", "invoke", "send", {"id": f"p{n}-{i}", "key": None})

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    times = [op.time for op in rec.ops]
    assert len(times) == 1200
    assert times == sorted(times)


def test_recorder_is_bounded() -> None:
    rec = Recorder(max_ops=2)
    rec.invoke("p", "send", {"id": "a"})
    rec.ok("p", "send", {"id": "a"})
    with pytest.raises(RuntimeError, match="history full"):
        rec.invoke("p", "send", {"id": "b"})
    with pytest.raises(ValueError, match="max_ops"):
        Recorder(max_ops=0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((float("nan"), "p", "ok", "send", {"id": "a"}), "finite"),
        ((True, "p", "ok", "send", {"id": "a"}), "number"),
        ((1.0, "", "ok", "send", {"id": "a"}), "process"),
        ((1.0, "p", "done", "send", {"id": "a"}), "type must be one of"),
        ((1.0, "p", "ok", "poll", {"id": "a"}), "f must be one of"),
        ((1.0, "p", "ok", "send", ["a"]), "value must be an object"),
        ((1.0, "p", "ok", "send", {"id": 7}), "id must be a string"),
        ((1.0, "nemesis", "info", "nemesis", {"fault": "kill", "phase": "begin"}), "phase"),
        (
            (
                1.0,
                "nemesis",
                "info",
                "nemesis",
                {"fault": "kill", "phase": "start", "targets": "n1"},
            ),
            "targets",
        ),
    ],
)
def test_bad_ops_are_refused_when_made(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Op(*args)


def test_round_trip(tmp_path: Path) -> None:
    rec = ticking()
    rec.invoke("producer-0", "send", {"id": "p0-0", "key": "k"})
    rec.ok("producer-0", "send", {"id": "p0-0", "key": "k", "queue": "broker-a:1", "offset": 0})
    rec.nemesis("leader-pause", ["broker-a-1"], "start")
    rec.ok("consumer-0", "recv", {"id": "p0-0", "key": "k", "queue": "broker-a:1", "offset": 0})
    rec.info("producer-1", "send", {"id": "p1-0", "key": None, "error": "TIMEOUT"})
    rec.nemesis("leader-pause", ["broker-a-1"], "stop")
    path = tmp_path / "runs" / "history.jsonl"
    rec.write_jsonl(path)
    assert load_jsonl(path) == rec.ops
    assert len(path.read_text().splitlines()) == 6
    assert not list(path.parent.glob("*.tmp"))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(-1e9, 1e9, allow_nan=False),
            st.sampled_from(["invoke", "ok", "fail", "info"]),
            st.sampled_from(["send", "recv"]),
            st.text(min_size=1, max_size=8),
            st.one_of(st.none(), st.text(max_size=5)),
        ),
        max_size=20,
    )
)
def test_any_history_round_trips(rows: list[tuple[float, Any, Any, str, str | None]]) -> None:
    ops = [Op(t, "p", type_, f, {"id": i, "key": k}) for t, type_, f, i, k in rows]
    # A fresh directory per example: Hypothesis reruns the body, a pytest fixture would not.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "h.jsonl"
        write_jsonl(path, ops)
        assert load_jsonl(path) == ops


GOOD = '{"time": 1.5, "process": "p", "type": "ok", "f": "send", "value": {"id": "a"}}'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"time": 1.5, "process": "p"', "not JSON"),
        ('"just a string"', "must be a JSON object"),
        ('{"process": "p", "type": "ok", "f": "send"}', "op without 'time'"),
        ('{"time": "soon", "process": "p", "type": "ok", "f": "send"}', "time must be a number"),
        ('{"time": 2, "process": "p", "type": "ok", "f": "send", "when": 1}', "unknown fields"),
        ('{"time": 2, "process": "p", "type": "ok", "f": "recv", "value": 3}', "value must be"),
        ('{"time": 2, "process": "p", "type": "OK", "f": "send"}', "type must be one of"),
    ],
)
def test_malformed_line_is_refused_with_its_number(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(f"{GOOD}\n\n{GOOD}\n{line}\n{GOOD}\n")
    with pytest.raises(ValueError, match=rf"h\.jsonl:4: .*{message}"):
        load_jsonl(path)


def test_blank_lines_and_integer_times_load(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text('\n{"time": 3, "process": "p", "type": "invoke", "f": "send"}\n\n')
    [op] = load_jsonl(path)
    assert op.time == 3.0 and isinstance(op.time, float)
    assert op.value == {}


def test_merge_is_by_time_and_stable() -> None:
    a = [Op(1.0, "a", "invoke", "send", {"id": "1"}), Op(3.0, "a", "ok", "send", {"id": "1"})]
    b = [Op(1.0, "b", "ok", "recv", {"id": "x"}), Op(2.0, "b", "ok", "recv", {"id": "y"})]
    merged = merge(a, b)
    assert [(op.time, op.process) for op in merged] == [
        (1.0, "a"),  # equal times: the first history first
        (1.0, "b"),
        (2.0, "b"),
        (3.0, "a"),
    ]
    assert merge() == []


def nemesis(t: float, fault: str, phase: str, targets: list[str] | None = None) -> Op:
    value = {"fault": fault, "targets": targets or ["n1"], "phase": phase}
    return Op(t, "nemesis", "info", "nemesis", value)


def test_fault_windows_pair_starts_and_stops_per_fault() -> None:
    ops = [
        nemesis(5, "pause", "start", ["n2"]),
        Op(5.5, "producer-0", "invoke", "send", {"id": "a"}),
        nemesis(1, "kill", "start", ["n1"]),
        nemesis(2, "kill", "start", ["n3"]),  # two of one fault at once: stops close in order
        nemesis(3, "kill", "stop", ["leader"]),  # the stop's targets do not matter
        nemesis(4, "kill", "stop"),
    ]
    assert fault_windows(ops) == [
        Window("kill", ("n1",), 1, 3),
        Window("kill", ("n3",), 2, 4),
        Window("pause", ("n2",), 5, None),
    ]
    assert Window("pause", ("n2",), 5, None).end(9.0) == 9.0
    assert Window("kill", ("n1",), 1, 3).to_json() == {
        "fault": "kill",
        "targets": ["n1"],
        "start": 1,
        "stop": 3,
    }
    assert fault_windows([]) == []


def test_a_stop_without_a_start_is_a_harness_bug() -> None:
    with pytest.raises(ValueError, match=r"stop of 'kill' at 2\.0 without a start"):
        fault_windows([nemesis(1, "pause", "start"), nemesis(2, "kill", "stop")])
