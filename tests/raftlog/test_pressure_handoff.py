"""The disk-pressure hand-off both CommitLogs share: one try at a time, again every
PRESSURE_RETRY_S while the node stays pressed and leads, never while it is not pressed."""

from __future__ import annotations

import threading

from raftmq.raftlog.pressure_handoff import PRESSURE_HANDOFF_S, PRESSURE_RETRY_S, PressureHandoff


def test_one_try_at_a_time_then_again_after_the_retry_interval() -> None:
    calls: list[float] = []
    release = threading.Event()

    def transfer(timeout_s: float) -> None:
        calls.append(timeout_s)
        release.wait(5)

    p = PressureHandoff("n0", transfer)
    p.tick(0.0, lambda: True)
    assert calls == []  # not pressed: nothing
    p.on = True
    p.tick(0.0, lambda: False)
    assert calls == []  # pressed, but not leading or nobody can take over
    p.tick(0.0, lambda: True)
    p.tick(PRESSURE_RETRY_S + 1, lambda: True)  # the first try still runs: not a second one
    release.set()
    assert p._running is not None
    p._running.join(5)
    assert calls == [PRESSURE_HANDOFF_S]
    release.clear()
    p.tick(PRESSURE_RETRY_S / 2, lambda: True)  # done, but the retry interval has not passed
    assert calls == [PRESSURE_HANDOFF_S]
    release.set()
    p.tick(PRESSURE_RETRY_S, lambda: True)
    p._running.join(5)
    assert calls == [PRESSURE_HANDOFF_S, PRESSURE_HANDOFF_S]
