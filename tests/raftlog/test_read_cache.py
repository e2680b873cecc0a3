"""ReplicatedLog.read (the pull path's one-entry read) goes through the journal's record cache:
a consumer's pulls come back to the same entry (a batch of 1024 messages is 32 pulls of 32), so
an entry that left the recent cache is read from disk and checked once, not once per pull
(issue 14 bar 3: a 10^7 backlog's tail pulls were ~0.1 ms slower than the head's). One real
single-node log (pysyncobj, the segment journal) in this process."""

from __future__ import annotations

import time
from pathlib import Path

from raftmq.raftlog.config import RaftLogConfig
from raftmq.raftlog.log import ReplicatedLog
from tests.harness.local_cluster import free_ports


def test_an_old_entry_is_read_from_disk_once_then_from_the_cache(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    cfg = RaftLogConfig(
        node_id=f"127.0.0.1:{port}", peers=(), data_dir=tmp_path, cache_bytes=1 << 20
    )
    rlog = ReplicatedLog(cfg)
    try:
        deadline = time.monotonic() + 30
        while not rlog.is_leader_ready():
            assert time.monotonic() < deadline, "a one-node log did not lead"
            time.sleep(0.02)
        payloads = [bytes([i]) * (100 << 10) for i in range(30)]  # 3 MB: past the 1 MiB cache
        # One at a time: each its own entry (group commit would pack them together).
        first = rlog.submit(payloads[0]).result(30).index
        for p in payloads[1:]:
            rlog.submit(p).result(30)
        journal = rlog._journal
        cache = journal._cache  # the cache's contents are what this test is about
        assert first < cache.recent_first, "the first entry should have left the recent cache"
        assert first not in cache.lru
        entry = rlog.read(first)
        assert list(entry.chunks) == [payloads[0]]
        assert first in cache.lru, "a read of an old entry should be remembered for the next pull"
        assert list(rlog.read(first).chunks) == [payloads[0]]
        # Streams (the dispatcher, followers catching up) still leave the cache alone.
        rlog.read_from(first + 1, max_bytes=1, max_entries=1)
        assert first + 1 not in cache.lru
    finally:
        rlog.close()
