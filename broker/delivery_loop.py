"""The leader's delivery loop: a thin shell around broker/schedule.py's Schedule. One thread per
node; on the leader it sleeps until the first due time (or a new, earlier schedule entry), takes
the due keys and proposes one DELIVER record per batch through the Raft log, waiting for its
apply before the next. Followers idle. Exactly-once and never-early are decided in apply
(broker/delivery.py), so a deposed leader's late proposal is harmless.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from raftmq.broker.dispatcher_thread import DispatchProgress
from raftmq.broker.schedule import Schedule
from raftmq.broker.schedule_store import location
from raftmq.common import record_batch
from raftmq.common.errors import RaftMQError
from raftmq.common.record_batch import Deliver, DeliverKey

if TYPE_CHECKING:
    from raftmq.broker.node import BrokerNode

log = logging.getLogger("broker.delivery")

GATE_GRACE_S = 1.0  # a new leader's first write opens its gate; without writes, the loop does
MAX_SLEEP_S = 0.5  # bounds how long a missed wake-up (or a clock step) can delay a delivery
RETRY_SLEEP_S = 0.2  # after a failed proposal (leadership moving, queue full)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class DeliveryLoop:
    def __init__(self, node: BrokerNode, *, deliver_batch: int) -> None:
        self._node = node
        # One proposal in flight: the loop waits for each apply, so the on-disk index it scans
        # next already lacks what was delivered (no duplicate proposals from this leader).
        self._schedule = Schedule(
            node.store.schedule_index(), deliver_batch=deliver_batch, max_inflight_batches=1
        )
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"delivery-{node.me.node_id}", daemon=True
        )
        self.delivered_batches = 0
        self._gate_closed_since: float | None = None
        # No role listener: a follower polls every MAX_SLEEP_S, which bounds how late a new
        # leader starts delivering (its gate takes about as long).
        node.dispatcher.add_listener(self._on_progress)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def scheduled_count(self) -> int:
        return self._schedule.index.count()

    def _on_progress(self, progress: DispatchProgress) -> None:
        # A newly scheduled message may be due before the time the loop sleeps until.
        if any(out.schedule_puts for out in progress.outputs):
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                sleep_s = self._step(_now_ms())
            except RaftMQError as exc:
                log.info("broker.delivery_retry error=%s", exc.message)
                sleep_s = RETRY_SLEEP_S
            except Exception:
                if self._stopping.is_set() or self._node.closed:
                    return
                log.exception("broker.delivery_failed")
                sleep_s = 1.0
            if sleep_s > 0:
                self._wake.wait(sleep_s)
            self._wake.clear()

    def _step(self, now_ms: int) -> float:
        """One decision; returns how long to sleep (0: go on at once)."""
        node = self._node
        if node.closed:
            self._stopping.set()
            return 0
        if not node.rlog.is_leader():
            self._schedule.lost_leadership()
            return MAX_SLEEP_S
        # A new leader first applies every earlier term's entries (the leader gate). Writes
        # open the gate; the loop waits for that a while before opening it itself, so the
        # gate is opened (and its wait counted, leader_gate_waits) by writers when there are any.
        if not node.leader_gate_open():
            now = time.monotonic()
            if self._gate_closed_since is None:
                self._gate_closed_since = now
            if now - self._gate_closed_since < GATE_GRACE_S:
                return 0.1
            node.require_leader()
        self._gate_closed_since = None
        proposal = self._schedule.take_due(now_ms)
        if proposal is None:
            nxt = self._schedule.next_due_ms()
            if nxt is None:
                return MAX_SLEEP_S
            return min(max(nxt - now_ms, 1) / 1000, MAX_SLEEP_S)
        keys = tuple(DeliverKey(k.due_ms, *location(k)) for k in proposal.keys)
        payload = record_batch.encode(Deliver(proposal.now_ms, keys))
        try:
            node.replicate([payload], node.settings.send_timeout_ms / 1000)
        except RaftMQError:
            self._schedule.lost_leadership()  # the window restarts from the index
            raise
        finally:
            self._schedule.proposal_done(proposal)
        self.delivered_batches += 1
        return 0
