"""Child processes of raftmq's tooling: the environment a role process starts with, the one
supervision loop (signal, wait, escalate to SIGKILL), children that die with their parent
(PR_SET_PDEATHSIG), and processes known only by pid and start time (`raftmq cluster down`).

Linux only for the /proc and prctl parts. A recorded pid is never signalled unless its start
time still matches, so a pid the kernel has reused belongs to someone else and is left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import raftmq

# The directory that holds the `raftmq` package: the checkout (raftmq/ links its role folders)
# or site-packages. A child gets it first on PYTHONPATH.
CODE_ROOT = Path(raftmq.__file__).resolve().parents[1]

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
STOP_GRACE_S = 20.0
KILL_WAIT_S = 10.0
POLL_INTERVAL_S = 0.05


# The admin's keys for [security.auth] (common/auth.py), kept off the children's command lines,
# and the switch to the pure-Python twins (common/stored_batch.py, raftlog/compiled.py), which a
# whole process tree takes or none of it: not a setting of any one role; so does the timeline's
# stamp directory (common/timeline.py), which a benchmark sets for every process it starts.
PASSED_ENV = frozenset(
    {
        "RAFTMQ_ADMIN_ACCESS_KEY",
        "RAFTMQ_ADMIN_SECRET_KEY",
        "RAFTMQ_NO_EXTENSIONS",
        "RAFTMQ_TIMELINE",
    }
)


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment without RAFTMQ_* settings (a child takes its settings from its
    flags, and its secrets from the variables its ProcessSpec names), except PASSED_ENV (the
    admin's keys, what the README's secure recipe exports, RAFTMQ_NO_EXTENSIONS and
    RAFTMQ_TIMELINE), with CODE_ROOT first on PYTHONPATH and unbuffered output for its log."""
    env = {
        k: v
        for k, v in (base if base is not None else os.environ).items()
        if not k.startswith("RAFTMQ_") or k in PASSED_ENV
    }
    env["PYTHONPATH"] = str(CODE_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ---- the one supervision loop ----------------------------------------------------------------


class Child(Protocol):
    """What the supervision loop needs of a process: subprocess.Popen has it, and so has
    RecordedProcess for a process this one did not start."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


def stop(
    children: Sequence[Child],
    *,
    sig: int = signal.SIGTERM,
    grace_s: float = STOP_GRACE_S,
    kill_wait_s: float = KILL_WAIT_S,
) -> list[Child]:
    """Send `sig` to every live child (in order), wait up to grace_s for all of them together,
    SIGKILL the stragglers and wait up to kill_wait_s more. Returns the children that needed
    SIGKILL (the caller may say so); one still alive after that is returned too."""
    for c in children:
        if c.poll() is None:
            c.send_signal(sig)
    left = _wait_all(children, grace_s)
    if sig == signal.SIGKILL or not left:
        return left
    for c in left:
        c.send_signal(signal.SIGKILL)
    _wait_all(left, kill_wait_s)
    return left


def signal_child(child: Child, sig: int, grace_s: float = STOP_GRACE_S) -> None:
    """`sig` to one child; for SIGTERM and SIGKILL also wait for it (escalating), for any other
    signal (SIGSTOP, SIGCONT) only send it."""
    if sig in (signal.SIGTERM, signal.SIGKILL):
        stop([child], sig=sig, grace_s=grace_s)
    elif child.poll() is None:
        child.send_signal(sig)


def _wait_all(children: Sequence[Child], timeout_s: float) -> list[Child]:
    """Poll until every child has exited or the time is up; the ones still running."""
    deadline = time.monotonic() + timeout_s
    left = [c for c in children if c.poll() is None]
    while left and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
        left = [c for c in left if c.poll() is None]
    return left


# ---- children that end with their parent -----------------------------------------------------


def die_with_parent(
    parent_pid: int,
    *,
    prctl: Callable[[int, int], int] | None = None,
    getppid: Callable[[], int] = os.getppid,
    kill_self: Callable[[], None] | None = None,
) -> Callable[[], None]:
    """A Popen preexec_fn: the child gets SIGTERM when its parent ends, SIGKILL included.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, so fork from the main
    thread (ClusterRunner does). If the parent died between fork and prctl, the child has been
    reparented already and no signal will ever come: the getppid check ends it right away.
    The libc lookup happens here, in the parent, not between fork and exec."""
    if prctl is None:
        libc = ctypes.CDLL(None, use_errno=True)

        def prctl(option: int, value: int) -> int:
            return int(libc.prctl(option, value, 0, 0, 0))

    set_pdeathsig = prctl

    def end_self() -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    end = kill_self if kill_self is not None else end_self

    def preexec() -> None:
        if set_pdeathsig(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
            return  # not Linux or refused: the child simply outlives a killed parent
        if getppid() != parent_pid:
            end()

    return preexec


def can_tie_to_parent() -> bool:
    """Only children forked by the main thread may carry PDEATHSIG: a worker thread's exit
    would end them with it."""
    return threading.current_thread() is threading.main_thread()


# ---- processes known by pid and start time ---------------------------------------------------


def parse_start_ticks(stat_text: str) -> int:
    """Field 22 of /proc/<pid>/stat: the start time in clock ticks after boot. The command name
    (field 2) may hold spaces and parentheses, so fields are counted after its last ')'."""
    rest = stat_text[stat_text.rindex(")") + 2 :].split()
    return int(rest[22 - 3])


def parse_state(stat_text: str) -> str:
    """Field 3 of /proc/<pid>/stat: R, S, D, Z (zombie), T, ..."""
    return stat_text[stat_text.rindex(")") + 2 :].split(maxsplit=1)[0]


def _stat(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None


def start_ticks(pid: int) -> int | None:
    """The start time of a live process, or None if there is none with that pid."""
    text = _stat(pid)
    return parse_start_ticks(text) if text is not None else None


def is_running(pid: int, ticks: int) -> bool:
    """True while the process `pid` that started at `ticks` runs (not a zombie, not reused)."""
    text = _stat(pid)
    return text is not None and parse_start_ticks(text) == ticks and parse_state(text) != "Z"


class RecordedProcess:
    """A process this one did not start, known by pid and start time. A pidfd is taken while
    the start time still matches, so no later signal can reach a reused pid."""

    def __init__(self, pid: int, ticks: int) -> None:
        self._pid = pid
        self.ticks = ticks
        self._fd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            self._fd = os.pidfd_open(pid)
        if self._fd is not None and start_ticks(pid) != ticks:
            self.close()  # the pid is someone else's now; never signal it

    @property
    def pid(self) -> int:
        return self._pid

    def poll(self) -> int | None:
        """None while running; 0 once it has ended (its exit code is its parent's to read)."""
        if self._fd is not None:
            ready, _, _ = select.select([self._fd], [], [], 0)
            if ready:
                return 0
        return None if is_running(self._pid, self.ticks) else 0

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self._fd is not None:
                signal.pidfd_send_signal(self._fd, sig)
            elif is_running(self._pid, self.ticks):
                os.kill(self._pid, sig)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RecordedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
