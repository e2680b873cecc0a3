"""The dashboard's Prometheus metrics (issue 27): its answers per HTTP status, read at scrape
time, served by common/metrics_http.py on a port of its own with the brokers' TLS modes and
scrape credentials.

Imported only when `raftmq dashboard --metrics-listen` asks for it (prometheus_client); reads
the server's counters, never changes them.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from raftmq.ops.dashboard.server import DashboardServer


def dashboard_registry(server: DashboardServer) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_DashboardCollector(server))
    return registry


class _DashboardCollector(Collector):
    def __init__(self, server: DashboardServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        answers = CounterMetricFamily(
            "raftmq_dashboard_answers",
            "HTTP answers of the dashboard's port by status (503: its page workers were busy)",
            labels=["status"],
        )
        for status, count in sorted(dict(self._server.answered).items()):
            answers.add_metric([str(status)], count)
        yield answers
