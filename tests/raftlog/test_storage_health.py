"""StorageHealth: one line per episode, a bounded back-off per writer, recovery after a settle."""

from __future__ import annotations

import errno
import logging

import pytest

from raftmq.raftlog.storage_health import BACKOFF_MAX_S, StorageHealth

ENOSPC = OSError(errno.ENOSPC, "No space left on device")


def test_one_line_per_episode_and_bounded_backoff(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="raftlog.storage")
    h = StorageHealth("n0", settle_s=3.0)
    backoffs = [h.failed("journal", "/d", ENOSPC, float(t)) for t in range(20)]
    assert backoffs == sorted(backoffs) and max(backoffs) == BACKOFF_MAX_S
    h.failed("index store", "/d/store", ENOSPC, 20.0)
    err = h.error
    assert err is not None and err.disk_full and err.where == "journal"
    assert not h.may_try("journal", 20.0) and h.may_try("journal", 30.0)
    h.succeeded("journal", 21.0)
    h.succeeded("index store", 22.0)
    assert h.error is not None  # no failure for 3 s yet
    h.settle(23.5)
    assert h.error is None
    h.failed("journal", "/d", ENOSPC, 30.0)
    lines = [r.getMessage() for r in caplog.records]
    assert sum("storage.disk_full" in m for m in lines) == 2  # two episodes
    assert sum("storage.recovered" in m for m in lines) == 1
    assert h.episodes == 2
