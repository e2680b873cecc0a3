"""A broker node's Prometheus metrics: the counters and histograms the request path feeds (one
call per request or batch, never per message) and a collector that reads the node's state when
scraped (Raft role, term and indexes, follower and dispatch lag, storage, consumer lag).

Names follow RocketMQ 5's metrics where one exists (rocketmq_messages_in_total,
rocketmq_throughput_in_total, rocketmq_consumer_lag_messages, ...); the rest are raftmq_*.
Nothing here decides anything or writes replicated state; every label set is bounded.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from raftmq.common.errors import RaftMQError
from raftmq.common.metrics_http import HotCounters, RpcMetrics, code_name, quota_families
from raftmq.common.quota import UserUsage
from raftmq.common.transport import Answer, Handler, RequestContext
from raftmq.raftlog.record import Role

if TYPE_CHECKING:
    from raftmq.broker.node import BrokerNode

# Latency buckets in seconds: a send is a Raft round (~1 ms on a quiet LAN, more under load);
# a pull may be a long poll held up to long_poll_max_ms (30 s by default).
LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
MAX_TOPIC_LABELS = 1000  # topics (or topic, group pairs) with their own series; the rest: _other
MAX_LAG_SERIES = 10_000  # consumer lag rows reported per scrape (committed offsets read)
ROLE_NAMES = {Role.LEADER: "leader", Role.FOLLOWER: "follower", Role.CANDIDATE: "candidate"}


class BrokerMetrics:
    """One per node, with its own registry (no process-global state: tests run several nodes in
    one process). `registry` is what the metrics endpoint serves. Disabled (no endpoint to read
    them), the request path records nothing and the transports are not wrapped at all."""

    def __init__(self, node: BrokerNode, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        # RocketMQ 5's names; *_total is added by the exposition.
        self._in = HotCounters(
            [
                ("rocketmq_messages_in", "Messages stored by sends to this node"),
                ("rocketmq_throughput_in", "Bytes of send requests (as received) stored here"),
            ],
            ["topic"],
            max_series=MAX_TOPIC_LABELS,
        )
        self._out = HotCounters(
            [
                ("rocketmq_messages_out", "Messages answered to pulls by this node"),
                ("rocketmq_throughput_out", "Bytes of pull answers (as sent) by this node"),
            ],
            ["topic", "consumer_group"],
            max_series=MAX_TOPIC_LABELS,
        )
        r.register(self._in)
        r.register(self._out)
        self.rpc = RpcMetrics(r, LATENCY_BUCKETS_S)
        self.held_pulls: Callable[[], int] = lambda: 0  # the data server plugs its count in
        # the data server plugs in its quota book's counters per (user, flow) (issue 27)
        self.quota_usage: Callable[[], list[tuple[str, str, UserUsage]]] = list
        r.register(NodeCollector(node, self))

    # ---- the request path: one call per request -----------------------------------------------

    def on_send(self, topic: str, count: int, nbytes: int) -> None:
        """A send of `count` messages in `nbytes` of request was stored."""
        if self.enabled:
            self._in.add((topic,), count, nbytes)

    def on_pull(self, group: str, topic: str, count: int, nbytes: int) -> None:
        """A pull answered `count` messages in `nbytes` of answer."""
        if count > 0 and self.enabled:
            self._out.add((topic, group), count, nbytes)

    # ---- wrappers for the two transports --------------------------------------------------------

    def frame_handler(self, method: str, handler: Handler) -> Handler:
        """`handler` of the framed data path, timed, its typed errors counted by code."""
        if not self.enabled:
            return handler
        observe, on_error = self.rpc.observe, self.rpc.on_error

        async def timed(payload: memoryview, ctx: RequestContext) -> Answer:
            t0 = time.perf_counter()
            try:
                return await handler(payload, ctx)
            except RaftMQError as exc:
                on_error("frame", method, code_name(exc))
                raise
            except asyncio.CancelledError:
                raise
            except Exception:
                on_error("frame", method, "INTERNAL")
                raise
            finally:
                observe("frame", method, time.perf_counter() - t0)

        return timed

    def grpc_interceptors(self) -> list[grpc.ServerInterceptor[Any, Any]]:
        return [self.rpc.interceptor()] if self.enabled else []


# ---- scrape time -------------------------------------------------------------------------------


def dir_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (blocks actually allocated: lmdb's map file is
    sparse), 0 if it does not exist."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue  # a segment deleted meanwhile
            total += st.st_blocks * 512
    return total


def readiness(node: BrokerNode) -> tuple[bool, str]:
    """Ready: the dispatcher runs, the disk takes writes, and the node leads with its gate open
    or follows a known leader."""
    if node.closed:
        return False, "shutting down"
    if node.dispatcher.failure is not None or not node.dispatcher.running:
        return False, f"dispatcher stopped: {node.dispatcher.failure}"
    if node.health.error is not None:
        return False, f"storage: {node.health.error.describe()}"
    st = node.status()
    if st.role is Role.LEADER:
        if not node.leader_gate_open() and node.dispatcher.dispatched_term < st.term:
            return False, f"leader of term {st.term}, still applying earlier terms"
        return True, f"leader of {node.group}, term {st.term}"
    if st.leader is None:
        return False, f"{ROLE_NAMES.get(st.role, st.role.value)} without a known leader"
    return True, f"follower of {node.group}, term {st.term}"


class NodeCollector(Collector):
    """Gauges computed from the node when scraped (nothing kept in between)."""

    def __init__(self, node: BrokerNode, metrics: BrokerMetrics) -> None:
        self._node = node
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        node = self._node
        st = node.status()
        labels = ["cluster", "broker_group", "node_id"]
        me = [node.settings.cluster, node.group, node.me.node_id]
        info = GaugeMetricFamily("raftmq_node_info", "This broker node (value 1)", labels=labels)
        info.add_metric(me, 1)
        yield info
        role = GaugeMetricFamily(
            "raftmq_raft_role", "1 for this node's current Raft role", labels=["role"]
        )
        for r, name in ROLE_NAMES.items():
            role.add_metric([name], 1 if st.role is r else 0)
        yield role
        for name, doc, value in (
            ("raftmq_raft_term", "Current Raft term", st.term),
            ("raftmq_raft_commit_index", "Highest Raft index known committed", st.commit_index),
            ("raftmq_raft_applied_index", "Highest Raft index applied here", st.applied_index),
            ("raftmq_raft_first_index", "First Raft index kept in the journal", st.first_index),
            ("raftmq_raft_last_index", "Last Raft index in the journal", st.last_index),
            ("raftmq_raft_pending_bytes", "Bytes submitted, not yet committed", st.pending_bytes),
            (
                "raftmq_dispatch_index",
                "Highest Raft index indexed (ConsumeQueue) here",
                node.dispatcher.dispatched_index,
            ),
            (
                "raftmq_dispatch_lag_entries",
                "Committed entries not yet indexed here (RocketMQ: dispatch behind)",
                max(0, st.commit_index - node.dispatcher.dispatched_index),
            ),
            ("raftmq_held_pulls", "Long polls held on the framed data path", self._held()),
            (
                "raftmq_quota_held_threads",
                "gRPC handler threads held now for their users' byte quotas",
                node.quota.held_threads,
            ),
            (
                "raftmq_storage_error",
                "1 while a disk write fails or a stored record read back corrupt",
                int(bool(node.health.error)),
            ),
            (
                "raftmq_storage_corrupt_records",
                "Stored records found failing their checksum and not repaired yet",
                len(node.health.corrupt_records),
            ),
        ):  # fmt: skip
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        scrubbed, passes = node.rlog.scrub_progress()
        for name, doc, value in (
            ("raftmq_scrub_bytes", "Journal bytes the scrubber re-read and checked", scrubbed),
            ("raftmq_scrub_passes", "Scrubber passes over the sealed journal segments", passes),
            (
                "raftmq_index_scrub_rows",
                "Index store rows the index scrub re-read and checked",
                node.index_repair.scrubbed_rows,
            ),
            (
                "raftmq_index_scrub_passes",
                "Index scrub passes over every index store table",
                node.index_repair.scrub_passes,
            ),
            (
                "raftmq_index_rebuilds",
                "Index store rebuilds from the log after a corrupt row",
                node.index_repair.rebuilds,
            ),
            (
                "raftmq_quota_refused_calls",
                "gRPC calls over a byte quota answered at once: their user held its share of "
                "handler threads (a send THROTTLED, a pull empty)",
                node.quota.refused_holds,
            ),
            (
                "raftmq_offsets_placed_batches",
                "Produce batches whose queue offsets this node placed as leader (answered at "
                "commit)",
                node.leader_offsets.placed_batches,
            ),
            (
                "raftmq_offsets_left_batches",
                "Produce batches this node as leader left to the dispatcher (answered once "
                "indexed: delayed, retried, or proposed while its offset book caught up)",
                node.leader_offsets.left_batches,
            ),
        ):  # counters since start: the exposition adds _total
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c
        lag = GaugeMetricFamily(
            "raftmq_raft_follower_match_lag_entries",
            "Leader only: entries of the leader's journal a follower has not matched yet",
            labels=["follower"],
        )
        if st.role is Role.LEADER:
            for raft_address, match in sorted(st.match_index.items()):
                member = node.member_for_raft(raft_address)
                lag.add_metric(
                    [member.node_id if member else raft_address], max(0, st.last_index - match)
                )
        yield lag
        yield from self._retention(st.role is Role.LEADER)
        yield from self._storage()
        yield from quota_families(self._metrics.quota_usage())
        yield from self._consumers(st.role is Role.LEADER)

    def _held(self) -> int:
        try:
            return self._metrics.held_pulls()
        except Exception:
            return 0

    def _retention(self, leader: bool) -> Iterator[Metric]:
        """Leader only: what the next retention cut deletes before each group consumed it
        (the warning before the deletion; broker/retention_service.py computes it)."""
        ret = self._node.retention
        risk = GaugeMetricFamily(
            "raftmq_retention_next_cut_unconsumed_messages",
            "Leader only: messages of a group not consumed yet that the next retention cut deletes",
            labels=["consumer_group", "topic"],
        )
        due = GaugeMetricFamily(
            "raftmq_retention_next_cut_due_seconds",
            "Leader only: seconds until the next retention cut may be proposed (0: due now)",
        )
        if leader and ret is not None and ret.next_cut is not None:
            for x in ret.at_risk:
                risk.add_metric([x.group, x.topic], x.messages)
            due.add_metric([], max(0, ret.next_cut.due_ms - time.time_ns() // 1_000_000) / 1000)
        yield risk
        yield due

    def _storage(self) -> Iterator[Metric]:
        node = self._node
        data_dir = node.settings.data_dir
        size = GaugeMetricFamily(
            "rocketmq_storage_size_bytes",
            "Bytes on disk: the journal (the CommitLog) and the indexes",
            labels=["kind"],
        )
        size.add_metric(["journal"], dir_bytes(data_dir / "raft"))
        size.add_metric(["index"], dir_bytes(data_dir / "store"))
        yield size
        try:
            usage = shutil.disk_usage(data_dir)
        except OSError:
            return
        free = GaugeMetricFamily(
            "raftmq_disk_free_bytes", "Free bytes of the data directory's disk"
        )
        free.add_metric([], usage.free)
        yield free
        total = GaugeMetricFamily("raftmq_disk_total_bytes", "Size of the data directory's disk")
        total.add_metric([], usage.total)
        yield total

    def _consumers(self, leader: bool) -> Iterator[Metric]:
        node = self._node
        with node.consumers_lock:
            groups = node.consumers.snapshot(int(time.monotonic() * 1000))
        conns = GaugeMetricFamily(
            "rocketmq_consumer_connections",
            "Consumer clients heartbeating to this node",
            labels=["consumer_group"],
        )
        for group, members in sorted(groups.items()):
            conns.add_metric([group], len(members))
        yield conns
        topics = node.topics()
        g = GaugeMetricFamily("rocketmq_topic_number", "Topics on this broker group")
        g.add_metric([], len(topics))
        yield g
        lag = GaugeMetricFamily(
            "rocketmq_consumer_lag_messages",
            "Leader only: messages of a queue after the group's committed offset",
            labels=["consumer_group", "topic", "queue_id"],
        )
        committed_groups: set[str] = set()
        if leader:
            bounds: dict[tuple[str, int], int] = {}
            for group, topic, queue_id, offset in node.store.all_committed_offsets(MAX_LAG_SERIES):
                committed_groups.add(group)
                high = bounds.get((topic, queue_id))
                if high is None:
                    high = bounds[(topic, queue_id)] = node.store.queue_bounds(topic, queue_id)[1]
                lag.add_metric([group, topic, str(queue_id)], max(0, high - offset))
        yield lag
        n = GaugeMetricFamily(
            "rocketmq_consumer_group_number",
            "Consumer groups with members or (leader) committed offsets here",
        )
        n.add_metric([], len(committed_groups | set(groups)))
        yield n
