"""Keep big freed buffers in the process instead of giving them back to the kernel (glibc).

glibc's malloc serves a big request (past a threshold it adapts, 128 KiB at first) from fresh
mmap'd pages and trims the heap's free top back to the kernel once it passes twice that
threshold. Every such buffer's pages then fault again on first touch. On the VMs this project
runs on, a page fault costs several microseconds: measured, a 1 MiB pull answer serialized by
protobuf took 1.1 ms with the defaults against 0.2 ms with freed memory kept, and the brokers'
CPU per pulled 1 KiB message fell by a third (docs/design.md, "Spark at the speed of the log,
the pull path"). The data path allocates and frees such buffers per request (pull answers,
stored batches, Arrow columns), so the processes that run it (every role process, and Spark's
Python workers running the raftmq source and sink) call `keep_freed_memory` once.

What a process keeps is bounded: at most TRIM_THRESHOLD free at the top of each malloc arena
(glibc makes at most 8 per core), and buffers past MMAP_THRESHOLD still come from mmap and go
back at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MIB = 1 << 20
MMAP_THRESHOLD = 32 * MIB  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit); past a pull answer
TRIM_THRESHOLD = 64 * MIB

_done: list[bool] = []  # the outcome of the first call: a process sets its policy once


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (which also ends their adaptation) in this
    process; True when set. False, and nothing changed, without glibc (macOS, musl)."""
    if _done:
        return _done[0]
    ok = False
    if sys.platform.startswith("linux"):
        try:
            mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
            )
        except (OSError, AttributeError):  # no libc by that name, or one without mallopt
            ok = False
    _done.append(ok)
    return ok
