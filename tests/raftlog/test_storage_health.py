"""StorageHealth: one line per episode, a bounded back-off per writer, recovery after a settle."""

from __future__ import annotations

import errno
import logging

import pytest

from raftmq.raftlog.storage_health import BACKOFF_MAX_S, CorruptRecord, StorageHealth

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


def test_a_corrupt_record_stays_reported_until_repaired(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="raftlog.storage")
    h = StorageHealth("n0", settle_s=3.0)
    rec = CorruptRecord("journal", "/d/1.seg", 4096, 33, "crc mismatch")
    h.corrupt(rec, 1.0)
    h.corrupt(rec, 2.0)  # every read of it reports it again: one line
    err = h.error
    assert err is not None and err.corrupt and not err.disk_full
    assert "corrupt data" in err.describe() and "offset 4096 (index 33)" in err.describe()
    h.settle(100.0)  # writes succeeding says nothing about a bad record
    assert h.error is not None and h.corrupt_records == [rec]
    h.failed("journal", "/d", ENOSPC, 101.0)  # a write episode meanwhile is reported first
    assert h.error is not None and h.error.disk_full
    h.succeeded("journal", 102.0)
    h.settle(200.0)
    assert h.error is not None and h.error.corrupt  # the episode closed; the record is still bad
    h.repaired("/d/1.seg", 4096)
    assert h.error is None and h.corrupt_records == []
    h.corrupt(rec, 300.0)
    h.forget_below("journal", 34)  # retention deleted it
    assert h.error is None
    lines = [r.getMessage() for r in caplog.records]
    assert sum("storage.corrupt_record" in m for m in lines) == 2
    assert sum("storage.record_repaired" in m for m in lines) == 1
