"""The report files: the result JSON (both call shapes, refusals) and the PNG (a real PNG for a
history with faults, healed or not; refusals for nothing to draw or mixed clocks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from raftmq.chaos.checkers import check_all
from raftmq.chaos.history import Op, OpType, fault_windows
from raftmq.chaos.report import BIN_S, per_second, plot, write_result

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SCHEDULE: dict[str, Any] = {"produce_s": 20, "faults": [{"kind": "kill", "start_s": 5}]}


def history(heal: bool = True) -> list[Op]:
    """Sends every 0.1 s for 20 s, failing during 6-7 s of a fault from 5 s to 9 s."""
    ops: list[Op] = []
    for n in range(200):
        t = n * 0.1
        msg = {"id": f"p0-{n}", "key": "k"}
        ops.append(Op(t, "producer-0", "invoke", "send", msg))
        outcome: OpType = "info" if 6 <= t < 7 else "ok"
        ops.append(Op(t + 0.02, "producer-0", outcome, "send", msg))
        if outcome == "ok":
            ops.append(Op(t + 0.05, "consumer-0", "ok", "recv", msg | {"queue": "broker-a:0"}))
    nemesis = {"fault": "leader-kill", "targets": ["broker-a-0"]}
    ops.append(Op(5.0, "nemesis", "info", "nemesis", nemesis | {"phase": "start"}))
    if heal:
        ops.append(Op(9.0, "nemesis", "info", "nemesis", nemesis | {"phase": "stop"}))
    return sorted(ops, key=lambda op: op.time)


def test_result_json_holds_scenario_seed_schedule_and_every_check(tmp_path: Path) -> None:
    ops = history()
    report = check_all(ops, scenario="leader-kill", seed=7)
    path = tmp_path / "out" / "result.json"
    doc = write_result(path, "leader-kill", 7, SCHEDULE, report, {"wall_s": 31.5})
    on_disk = json.loads(path.read_text())
    assert on_disk == doc
    assert (doc["scenario"], doc["seed"], doc["valid"]) == ("leader-kill", 7, True)
    assert doc["verdict"].startswith("PASS leader-kill seed=7: 190 acked, 0 lost")
    assert doc["schedule"] == SCHEDULE
    assert doc["queue"]["acked"] == 190 and doc["queue"]["recovered"] == 0
    assert doc["order"]["reorder"] == 0
    [window] = doc["availability"]["windows"]
    assert window["fault"] == "leader-kill" and window["recovered_in_fault"] is True
    assert window["rto_s"] == pytest.approx(1.02)  # 6.0 invoked -> 7.02 acked
    assert doc["latency"]["send_outside_fault"]["count"] > 0
    assert doc["wall_s"] == 31.5
    assert not list(path.parent.glob("*.tmp"))


def test_result_short_form_takes_scenario_and_seed_from_the_report(tmp_path: Path) -> None:
    report = check_all(history(), scenario="leader-kill", seed=7)
    doc = write_result(tmp_path / "r.json", SCHEDULE, report, {"passed": True})
    assert (doc["scenario"], doc["seed"], doc["passed"]) == ("leader-kill", 7, True)


def test_result_refuses_a_report_of_another_run(tmp_path: Path) -> None:
    report = check_all(history(), scenario="leader-kill", seed=7)
    with pytest.raises(ValueError, match="scenario 'leader-kill', not 'leader-pause'"):
        write_result(tmp_path / "r.json", "leader-pause", 7, SCHEDULE, report)
    with pytest.raises(ValueError, match="seed 7, not 8"):
        write_result(tmp_path / "r.json", "leader-kill", 8, SCHEDULE, report)
    with pytest.raises(ValueError, match="overwrite queue"):
        write_result(tmp_path / "r.json", "leader-kill", 7, SCHEDULE, report, {"queue": 1})
    with pytest.raises(TypeError):
        write_result(tmp_path / "r.json", "leader-kill", SCHEDULE)  # type: ignore[call-overload]
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("heal", [True, False])
def test_plot_writes_a_png(tmp_path: Path, heal: bool) -> None:
    ops = history(heal)
    path = tmp_path / "pics" / "acks.png"
    plot(ops, fault_windows(ops), path, "leader-kill seed=7")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert not list(path.parent.glob("*.tmp"))


def test_plot_refuses_nothing_to_draw_and_mixed_clocks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty history"):
        plot([], [], tmp_path / "p.png", "empty")
    mixed = [Op(1.0, "p", "invoke", "send", {"id": "a"}), Op(1.7e9, "p", "ok", "send", {"id": "a"})]
    with pytest.raises(ValueError, match="mixed"):
        plot(mixed, [], tmp_path / "p.png", "mixed")
    assert not (tmp_path / "p.png").exists()


def test_per_second_counts_half_second_bins() -> None:
    xs, ys = per_second([10.0, 10.1, 10.49, 10.5, 11.2, 9.0], 10.0, 11.2)
    assert xs == [0.0, BIN_S, 2 * BIN_S]
    assert ys == [6.0, 2.0, 2.0]  # 3, 1 and 1 events per half second; 9.0 is before t0
