"""keep_freed_memory: a process that frees big buffers and allocates them again touches no
fresh pages once its policy is set (page faults counted by the kernel, in a child process so
that the policy of the test process is left alone)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Three 3 MiB buffers made and freed, again and again: with glibc's defaults the freed top of
# the heap passes the (adapted) trim threshold and goes back to the kernel every round.
CHILD = """
import resource, sys
from raftmq.common.malloc_policy import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True  # once per process; a second call changes nothing
def rounds(n):
    for _ in range(n):
        a, b, c = b"a" * (3 << 20), b"b" * (3 << 20), b"c" * (3 << 20)
        del a, b, c
rounds(2)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds(20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

PAGES_PER_ROUND = 3 * (3 << 20) // 4096


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True, timeout=60
    )
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_buffers_are_reused_without_fresh_pages() -> None:
    kept = _faults("keep")
    assert kept < PAGES_PER_ROUND, kept  # not even one round's buffers faulted again
    # The rule's reason: the defaults fault about every page of every round.
    assert _faults("default") > 10 * PAGES_PER_ROUND
