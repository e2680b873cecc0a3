"""The dashboard's HTTP shell on common/http_shell.py (aiohttp): a held or slow connection costs
a socket, never a worker, and one client host holds at most its share of connections. A page
asks the brokers over gRPC, so pages run on a bounded pool of worker threads; requests beyond
the pool and its short queue get 503. /healthz is answered on the loop, whatever the pool does.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import ssl as ssl_lib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

from raftmq.common.http_shell import MAX_QUERY_PARAMS, HttpLimits, HttpServer
from raftmq.ops.dashboard.app import Dashboard, Request, Response

log = logging.getLogger("raftmq.dashboard")

WORKERS = 8
MAX_PENDING = 32  # requests waiting for a worker, beyond the busy ones
MAX_CONNECTIONS = 512
MAX_CONNECTIONS_PER_ADDRESS = 32  # a browser opens a handful; users behind one NAT, more
BODY_TIMEOUT_S = 10.0  # a form's body arriving slower than this is a slow client: 408


class DashboardServer:
    """Serves `dashboard` on (host, port); port 0 picks a free one (see `address`).
    `start()` binds and serves on its own thread; `stop()` closes."""

    def __init__(
        self,
        dashboard: Dashboard,
        host: str,
        port: int,
        *,
        limits: HttpLimits | None = None,
        ssl: ssl_lib.SSLContext | None = None,
    ) -> None:
        self.dashboard = dashboard
        self._host, self._port = host, port
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="dashboard")
        self._slots = asyncio.Semaphore(WORKERS + MAX_PENDING)
        limits = limits or HttpLimits(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_ADDRESS)
        self._http = HttpServer(self._serve, "dashboard", limits, ssl)
        self.address = ""
        # Answers per HTTP status, for /metrics (ops/dashboard/metrics.py): written on the loop,
        # read by a scrape; bounded by the few statuses this server answers.
        self.answered: collections.Counter[int] = collections.Counter()

    def start(self) -> str:
        self.address = self._http.start(self._host, self._port)
        return self.address

    def stop(self) -> None:
        self._http.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        resp = await self._answer(request)
        self.answered[resp.status] += 1
        return resp

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/healthz":
            return _send(Response(200, "ok\n", "text/plain; charset=utf-8"))
        if request.path.startswith("/static/"):
            return _static(request.path.removeprefix("/static/"))
        if request.method not in ("GET", "POST"):
            return _send(Response(405, "only GET and POST\n", "text/plain; charset=utf-8"))
        params = dict(request.rel_url.query)
        if request.method == "POST":
            try:
                async with asyncio.timeout(BODY_TIMEOUT_S):
                    form = await request.post()
            except TimeoutError:
                return _send(Response(408, "the form took too long to arrive\n"))
            except web.HTTPRequestEntityTooLarge:
                return _send(Response(413, "form too large\n"))
            if len(form) > MAX_QUERY_PARAMS:
                return _send(Response(400, f"at most {MAX_QUERY_PARAMS} form fields\n"))
            params.update((k, v) for k, v in form.items() if isinstance(v, str))
        if self._slots.locked():
            return _send(Response(503, "the dashboard is busy; retry in a moment\n"))
        async with self._slots:
            page = Request(request.method, request.path, params, dict(request.cookies))
            loop = asyncio.get_running_loop()
            resp = await loop.run_in_executor(self._pool, self.dashboard.handle, page)
        log.info("dashboard.request method=%s path=%s status=%d", request.method, request.path,
                 resp.status)  # fmt: skip
        return _send(resp)


STATIC = Path(__file__).with_name("static")
# Only these files, by name (never a path from the URL): the vendored Chart.js and our script.
STATIC_FILES = {"chart.umd.min.js": "text/javascript", "charts.js": "text/javascript"}


@functools.cache
def _static_body(name: str) -> bytes:
    return (STATIC / name).read_bytes()


def _static(name: str) -> web.Response:
    kind = STATIC_FILES.get(name)
    if kind is None:
        return _send(Response(404, "not found\n", "text/plain; charset=utf-8"))
    return web.Response(
        body=_static_body(name),
        headers={
            "Content-Type": f"{kind}; charset=utf-8",
            "Cache-Control": "max-age=3600",
            "X-Content-Type-Options": "nosniff",
        },
    )


def _send(resp: Response) -> web.Response:
    out = web.Response(
        status=resp.status,
        body=resp.body.encode(),
        headers={
            "Content-Type": resp.content_type,
            "Cache-Control": "no-store",
            # The pages are ours alone: no framing by another site, no inline script ever needed.
            "X-Frame-Options": "DENY",
            "Content-Security-Policy": "default-src 'self'; style-src 'unsafe-inline'",
        },
    )
    for name, value in resp.headers:  # Location, Set-Cookie (sign-in)
        out.headers.add(name, value)
    return out
