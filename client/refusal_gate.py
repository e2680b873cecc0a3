"""The fetchers' PullGate of one consumer (push or pull) while its group's consuming is turned
off: client/group_refusal.py's pure state under a lock, each episode's start and end logged
once, and its start handed to the consumer's `tell` (the push consumer's on_consume_disabled,
the pull consumer's next poll). Every queue's fetcher steps call it, from several threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from raftmq.client.group_refusal import MAX_PROBE_S, GroupRefusal
from raftmq.common.errors import ConsumeDisabledError

log = logging.getLogger("raftmq.consumer")

# Told once per episode: a running consumer's group has consuming turned off (`raftmq group
# config G --consume off`); consuming resumes by itself when it is turned on again.
DisabledCallback = Callable[[ConsumeDisabledError], None]


class RefusalGate:
    def __init__(self, group: str, tell: DisabledCallback) -> None:
        self._group = group
        self._tell = tell
        self._lock = threading.Lock()
        self.state = GroupRefusal()

    def pull_delay_s(self) -> float:
        with self._lock:
            return self.state.pull_delay_s(time.monotonic())

    def refused(self, error: ConsumeDisabledError, sent_s: float) -> None:
        with self._lock:
            started = self.state.refused(error, sent_s, time.monotonic())
        if started:
            log.warning(
                "consumer.consume_disabled group=%s: %s; the consumer keeps running, pulls "
                "once every %.0f s at most, and resumes by itself when it is turned on",
                self._group,
                error.message,
                MAX_PROBE_S,
            )
            self._tell(error)

    def served(self, sent_s: float) -> None:
        with self._lock:
            ended = self.state.served(sent_s)
        if ended is not None:
            log.warning("consumer.consume_resumed group=%s", self._group)
