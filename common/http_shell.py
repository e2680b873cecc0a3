"""The HTTP shell every HTTP port shares (/metrics of each role, the dashboard): an aiohttp server
on its own event-loop thread, where a slow or silent connection costs a socket and no thread,
with a fair share of connections per client host and an early close of connections that hold no
request. What a path means is the caller's handler; this module never decides an answer.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_lib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from raftmq.common.fair_share import FairShare, ShareLimits, client_host
from raftmq.common.transport import LoopThread

_log = logging.getLogger("http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MAX_QUERY_PARAMS = 64  # more is a malformed or hostile URL: 400, never a traceback
MAX_BODY_BYTES = 64 << 10  # forms only; nothing larger is ever posted to these ports


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """`max_connections` held at once over all clients, `max_connections_per_address` per client
    host; a connection with no request running for `idle_timeout_s` (a request line or headers
    still arriving, or a kept-alive connection unused) is closed."""

    max_connections: int = 512
    max_connections_per_address: int = 16
    idle_timeout_s: float = 10.0


class _FairConnection(asyncio.Protocol):
    """Admits a connection by its client host's share before aiohttp sees it; otherwise a
    plain proxy of aiohttp's protocol. A refused client gets a 503 that says why."""

    def __init__(self, shell: HttpServer, inner: asyncio.Protocol) -> None:
        self._shell = shell
        self.inner = inner
        self.host = ""  # set when admitted
        self.transport: asyncio.Transport | None = None
        self.busy = 0  # requests of this connection inside the handler now
        self.quiet_since = 0.0  # loop time its last request ended (or it connected)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        shell = self._shell
        host = client_host(transport.get_extra_info("peername") or "?")
        refused = shell.shares.admit(host)
        if refused is not None:
            body = f"{refused.message}\n".encode()
            transport.write(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                b"Connection: close\r\nRetry-After: 5\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            transport.close()
            return
        self.host = host
        self.transport = transport
        self.quiet_since = shell.loop.time()
        shell.conns[self.inner] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.host:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.host else None

    def pause_writing(self) -> None:
        if self.host:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.host:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.host:
            return
        self._shell.shares.release(self.host)
        self._shell.conns.pop(self.inner, None)
        self.host = ""
        self.inner.connection_lost(exc)


class HttpServer:
    """Serves `handler` for every path on (host, port); `start()` returns the bound "host:port",
    `stop()` closes everything. Requests with more than MAX_QUERY_PARAMS parameters get 400."""

    def __init__(
        self,
        handler: Handler,
        name: str,
        limits: HttpLimits | None = None,
        ssl: ssl_lib.SSLContext | None = None,
    ) -> None:
        self._handler = handler
        self._name = name
        self.limits = limits or HttpLimits()
        self._ssl = ssl
        self.shares = FairShare(
            ShareLimits(self.limits.max_connections, self.limits.max_connections_per_address)
        )
        self.conns: dict[asyncio.Protocol, _FairConnection] = {}
        self._io: LoopThread | None = None
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._sweep: asyncio.TimerHandle | None = None
        self.address = ""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._io is not None, "start() first"
        return self._io.loop

    def start(self, host: str, port: int) -> str:
        self._io = LoopThread(name=f"http-{self._name}")
        try:
            bound = self._io.run(self._start(host, port), timeout_s=15)
        except BaseException:
            self._io.stop()
            self._io = None
            raise
        self.address = f"{host}:{bound}"
        _log.info("http.started name=%s address=%s", self._name, self.address)
        return self.address

    async def _start(self, host: str, port: int) -> int:
        app = web.Application(middlewares=[self._mark], client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handler)
        runner = self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            keepalive_timeout=self.limits.idle_timeout_s,
            max_headers=64,
        )
        await runner.setup()
        factory = runner.server
        assert factory is not None
        self._server = await self.loop.create_server(
            lambda: _FairConnection(self, factory()),
            host,
            port,
            ssl=self._ssl,
            ssl_handshake_timeout=self.limits.idle_timeout_s if self._ssl else None,
            backlog=1024,
            reuse_address=True,
        )
        self._schedule_sweep()
        sockname = self._server.sockets[0].getsockname()
        return int(sockname[1])

    def stop(self) -> None:
        io = self._io
        if io is None:
            return
        self._io = None
        try:
            io.run(self._stop(), timeout_s=10)
        except Exception:
            _log.exception("http.stop_failed name=%s", self._name)
        io.stop()

    async def _stop(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.conns.values()):
            if conn.transport is not None:
                conn.transport.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- the early close of connections that hold no request

    def _schedule_sweep(self) -> None:
        every_s = max(0.05, min(1.0, self.limits.idle_timeout_s / 4))
        self._sweep = self.loop.call_later(every_s, self._close_quiet)

    def _close_quiet(self) -> None:
        """A connection whose request has not arrived whole (slowloris), or that keeps a socket
        open between requests, is closed once quiet for idle_timeout_s: it holds a share."""
        now = self.loop.time()
        for conn in list(self.conns.values()):
            if conn.busy or now - conn.quiet_since <= self.limits.idle_timeout_s:
                continue
            if conn.transport is not None and not conn.transport.is_closing():
                _log.info("http.quiet_close name=%s peer=%s", self._name, conn.host)
                conn.transport.close()
        self._schedule_sweep()

    @web.middleware
    async def _mark(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = self.conns.get(cast(Any, request.protocol))
        if conn is not None:
            conn.busy += 1
        try:
            if len(request.rel_url.query) > MAX_QUERY_PARAMS:
                return web.Response(
                    status=400,
                    text=f"at most {MAX_QUERY_PARAMS} query parameters are accepted\n",
                )
            return await handler(request)
        finally:
            if conn is not None:
                conn.busy -= 1
                conn.quiet_since = self.loop.time()
