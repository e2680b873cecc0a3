"""A NameServer's Prometheus metrics: the routes it holds (topics, broker groups, nodes, which
groups have a leader and at what term), read from the route table when scraped, plus the gRPC
request latency and errors (route lookups and their NO_ROUTE misses among them).

Read only; the NameServer stays soft state (invariant 7).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from raftmq.common.metrics_http import RpcMetrics
from raftmq.namesrv.service import NameServerService


class NameServerMetrics:
    def __init__(self, service: NameServerService) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.rpc = RpcMetrics(self.registry)
        self.registry.register(_RouteCollector(service))


def readiness(service: NameServerService) -> tuple[bool, str]:
    """Ready once it serves, brokers or not: brokers register through the same address an
    orchestrator would stop routing to if an empty NameServer said not-ready."""
    clusters, topics = service.snapshot()
    groups = sum(len(c.groups) for c in clusters)
    return True, f"{groups} broker groups, {len(topics)} topics"


class _RouteCollector(Collector):
    def __init__(self, service: NameServerService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        clusters, topics = self._service.snapshot()
        t = GaugeMetricFamily("raftmq_namesrv_topics", "Topics with a route here")
        t.add_metric([], len(topics))
        yield t
        groups = GaugeMetricFamily(
            "raftmq_namesrv_broker_groups", "Broker groups registered", labels=["cluster"]
        )
        nodes = GaugeMetricFamily(
            "raftmq_namesrv_broker_nodes",
            "Live broker nodes registered per group",
            labels=["cluster", "broker_group"],
        )
        leader = GaugeMetricFamily(
            "raftmq_namesrv_group_has_leader",
            "1 when the route names the group's leader",
            labels=["cluster", "broker_group"],
        )
        term = GaugeMetricFamily(
            "raftmq_namesrv_group_term",
            "Highest leader term accepted for the group",
            labels=["cluster", "broker_group"],
        )
        for c in clusters:
            groups.add_metric([c.name], len(c.groups))
            for g in c.groups:
                nodes.add_metric([c.name, g.broker_group], len(g.nodes))
                leader.add_metric([c.name, g.broker_group], int(g.leader_node_id is not None))
                term.add_metric([c.name, g.broker_group], g.term)
        yield from (groups, nodes, leader, term)
