"""The retention shell of a broker node: a timer thread that, every retention_check_interval_ms,
checks the disk guard, deletes journal segments below the replicated cut, trims index rows below
the queues' min offsets, and (on the leader) proposes the next RETENTION record; plus the
snapshot seam raftlog calls for a follower behind the cut. Decisions are broker/retention.py's.
It never deletes what is not below the cut every replica applied at the same log position.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from typing import TYPE_CHECKING

from raftmq.broker.retention import (
    DiskLimits,
    GroupLoss,
    NextCut,
    RetentionPolicy,
    decide,
    disk_pressure,
    encode_record,
    next_cut,
)
from raftmq.broker.retention_store import decode_base
from raftmq.common.errors import RaftMQError
from raftmq.raftlog.native_log import NativeLog
from raftmq.raftlog.snapshot import Snapshot

if TYPE_CHECKING:
    from raftmq.broker.node import BrokerNode

log = logging.getLogger("broker.retention")

TRIM_ROWS_PER_TXN = 5_000  # index rows deleted per lmdb transaction
TRIM_TXNS_PER_STEP = 20  # transactions per check (the rest waits for the next one)
DELETE_WAIT_S = 5.0
DISK_CHECK_S = 1.0  # the disk guard's period at most


class RetentionService:
    def __init__(self, node: BrokerNode, rlog: NativeLog) -> None:
        s = node.settings
        self._node = node
        self._rlog = rlog
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"retention-{s.node_id}", daemon=True
        )
        self.deleted_segments = 0  # segment files deleted by this node (status, tests)
        # The leader's look ahead (status, metrics, the controller's retention_loss alarm):
        # the next cut and what each group would lose by it. Replaced whole, read unlocked.
        self.next_cut: NextCut | None = None
        self.at_risk: tuple[GroupLoss, ...] = ()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=DELETE_WAIT_S + 1)

    def journal_bytes(self) -> int:
        return sum(seg.size_bytes for seg in self._rlog.segments())

    # The settings are read at each use: `raftmq broker config` changes them live
    # (broker/live_settings.py).
    @property
    def _policy(self) -> RetentionPolicy:
        s = self._node.settings
        return RetentionPolicy(s.retention_ms, s.retention_bytes)

    @property
    def _limits(self) -> DiskLimits:
        s = self._node.settings
        return DiskLimits(s.max_store_bytes, s.disk_max_used_ratio)

    @property
    def _interval_s(self) -> float:
        return self._node.settings.retention_check_interval_ms / 1000

    def _run(self) -> None:
        # The disk is checked at least once a second whatever the retention interval: a leader
        # past its threshold must hand off before its disk fills (issue 25).
        next_step = time.monotonic() + self._interval_s
        while not self._stop.wait(min(self._interval_s, DISK_CHECK_S)):
            try:
                if time.monotonic() >= next_step:
                    next_step = time.monotonic() + self._interval_s
                    self.step(time.time_ns() // 1_000_000)
                elif not self._node.closed:
                    self._check_disk()
            except Exception:  # a bug or a full disk: logged, tried again next time
                log.exception("broker.retention_step_failed node=%s", self._node.me.node_id)

    def step(self, now_ms: int) -> None:
        if self._node.closed:
            return
        self._check_disk()
        self._delete_segments()
        self._trim_index()
        if self._node.leader_gate_open():
            self._propose(now_ms)
            self._look_ahead(now_ms)
        else:
            self.next_cut, self.at_risk = None, ()

    # ---- the parts -----------------------------------------------------------------------------

    def _check_disk(self) -> None:
        node = self._node
        used = self.journal_bytes() + node.store.size_bytes()
        try:
            st = os.statvfs(node.settings.data_dir)
            ratio = 1.0 - st.f_bavail / st.f_blocks if st.f_blocks else 0.0
        except OSError:
            ratio = 0.0
        before = node.disk_pressure
        refusing = before is not None
        limits = self._limits
        # Only a disk fuller than its ratio is this node's own: every replica stores the same
        # bytes, so max_store_bytes is passed by all alike and a hand-off would not help.
        stored = disk_pressure(replace(limits, max_used_ratio=1.0), used, ratio, refusing)
        full = disk_pressure(replace(limits, max_store_bytes=0), used, ratio, refusing)
        reason = stored or full
        if reason is not None and before is None:
            log.error(
                "broker.disk_pressure node=%s store_bytes=%d disk_used_ratio=%.3f: sends refused "
                "because %s; they resume once retention frees space",
                node.me.node_id,
                used,
                ratio,
                reason,
            )
        elif reason is None and before is not None:
            log.warning(
                "broker.disk_pressure_over node=%s store_bytes=%d disk_used_ratio=%.3f: sends "
                "accepted again",
                node.me.node_id,
                used,
                ratio,
            )
        node.disk_pressure = reason
        node.disk_pressure_movable = stored is None and full is not None
        self._rlog.set_disk_pressure(full is not None)

    def _delete_segments(self) -> None:
        """Delete whole segments below the cut this replica applied (and indexed past)."""
        node, rlog = self._node, self._rlog
        before = min(node.store.cut_index, node.dispatcher.dispatched_index + 1)
        before = min(before, rlog.committed_index + 1)
        first = rlog.first_index
        if before <= first:
            return
        segments = {s.first_index: s for s in rlog.segments()}
        # The index store is not fsynced (it is rebuilt from the journal after a crash): once
        # the journal's prefix is gone it cannot be, so what it holds up to the cut must be
        # durable first, or an OS crash could leave it behind the journal's first index.
        node.store.sync()
        try:
            new_first = rlog.delete_prefix(before).result(DELETE_WAIT_S)
        except FutureTimeout:
            log.warning("broker.retention_delete_slow node=%s before=%d", node.me.node_id, before)
            return
        if new_first > first:
            gone = [s for f, s in segments.items() if f < new_first]
            self.deleted_segments += len(gone)
            log.info(
                "broker.retention_deleted_segments node=%s segments=%d bytes=%d first_index=%d "
                "cut=%d",
                node.me.node_id,
                len(gone),
                sum(s.size_bytes for s in gone),
                new_first,
                before,
            )

    def _trim_index(self) -> None:
        store = self._node.store
        for _ in range(TRIM_TXNS_PER_STEP):
            if self._stop.is_set() or store.trim_step(TRIM_ROWS_PER_TXN) < TRIM_ROWS_PER_TXN:
                return

    def _propose(self, now_ms: int) -> None:
        node = self._node
        bases = node.store.base_indexes()
        # The floor depends on the base the cut stands on (rows written after it pin older
        # entries) and only falls with an older base: start from the newest base, then step
        # back while the cut passes its own base's floor. Apply checks it again, exactly.
        base = max(bases, default=0)
        proposal = None
        for _ in range(4):
            proposal = decide(
                self._rlog.segments(),
                bases,
                node.store.cut_index,
                node.dispatcher.dispatched_index,
                self._policy,
                now_ms,
                node.store.retention_floor(base),
            )
            cut = proposal.record.cut_index if proposal is not None else 0
            if not cut or cut - 1 == base:
                break
            floor = node.store.retention_floor(cut - 1)
            if floor is None or cut <= floor:
                break
            base = cut - 1
        if proposal is None:
            return
        rec = proposal.record
        if rec.cut_index and not self._worth_it(rec.cut_index):
            return
        try:
            node.replicate([encode_record(rec)], node.settings.send_timeout_ms / 1000)
        except RaftMQError as exc:  # lost leadership, a full disk: the next check tries again
            log.info("broker.retention_propose_failed node=%s error=%s", node.me.node_id, exc)
            return
        if rec.cut_index:
            log.info(
                "broker.retention_proposed node=%s cut=%d reason=%s wanted=%d",
                node.me.node_id,
                rec.cut_index,
                rec.reason.name.lower(),
                proposal.wanted_first_index,
            )

    def _worth_it(self, cut: int) -> bool:
        """A cut that moves no queue's min offset and frees no segment is not proposed: a quiet
        journal whose messages are already cut would otherwise get a cut (a log entry, a base)
        every retention_ms for ever."""
        segments = self._rlog.segments()
        if segments and self._node.store.cut_index < segments[-1].first_index:
            return True  # sealed segments above the cut: this cut lets them go
        preview = self._node.store.preview_cut(cut)
        return preview is not None and bool(preview[0])

    def _look_ahead(self, now_ms: int) -> None:
        """Warn before deleting: the next cut, and the groups whose unconsumed messages it
        takes (one log line when a group/topic starts being at risk)."""
        node = self._node
        bases = node.store.base_indexes()
        nxt = next_cut(
            self._rlog.segments(),
            bases,
            node.store.cut_index,
            node.dispatcher.dispatched_index,
            self._policy,
            now_ms,
            node.store.retention_floor(max(bases, default=0)),
        )
        preview = node.store.preview_cut(nxt.cut_index) if nxt is not None else None
        at_risk = tuple(preview[1]) if preview is not None else ()
        before = {(x.group, x.topic) for x in self.at_risk}
        for x in at_risk:
            if (x.group, x.topic) not in before and nxt is not None:
                log.warning(
                    "broker.retention_will_delete_unconsumed node=%s group=%s topic=%s "
                    "messages=%d cut=%d in_s=%d: the next retention cut deletes them unless the "
                    "group consumes them first",
                    node.me.node_id,
                    x.group,
                    x.topic,
                    x.messages,
                    nxt.cut_index,
                    (nxt.due_ms - now_ms) // 1000,
                )
        self.next_cut, self.at_risk = nxt, at_risk


class BrokerSnapshots:
    """raftlog's SnapshotStore over the node's store: the base the current cut stands on."""

    def __init__(self, node: BrokerNode) -> None:
        self._node = node

    def snapshot_for(self, first_index: int) -> Snapshot | None:
        store = self._node.store
        cut = store.cut_index
        if cut <= 0 or cut < first_index:
            return None
        blob = store.base(cut - 1)
        if blob is None:
            return None
        base = decode_base(blob)
        return Snapshot(base.index, base.term, blob)

    def install_snapshot(self, snapshot: Snapshot, reset_log: Callable[[], None]) -> None:
        node = self._node

        def replace() -> tuple[int, int]:
            node.store.install_base(snapshot.state)  # the store first: a crash here re-installs
            # The transactions as of the base, not as this node had them.
            node.transactions.reload(node.store.transaction_values())
            reset_log()
            return snapshot.base_index, snapshot.base_term

        node.dispatcher.install(replace)
        log.warning(
            "broker.snapshot_installed node=%s base_index=%d: this node was behind the "
            "retention cut; it follows the leader from %d",
            node.me.node_id,
            snapshot.base_index,
            snapshot.base_index + 1,
        )
