"""History files round-trip and refuse malformed lines with their line number; reports write a
JSON result and a PNG picture."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from chaos.checkers import check_all
from chaos.history import Recorder, fault_windows, load_jsonl, merge, write_jsonl
from chaos.report import per_second, plot, write_result


def sample(rec: Recorder) -> None:
    rec.record("p0", "invoke", "send", {"id": "a", "key": "k"})
    rec.record("p0", "ok", "send", {"id": "a", "key": "k", "queue": "g:0", "offset": 0})
    rec.record("nemesis", "info", "nemesis", {"fault": "f", "targets": ["n0"], "phase": "start"})
    rec.record("consumer-0", "ok", "recv", {"id": "a", "key": "k", "queue": "g:0", "offset": 0})
    rec.record("nemesis", "info", "nemesis", {"fault": "f", "targets": ["n0"], "phase": "stop"})


def test_round_trip_and_merge(tmp_path: Path) -> None:
    clock = iter(float(i) for i in range(100))
    rec = Recorder(clock=lambda: next(clock))
    sample(rec)
    path = tmp_path / "h.jsonl"
    rec.write_jsonl(path)
    ops = load_jsonl(path)
    assert ops == rec.ops
    other = [op for op in ops if op.f == "nemesis"]
    merged = merge([op for op in ops if op.f != "nemesis"], other)
    assert merged == ops  # time order restored
    [w] = fault_windows(ops)
    assert (w.start, w.stop, w.targets) == (2.0, 4.0, ("n0",))


def test_recorder_is_thread_safe_and_time_ordered() -> None:
    rec = Recorder()

    def work(n: int) -> None:
        for i in range(500):
            rec.record(f"p{n}", "invoke", "send", {"id": f"{n}-{i}"})

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    times = [op.time for op in rec.ops]
    assert len(times) == 2000 and times == sorted(times)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ('{"time": 1, "process": "p", "type": "done", "f": "send"}', "type must be one of"),
        ('{"process": "p", "type": "ok", "f": "send"}', "op without 'time'"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_malformed_line_names_its_number(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "h.jsonl"
    good = '{"time": 1, "process": "p", "type": "ok", "f": "send", "value": {}}'
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(ValueError, match=f"h.jsonl:2: .*{message}"):
        load_jsonl(path)


def test_write_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    write_jsonl(path, [])
    assert path.read_text() == "" and not list(tmp_path.glob("*.tmp"))


def test_result_and_picture(tmp_path: Path) -> None:
    rec = Recorder()
    sample(rec)
    ops = rec.ops
    windows = fault_windows(ops)
    report = check_all(ops, windows, scenario="s", seed=3)
    write_result(tmp_path / "r.json", {"faults": []}, report, {"passed": True})
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["valid"] and doc["seed"] == 3 and doc["passed"] and doc["queue"]["acked"] == 1
    plot(ops, windows, tmp_path / "p.png", "s")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="empty history"):
        plot([], [], tmp_path / "q.png", "s")


def test_per_second_bins() -> None:
    xs, ys = per_second([0.1, 0.2, 0.7], 0.0, 1.0)
    assert xs == [0.0, 0.5, 1.0] and ys == [4.0, 2.0, 0.0]
