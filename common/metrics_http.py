"""The HTTP endpoint every server role shares: Prometheus text at /metrics (prometheus_client's
exposition of the role's own registry), /healthz (the process serves) and /readyz (the role says
it can do its job; 503 with the reason when not).

Served by common/http_shell.py, off every hot path; it reads values, it never changes any.
Only server processes import this module (prometheus_client is in the `server` extra).
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from raftmq.common import tls
from raftmq.common.errors import ERROR_DETAIL_KEY, RaftMQError, row_for
from raftmq.common.http_shell import HttpLimits, HttpServer
from raftmq.common.pb import common_pb2
from raftmq.common.quota import UserUsage
from raftmq.common.scrape_access import ScrapeAccess, ScrapeSettings, metrics_bind, scrape_ssl

_log = logging.getLogger("metrics")

# (ready, why): why says what is missing when not ready, or what the role is when ready.
Readiness = Callable[[], tuple[bool, str]]
SCRAPE_THREADS = 2  # scrapes and readiness checks at once; more wait (a scrape takes ms)


# Seconds: control-plane calls take a few ms; a broker's pull may be held up to 30 s.
RPC_LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


def code_name(exc: RaftMQError) -> str:
    """The ErrorCode name of a typed error (the errors metric's `code` label)."""
    return row_for(type(exc)).code


def quota_families(usage: Iterable[tuple[str, str, UserUsage]]) -> Iterator[Metric]:
    """The byte quotas' counters per user and flow (produce, consume) of a server that holds
    them (a broker's data port, the proxy): bounded by the quota book's max_users (past it:
    user "_other"). Anonymous (auth off) is user ""."""
    labels = ["user", "flow"]
    moved = CounterMetricFamily(
        "raftmq_quota_bytes", "Bytes a user produced or consumed here", labels=labels
    )
    held = CounterMetricFamily(
        "raftmq_quota_throttle_seconds",
        "Time this process held a user's answers for its quota",
        labels=labels,
    )
    answers = CounterMetricFamily(
        "raftmq_quota_throttled_answers", "Answers held for a user's quota", labels=labels
    )
    for user, flow, u in usage:
        moved.add_metric([user, flow], u.bytes)
        held.add_metric([user, flow], u.throttle_ms / 1000)
        answers.add_metric([user, flow], u.throttled)
    yield moved
    yield held
    yield answers


class HotCounters(Collector):
    """Counter families that share label values and move together on a server's hot path
    (e.g. messages and bytes per topic): one lock and one dict lookup per call for all of them
    (measured here, CPU time: 0.50 us for a message and a byte count, against 0.36 us for each
    prometheus_client Counter.inc, one per family). Exposed at scrape time as counters; the
    label sets are bounded: past `max_series` new ones are counted under `overflow`."""

    def __init__(
        self,
        families: Sequence[tuple[str, str]],  # (name without _total, help) per value
        labels: Sequence[str],
        *,
        max_series: int = 1000,
        overflow: tuple[str, ...] = (),
    ) -> None:
        self._families = tuple(families)
        self._labels = tuple(labels)
        self._max = max_series
        self._overflow = overflow or tuple("_other" for _ in labels)
        self._lock = threading.Lock()
        self._series: dict[tuple[str, ...], list[float]] = {}

    def add(self, key: tuple[str, ...], *values: float) -> None:
        with self._lock:
            row = self._series.get(key)
            if row is None:
                if len(self._series) >= self._max:
                    key = self._overflow
                row = self._series.setdefault(key, [0.0] * len(self._families))
            for i, v in enumerate(values):
                row[i] += v

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rows = [(k, list(v)) for k, v in self._series.items()]
        for i, (name, doc) in enumerate(self._families):
            family = CounterMetricFamily(name, doc, labels=self._labels)
            for key, values in rows:
                family.add_metric(list(key), values[i])
            yield family


class HotHistogram(Collector):
    """A latency histogram per label key for the hot path: bisect into fixed buckets and one
    lock per observation (0.41 us of CPU here; prometheus_client's Histogram walks its buckets
    in Python). Exposed as a histogram family at scrape time."""

    def __init__(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self._name, self._doc, self._labels = name, doc, tuple(labels)
        self._bounds = tuple(sorted(buckets))
        self._lock = threading.Lock()
        self._series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def observe(self, key: tuple[str, ...], seconds: float) -> None:
        i = bisect.bisect_left(self._bounds, seconds)  # le semantics: a value on a bound is in it
        with self._lock:
            row = self._series.get(key)
            if row is None:
                row = self._series[key] = ([0] * (len(self._bounds) + 1), [0.0])
            row[0][i] += 1
            row[1][0] += seconds

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rows = [(k, list(c), s[0]) for k, (c, s) in self._series.items()]
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labels)
        for key, counts, total in rows:
            cumulative, buckets = 0, []
            for bound, n in zip((*self._bounds, float("inf")), counts, strict=True):
                cumulative += n
                buckets.append((floatToGoString(bound), cumulative))  # type: ignore[no-untyped-call]
            family.add_metric(list(key), buckets, total)
        yield family


class RpcMetrics:
    """Request latency per (protocol, method) and errors per (protocol, method, raftmq code):
    rocketmq_rpc_latency_seconds and raftmq_errors_total. Label sets are bounded by the
    servers' method tables and the error table."""

    def __init__(
        self, registry: CollectorRegistry, buckets: Sequence[float] = RPC_LATENCY_BUCKETS_S
    ) -> None:
        self._latency = HotHistogram(
            "rocketmq_rpc_latency_seconds",
            "Time from request to answer, per protocol and method (a broker's pulls include "
            "their long-poll hold)",
            ["protocol", "method"],
            buckets,
        )
        registry.register(self._latency)
        self._errors = Counter(
            "raftmq_errors",
            "Requests answered with an error, by method and raftmq error code",
            ["protocol", "method", "code"],
            registry=registry,
        )

    def observe(self, protocol: str, method: str, seconds: float) -> None:
        self._latency.observe((protocol, method), seconds)

    def on_error(self, protocol: str, method: str, code: str) -> None:
        self._errors.labels(protocol, method, code).inc()

    def interceptor(self) -> grpc.ServerInterceptor[Any, Any]:
        return _GrpcMetrics(self)


class _RecordingContext:
    """A servicer context that remembers the error detail `abort_with` attaches (its code is
    the raftmq ErrorCode the errors metric counts); everything else passes through."""

    def __init__(self, inner: grpc.ServicerContext) -> None:
        self._inner = inner
        self.code_name = ""

    def set_trailing_metadata(self, metadata: Any) -> None:
        for key, value in metadata:
            if key == ERROR_DETAIL_KEY and isinstance(value, bytes):
                try:
                    detail = common_pb2.ErrorDetail.FromString(value)
                    self.code_name = common_pb2.ErrorCode.Name(detail.code)
                except Exception:
                    self.code_name = "UNKNOWN"
        self._inner.set_trailing_metadata(metadata)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _GrpcMetrics(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Times every unary call of a gRPC server and counts its errors by raftmq code."""

    def __init__(self, metrics: RpcMetrics) -> None:
        self._metrics = metrics

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method.rpartition("/")[2]
        inner = handler.unary_unary
        metrics = self._metrics

        @functools.wraps(inner)
        def timed(request: Any, context: grpc.ServicerContext) -> Any:
            t0 = time.perf_counter()
            ctx = _RecordingContext(context)
            try:
                return inner(request, ctx)  # type: ignore[arg-type]
            except BaseException:
                metrics.on_error("grpc", method, ctx.code_name or "INTERNAL")
                raise
            finally:
                metrics.observe("grpc", method, time.perf_counter() - t0)

        return grpc.unary_unary_rpc_method_handler(
            timed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class MetricsServer:
    """Serve `registry` and the two probes on (host, port); `start()` returns the bound
    "host:port", `stop()` closes the socket. On common/http_shell.py: a client host holds at most
    its share of connections, and a scrape runs on a small pool, never on the loop (collectors
    read in-memory state under their locks)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        ready: Readiness,
        name: str,
        limits: HttpLimits | None = None,
        *,
        access: ScrapeAccess | None = None,
        tls_mode: str = "",
        tls_material: tls.Tls | Any | None = tls.PROCESS,
    ) -> None:
        self.registry = registry
        self._ready = ready
        self._name = name
        self._limits = limits
        self._access = access or ScrapeAccess()
        self._tls_mode = tls_mode  # scrape_access.TLS_MODES: this port's TLS (issue 27)
        self._tls_material = tls_material
        self._http: HttpServer | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.address = ""

    def start(self, host: str, port: int) -> str:
        ctx = scrape_ssl(self._tls_mode, self._tls_material)
        self._pool = ThreadPoolExecutor(SCRAPE_THREADS, thread_name_prefix=f"metrics-{self._name}")
        self._http = HttpServer(self._serve, f"metrics-{self._name}", self._limits, ctx)
        try:
            self.address = self._http.start(host, port)
        except BaseException:
            self._pool.shutdown(wait=False)
            raise
        _log.info("metrics.started address=%s", self.address)
        return self.address

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        if not self._access.allows(request.path, request.headers.get("Authorization")):
            return web.Response(
                status=401,
                text="unauthorized: this port asks the credentials of metrics_basic_auth_user "
                "or metrics_bearer_token (Prometheus: basic_auth or authorization)\n",
                headers={"WWW-Authenticate": self._access.challenge},
            )
        if request.path == "/metrics":
            try:
                body = await loop.run_in_executor(self._pool, generate_latest, self.registry)
            except Exception as exc:  # a collector's bug: say so, keep serving
                _log.exception("metrics.collect_failed")
                return _text(500, f"collecting metrics failed: {exc}\n")
            return web.Response(
                status=200, body=body, headers={"Content-Type": CONTENT_TYPE_LATEST}
            )
        if request.path == "/healthz":
            return _text(200, "ok\n")
        if request.path == "/readyz":
            try:
                ok, why = await loop.run_in_executor(self._pool, self._ready)
            except Exception as exc:
                ok, why = False, f"readiness check failed: {exc}"
            return _text(200 if ok else 503, f"{'ready' if ok else 'not ready'}: {why}\n")
        return _text(404, "not found: try /metrics, /healthz or /readyz\n")

    def stop(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            http.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _text(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text, content_type="text/plain", charset="utf-8")


def start_metrics(
    listen: str,
    registry: CollectorRegistry,
    ready: Readiness,
    name: str,
    settings: ScrapeSettings | None = None,
    tls_material: tls.Tls | Any | None = tls.PROCESS,
) -> MetricsServer | None:
    """A started MetricsServer on `listen` (a metrics_listen value), or None when off, with the
    role's share per client host, TLS (the process's material unless `tls_material`) and scrape
    credentials. Raises OSError naming the address when it cannot bind."""
    bind = metrics_bind(listen)
    if bind is None:
        return None
    s = settings or ScrapeSettings()
    server = MetricsServer(
        registry,
        ready,
        name,
        HttpLimits(max_connections_per_address=s.http_max_connections_per_address),
        access=ScrapeAccess.from_settings(s),
        tls_mode=s.metrics_tls,
        tls_material=tls_material,
    )
    try:
        server.start(*bind)
    except OSError as exc:
        raise OSError(f"cannot listen on {listen} (metrics_listen): {exc}") from exc
    return server
