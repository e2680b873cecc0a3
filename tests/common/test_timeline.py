"""The timeline's ring (common/timeline.py): bounded, newest kept, off unless its variable is set,
and dumped by a real process at its exit (what bench/w2_timeline.py reads)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from raftmq.common.timeline import ENV, Timeline
from tests.harness.procs import python_prints


def test_the_ring_keeps_the_newest_stamps_in_time_order(tmp_path: Path) -> None:
    tl = Timeline(tmp_path, capacity=4)
    for k in range(10):
        tl.stamp("p", k)
    kept = tl.stamps()
    assert [v for _, _, v in kept] == [6, 7, 8, 9]
    assert [ns for ns, _, _ in kept] == sorted(ns for ns, _, _ in kept)


def test_a_process_dumps_its_stamps_at_exit_only_when_the_variable_is_set(tmp_path: Path) -> None:
    code = (
        "import os; from raftmq.common import timeline, transport; "
        "print(os.getpid(), transport._STAMP is None); "
        "timeline.PROCESS and timeline.PROCESS.stamp('here', 7)"
    )
    env = {k: v for k, v in os.environ.items() if k != ENV}
    pid, off = python_prints(code, env).split()
    assert off == "True"
    assert not (tmp_path / f"{pid}.json").exists()

    pid, off = python_prints(code, {**env, ENV: str(tmp_path)}).split()
    assert off == "False"
    dumped = json.loads((tmp_path / f"{pid}.json").read_text())
    assert dumped["pid"] == int(pid)
    assert [s[1:] for s in dumped["stamps"]] == [["here", 7]]
