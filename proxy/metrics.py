"""The proxy's Prometheus metrics: the RocketMQ 5 clients it knows, the POP state mirrors it
holds, and the byte quotas per user (issue 27), read at scrape time.

Reads the service's counters from the scrape's thread; never changes them, never blocks the
proxy's loop.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from raftmq.common.metrics_http import quota_families
from raftmq.proxy.service import MessagingService


class ProxyMetrics:
    def __init__(self, service: MessagingService) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_ProxyCollector(service))


class _ProxyCollector(Collector):
    def __init__(self, service: MessagingService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        s = self._service
        yield GaugeMetricFamily(
            "raftmq_proxy_clients", "RocketMQ 5 clients heard from lately", value=s.client_count
        )
        yield GaugeMetricFamily(
            "raftmq_proxy_pop_queues",
            "(consumer group, queue) POP state mirrors held (max_pop_queues)",
            value=s.pop_queue_count,
        )
        yield from quota_families(s.quota.usage())
