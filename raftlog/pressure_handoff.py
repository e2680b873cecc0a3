"""A leader past its disk threshold hands leadership off before its disk fills: the flag the
broker's disk guard sets, when the next try is due, and the one thread a try runs in. NativeLog
uses it; it decides nothing about Raft itself (the log's transfer does the work)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

PRESSURE_HANDOFF_S = 1.0  # a leader past its disk threshold pauses writes this long at most
PRESSURE_RETRY_S = 1.0  # ...and tries again this often while it stays past it and leads


class PressureHandoff:
    """At most one hand-off at a time, tried again every PRESSURE_RETRY_S while the node stays
    pressed and leads: a leader elected while pressed, or one whose followers could not take
    over yet, hands off too. `transfer(timeout_s)` runs in a thread of its own (it waits on the
    Raft loop, which calls `tick`)."""

    def __init__(self, node_id: str, transfer: Callable[[float], object]) -> None:
        self.node_id = node_id
        self.on = False  # set by the broker's disk guard, from any thread
        self._transfer = transfer
        self._running: threading.Thread | None = None
        self._next_try_s = 0.0

    def tick(self, now: float, can_start: Callable[[], bool]) -> None:
        """`can_start`: this node leads and a follower could take over (asked last: it is the
        costly question, and only while pressed)."""
        running = self._running
        if (
            not self.on
            or (running is not None and running.is_alive())
            or now < self._next_try_s
            or not can_start()
        ):
            return
        self._next_try_s = now + PRESSURE_RETRY_S
        log.warning("raft.handing_off_leadership node=%s reason=disk_pressure", self.node_id)
        self._running = threading.Thread(
            target=self._transfer,
            args=(PRESSURE_HANDOFF_S,),
            name="raft-pressure-handoff",
            daemon=True,
        )
        self._running.start()
