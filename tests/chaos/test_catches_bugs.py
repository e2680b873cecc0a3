"""The chaos checker catches a real bug in a real cluster: a debug build whose brokers
acknowledge a send before a majority has it loses acknowledged messages when its leader is
split from its followers, and the lost-message check must say so (the same run with the real
build passes: `make chaos` runs minority-partition)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftmq.chaos.netns import require_root_tools
from raftmq.chaos.runner import RunOptions, run

WHY = require_root_tools()


@pytest.mark.skipif(WHY is not None, reason=WHY or "")
@pytest.mark.timeout(240)
def test_ack_before_commit_is_reported_lost(tmp_path: Path) -> None:
    r = run(
        RunOptions(
            scenario="minority-partition",
            seed=3,
            duration_s=20.0,
            out_dir=tmp_path,
            ack_before_commit=True,
        )
    )
    q = r.report.queue
    assert q.lost > 0, r.verdict
    assert not r.passed and r.verdict.startswith("FAIL")
    assert r.result_path.exists() and r.png_path.exists()
