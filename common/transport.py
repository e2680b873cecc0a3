"""The asyncio shell around `common/frame.py`: `FrameServer` and `FrameClient` for the data path.

Thin on purpose: what bytes mean is decided in frame.py; this module moves them between
sockets, tasks and futures. Everything is bounded (frame size, requests in flight per
connection, pending calls, pending write bytes). It never sends a traceback to a peer.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import logging
import ssl as ssl_lib
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, NamedTuple, TypeVar, cast

from raftmq.common import errors, timeline
from raftmq.common.fair_share import FairShare, ShareLimits, client_host
from raftmq.common.frame import (
    AUTH_HMAC_SHA1,
    AUTH_NONE,
    DEFAULT_MAX_FRAME_BYTES,
    MAX_METHOD,
    MAX_REQUEST_ID,
    PROTOCOL_VERSION,
    BytesLike,
    Frame,
    FrameBuffers,
    FrameDecoder,
    Hello,
    Kind,
    Parts,
    Payload,
    ProtocolError,
    batch_version_of,
    decode_error,
    decode_hello,
    encode_hello,
    error_body,
    frame_into,
    request_into,
    server_hello,
)

_log = logging.getLogger(__name__)

_T = TypeVar("_T")
_Out = list[bytes | bytearray | memoryview]

# A REQUEST's bytes counted against the peer's max_frame_bytes beyond its payload.
_REQUEST_OVERHEAD = 8  # kind, flags, request id, method
_RESPONSE_OVERHEAD = 6  # kind, flags, request id
# Pooled whole-frame buffers per server: 128 requests of 512 KiB in flight, or 8 of 8 MiB.
DEFAULT_FRAME_BUFFER_BYTES = 64 * 1024 * 1024
_DISCARD = bytearray(4096)  # a closed connection's reads land here, unread
_STAMP = timeline.process_stamp()  # None unless RAFTMQ_TIMELINE is set (bench/w2_timeline.py)


class RequestContext(NamedTuple):
    """What a handler knows about the request besides its payload."""

    peer: str  # "host:port" of the client
    conn_id: int  # the server's number for the connection, for logs
    request_id: int
    method: int
    principal: str = ""  # who the connection authenticated as in its HELLO ("" = auth off)


Answer = bytes | memoryview | Parts  # what a handler answers (Parts: written as they are)
Handler = Callable[[memoryview, RequestContext], Awaitable[Answer]]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (the `server` extra), else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class LoopThread:
    """An event loop (uvloop when installed) running in one daemon thread: the I/O core under a
    threaded API. `run` blocks the calling thread on a coroutine; `FrameClient(loop=lt.loop)`
    gives `call_threadsafe` its loop."""

    def __init__(
        self, name: str = "raftmq-io", loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self.loop = loop or new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, _T], timeout_s: float | None = None) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- server -------------------------------------------------------------------------------------


class FrameServer:
    """Serves `handlers` (method id -> async handler) over the framed protocol.

    Each request runs as a task, so many are in flight per connection; past
    `max_inflight_per_conn` the server stops reading that socket (TCP pushes back on the client)
    instead of failing requests. At most `max_starts_per_turn` requests start per loop turn,
    taken from the waiting connections in turn: a flood (a thousand long polls in one burst)
    spreads over turns, so the loop's timers, its reads and the answers of requests already
    running are not held behind it, and no connection's burst starts before another's first
    request. A handler's
    RaftMQError answers an ERROR frame with its code; any other exception answers INTERNAL with
    an error id (the traceback is logged here only).
    """

    def __init__(
        self,
        handlers: Mapping[int, Handler],
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_inflight_per_conn: int = 256,
        max_pending_write_bytes: int = 16 * 1024 * 1024,
        max_connections: int = 4096,
        max_connections_per_address: int = 0,
        max_connections_per_user: int = 0,
        max_starts_per_turn: int = 32,
        frame_buffer_bytes: int = DEFAULT_FRAME_BUFFER_BYTES,
        hello_timeout_s: float = 5.0,
        idle_timeout_s: float = 30.0,
        ssl: ssl_lib.SSLContext | None = None,
        authenticate: Callable[[int, bytes], str] | None = None,
        batch_version: Callable[[], int] | None = None,
    ) -> None:
        if max_inflight_per_conn < 1:
            raise ValueError("max_inflight_per_conn must be >= 1")
        if max_starts_per_turn < 1:
            raise ValueError("max_starts_per_turn must be >= 1")
        self._handlers = dict(handlers)
        # Requests are read into buffers of this pool (common/frame.py FrameBuffers): one shared
        # scratch, and whole-frame buffers for large requests up to frame_buffer_bytes in all.
        self.buffers = FrameBuffers(frame_buffer_bytes)
        self._names = {m: getattr(h, "__qualname__", f"method {m}") for m, h in handlers.items()}
        self.max_frame_bytes = max_frame_bytes
        self.max_inflight_per_conn = max_inflight_per_conn
        self.max_starts_per_turn = max_starts_per_turn
        self._starts = 0  # requests started in this loop turn
        self._turn_ends: asyncio.Handle | None = None  # resets _starts in the next turn
        # Connections with a request they could start but for this turn's budget, oldest first.
        self._waiting: collections.deque[_ServerConn] = collections.deque()
        self.max_pending_write_bytes = max_pending_write_bytes
        self.max_connections = max_connections
        # One client host (or user) holds at most its share, so a flood of idle connections
        # from one place cannot fill max_connections for everyone (issue 27). 0 = no such cap.
        self.shares = FairShare(
            ShareLimits(max_connections, max_connections_per_address, max_connections_per_user)
        )
        self.hello_timeout_s = hello_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._ssl = ssl
        # (auth_method, auth) of a client's HELLO -> the principal, or a RaftMQError that refuses
        # the connection (common/auth_guard.py; issue 19). None: auth is off.
        self._authenticate = authenticate
        # The stored batch version the served broker group accepts now, told in each HELLO
        # answer (frame.server_hello); None: not a broker's data port, nothing to tell.
        self._batch_version = batch_version
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: set[_ServerConn] = set()
        self._conn_ids = itertools.count(1)
        self._sweep: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # every handler running, live conn or not
        self._closing = False
        self.rejected_connections = 0  # protocol errors, refused handshakes, over a share

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            lambda: _ServerConn(self), host, port, ssl=self._ssl, backlog=1024
        )
        self._schedule_sweep()
        _log.info("frame.server_started addr=%s:%d", host, self.port)

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def connections(self) -> int:
        return len(self._conns)

    @property
    def inflight(self) -> int:
        """Handler tasks running now (at most max_inflight_per_conn per live connection)."""
        return len(self._tasks)

    @property
    def backlog(self) -> int:
        """Requests decoded but not started: at most the frames of one read (<= 256 KiB of
        wire bytes) per connection, since reading stops as soon as the connection is full."""
        return sum(len(c.backlog) for c in self._conns)

    @property
    def write_buffer_bytes(self) -> int:
        """Answers written but not yet taken by the clients' sockets, over all connections."""
        return sum(c.write_buffer_bytes for c in self._conns)

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop accepting, send GOAWAY on every connection, let in-flight requests finish for up
        to `grace_s` (new ones are refused with a retryable error), then close everything."""
        if self._closing:
            return
        self._closing = True
        if self._sweep is not None:
            self._sweep.cancel()
        if self._server is not None:
            self._server.close()
        why = errors.BrokerUnavailableError(
            "the server is shutting down; requests not yet started were not processed: retry, "
            "on another node of the group if this one stays away"
        )
        conns = list(self._conns)
        for conn in conns:
            conn.goaway(why)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self._tasks and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for task in list(self._tasks):
            task.cancel()  # past the grace period: the client sees BrokerUnavailableError
        for conn in conns:
            conn.shutdown()
        if self._server is not None:
            await self._server.wait_closed()
        _log.info("frame.server_closed conns=%d", len(conns))

    async def __aenter__(self) -> FrameServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- the per-turn start budget --------------------------------------------------------------

    def may_start(self) -> bool:
        """Whether one more request may start in this loop turn (counts it if so).

        The window runs from one `_next_turn` to the next, and a task's first step runs in the
        turn after its start, so one turn runs at most twice the budget of first steps: the
        starts made after `_next_turn` in the turn before and those made before it in this one.
        Exact counting would need every start to wait for the pump's turn: one more loop turn
        on every request's way."""
        if self._starts >= self.max_starts_per_turn:
            return False
        self._starts += 1
        if self._turn_ends is None:
            assert self._loop is not None
            # A call_soon runs in the next loop turn, after that turn's due timers and I/O.
            self._turn_ends = self._loop.call_soon(self._next_turn)
        return True

    def wait_turn(self, conn: _ServerConn) -> None:
        """`conn` has a startable request left over from this turn's budget."""
        if not conn.waiting_turn:
            conn.waiting_turn = True
            self._waiting.append(conn)
        if self._turn_ends is None:
            assert self._loop is not None
            self._turn_ends = self._loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """A new turn's budget, spent on the waiting connections one request each, in turn."""
        self._turn_ends = None
        self._starts = 0
        waiting = self._waiting
        while waiting and self._starts < self.max_starts_per_turn:
            conn = waiting.popleft()
            if conn.start_next():
                waiting.append(conn)  # more to start: back of the line
            else:
                conn.waiting_turn = False
        if waiting and self._turn_ends is None:  # none started, yet some wait: next turn
            assert self._loop is not None
            self._turn_ends = self._loop.call_soon(self._next_turn)

    def _schedule_sweep(self) -> None:
        assert self._loop is not None
        every_s = max(0.05, min(0.5, self.hello_timeout_s / 4, self.idle_timeout_s / 4))
        self._sweep = self._loop.call_later(every_s, self._sweep_idle)

    def _sweep_idle(self) -> None:
        """Close connections that never said HELLO, or went silent (a live client pings)."""
        assert self._loop is not None
        now = self._loop.time()
        for conn in list(self._conns):
            conn.check_timeouts(now)
        self._schedule_sweep()


class _ServerConn(asyncio.BufferedProtocol):
    """One client connection. A BufferedProtocol: the socket reads into the decoder's buffers
    (a large request straight into a buffer of its own, which its handler gets), not into bytes
    objects that the decoder would copy again (issue 24)."""

    def __init__(self, server: FrameServer) -> None:
        assert server._loop is not None
        self._srv = server
        self._loop = server._loop
        self._max_inflight = server.max_inflight_per_conn
        self._decoder = FrameDecoder(
            server.max_frame_bytes, expect_hello=True, buffers=server.buffers
        )
        self._transport: asyncio.Transport | None = None
        self.id = next(server._conn_ids)
        self.peer = "?"
        self._peer_max_frame = 0  # set by the client's HELLO
        self._opened_at = self._loop.time()
        self._last_rx = self._opened_at
        self.inflight = 0
        self.backlog: collections.deque[Frame] = collections.deque()
        self.waiting_turn = False  # in the server's line for the next turn's start budget
        self._out: _Out = []
        self._flush_scheduled = False
        self._reading = True
        self._write_paused = False
        self._goaway_sent = False
        self._closed = False
        self._last_request_id = 0
        self.principal = ""
        self._host = ""  # set when admitted: the FairShare unit this connection holds
        self._user = ""  # set when its HELLO's user was admitted

    @property
    def write_buffer_bytes(self) -> int:
        pending = sum(len(p) for p in self._out)
        if self._transport is not None and not self._transport.is_closing():
            pending += self._transport.get_write_buffer_size()
        return pending

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        transport.set_write_buffer_limits(high=self._srv.max_pending_write_bytes)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if self._srv._closing:
            self._refuse(errors.BrokerUnavailableError("the server is shutting down; retry"))
            return
        host = client_host(peer if isinstance(peer, tuple) else self.peer)
        refused = self._srv.shares.admit(host)
        if refused is not None:
            _log.info("frame.share_refused peer=%s reason=%s", self.peer, refused.message)
            self._refuse(refused)
            return
        self._host = host
        self._srv._conns.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._closed:
            return memoryview(_DISCARD)  # what arrives after we closed is dropped
        try:
            return self._decoder.get_buffer()
        except ProtocolError:  # the stream broke; its connection is closing
            return memoryview(_DISCARD)

    def buffer_updated(self, nbytes: int) -> None:
        if self._closed:
            return
        self._last_rx = self._loop.time()
        if _STAMP is not None:
            _STAMP("server.read", nbytes)
        try:
            frames = self._decoder.buffer_updated(nbytes)
        except ProtocolError as exc:
            self._protocol_error(exc)
            return
        for frame in frames:
            kind = frame.kind
            if kind is Kind.REQUEST:
                self._on_request(frame)
            elif kind is Kind.PING:
                self._send(Kind.PONG, frame.request_id, b"")
            elif kind is Kind.HELLO:
                self._on_hello(frame)
            elif kind is Kind.PONG or kind is Kind.GOAWAY:
                pass  # a client going away just closes; its GOAWAY needs no answer
            else:
                self._protocol_error(ProtocolError(f"a client sent a {kind.name} frame"))
            if self._closed:
                return

    def eof_received(self) -> bool | None:
        try:
            self._decoder.feed_eof()
        except ProtocolError as exc:
            _log.info("frame.truncated conn=%d peer=%s reason=%s", self.id, self.peer, exc)
        return None  # close our side too: a client that stopped sending is leaving

    def connection_lost(self, exc: Exception | None) -> None:
        # Handlers still running finish (a produce is not cut half-way); their answers are
        # dropped. close() cancels whatever outlives the grace period.
        self._closed = True
        self._leave()
        self.backlog.clear()
        self._out = []

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    # -- frames

    def _on_hello(self, frame: Frame) -> None:
        try:
            hello = decode_hello(frame.payload)
        except ProtocolError as exc:
            self._protocol_error(exc)
            return
        if hello.version != PROTOCOL_VERSION:
            self._refuse(
                errors.UnsupportedError(
                    f"framed protocol version {hello.version} is not supported; this server "
                    f"speaks version {PROTOCOL_VERSION}"
                )
            )
            return
        if self._srv._authenticate is not None:
            try:  # once per connection; each request is then authorized against the principal
                self.principal = self._srv._authenticate(hello.auth_method, hello.auth)
            except errors.RaftMQError as exc:
                self._refuse(exc)
                return
            if self.principal:
                refused = self._srv.shares.admit_user(self.principal)
                if refused is not None:
                    self._refuse(refused)
                    return
                self._user = self.principal
        elif hello.auth_method not in (AUTH_NONE, AUTH_HMAC_SHA1):
            self._refuse(
                errors.UnsupportedError(
                    f"auth method {hello.auth_method} is not supported by this server"
                )
            )
            return
        self._peer_max_frame = hello.max_frame_bytes
        srv = self._srv
        version = srv._batch_version() if srv._batch_version is not None else 0
        self._send_raw(encode_hello(server_hello(srv.max_frame_bytes, version)))

    def _on_request(self, frame: Frame) -> None:
        self._last_request_id = frame.request_id
        if self._goaway_sent:
            self._send_error(
                frame.request_id,
                errors.BrokerUnavailableError(
                    "the server is shutting down and did not process this request; retry on "
                    "another node of the group"
                ),
            )
        elif self.inflight >= self._max_inflight or self.backlog:
            self.backlog.append(frame)
            self._update_reading()
        elif not self._srv.may_start():
            self.backlog.append(frame)
            self._srv.wait_turn(self)
            self._update_reading()
        else:
            self._start(frame)

    def start_next(self) -> bool:
        """Start this connection's oldest waiting request if it may (the server's turn budget
        was checked); whether it has another it could start at once."""
        if self._closed or not self.backlog:
            return False
        if self.inflight < self._max_inflight and self._srv.may_start():
            self._start(self.backlog.popleft())
            self._update_reading()
        return bool(self.backlog) and self.inflight < self._max_inflight

    def _start(self, frame: Frame) -> None:
        handler = self._srv._handlers.get(frame.method)
        if handler is None:
            self._send_error(
                frame.request_id,
                errors.UnsupportedError(f"method {frame.method} is not served on this port"),
            )
            return
        self.inflight += 1
        task = self._loop.create_task(self._run(handler, frame))
        self._srv._tasks.add(task)
        task.add_done_callback(self._task_done)
        if self.inflight >= self._max_inflight:
            self._update_reading()

    async def _run(self, handler: Handler, frame: Frame) -> None:
        rid = frame.request_id
        ctx = RequestContext(self.peer, self.id, rid, frame.method, self.principal)
        try:
            result = await handler(frame.payload, ctx)
            if not isinstance(result, bytes | bytearray | memoryview | Parts):
                raise TypeError(f"handler returned {type(result).__name__}, not bytes")
        except errors.RaftMQError as exc:
            self._send_error(rid, exc)
            return
        except Exception as exc:  # anything else is a bug: logged with its traceback, not sent
            self._send_error(rid, errors.internal_error(self._srv._names[frame.method], exc))
            return
        if len(result) + _RESPONSE_OVERHEAD > self._peer_max_frame:
            self._send_error(
                rid, errors.MessageTooLargeError.for_size(len(result), self._peer_max_frame)
            )
            return
        self._send(Kind.RESPONSE, rid, result)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._srv._tasks.discard(task)
        self.inflight -= 1
        while self.backlog and self.inflight < self._max_inflight and not self._closed:
            if not self._srv.may_start():
                self._srv.wait_turn(self)
                break
            self._start(self.backlog.popleft())
        self._update_reading()

    def _update_reading(self) -> None:
        """Read while there is room for more work and the client takes its answers."""
        transport = self._transport
        if transport is None or self._closed:
            return
        want = not self._write_paused and not self.backlog and self.inflight < self._max_inflight
        if want and not self._reading:
            self._reading = True
            transport.resume_reading()
        elif not want and self._reading:
            self._reading = False
            transport.pause_reading()

    # -- writing: a loop iteration's first answer leaves at once, the rest of the iteration's
    # answers in one writelines at its end (a lone answer does not wait a loop turn, in which
    # another thread of the broker may take the GIL: bench/w2_timeline.py)

    def _send(self, kind: Kind, request_id: int, payload: BytesLike | Parts) -> None:
        if self._closed:
            return
        frame_into(self._out, kind, request_id, payload)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._write_out()
            self._loop.call_soon(self._flush)

    def _send_error(self, request_id: int, exc: errors.RaftMQError) -> None:
        self._send(Kind.ERROR, request_id, error_body(exc))

    def _send_raw(self, data: bytes) -> None:
        if self._closed:
            return
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._write_out()

    def _write_out(self) -> None:
        out, self._out = self._out, []
        if out and self._transport is not None and not self._transport.is_closing():
            if _STAMP is not None:  # before the write: the reader may run before it returns
                _STAMP("server.write", len(out))
            self._transport.writelines(out)

    # -- ending

    def goaway(self, why: errors.RaftMQError) -> None:
        """Graceful: refuse what has not started, tell the client, keep answering in-flight."""
        if self._closed or self._goaway_sent:
            return
        self._goaway_sent = True
        while self.backlog:
            frame = self.backlog.popleft()
            self._send_error(frame.request_id, why)
        self._send(Kind.GOAWAY, self._last_request_id, error_body(why))
        self._update_reading()

    def shutdown(self) -> None:
        """After the grace period: flush what is answered, close."""
        self._flush()
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    def check_timeouts(self, now: float) -> None:
        if not self._peer_max_frame and now - self._opened_at > self._srv.hello_timeout_s:
            self._refuse(
                errors.InvalidArgumentError(
                    f"no HELLO within {self._srv.hello_timeout_s}s of connecting"
                )
            )
        elif not self._reading:
            # We stopped reading (backpressure), so the client's pings go unread: show it we
            # are alive, or its keepalive would call us dead while long requests run.
            self._send(Kind.PING, 0, b"")
        elif now - self._last_rx > self._srv.idle_timeout_s:
            _log.info("frame.idle_close conn=%d peer=%s", self.id, self.peer)
            self._fail(
                errors.BrokerUnavailableError(
                    f"no frame for {self._srv.idle_timeout_s}s (clients ping); reconnect"
                )
            )

    def _protocol_error(self, exc: ProtocolError) -> None:
        _log.warning(
            "frame.protocol_error conn=%d peer=%s reason=%s", self.id, self.peer, exc.message
        )
        self._refuse(exc.to_error())

    def _refuse(self, why: errors.RaftMQError) -> None:
        self._srv.rejected_connections += 1
        self._fail(why)

    def _fail(self, why: errors.RaftMQError) -> None:
        """GOAWAY with the reason, then close this connection only."""
        if self._closed:
            return
        self._send(Kind.GOAWAY, self._last_request_id, error_body(why))
        self._flush()
        self._closed = True
        self._leave()
        if self._transport is not None:
            self._transport.close()  # writes what is buffered, then closes

    def _leave(self) -> None:
        """Give back this connection's shares (once, however it ended)."""
        self._srv._conns.discard(self)
        if self._host:
            self._srv.shares.release(self._host)
            self._host = ""
        if self._user:
            self._srv.shares.release_user(self._user)
            self._user = ""


# ---- client -------------------------------------------------------------------------------------

_AnyFuture = asyncio.Future[bytes] | concurrent.futures.Future[bytes]


class _Call:
    __slots__ = ("conn", "fut", "method", "timeout_s", "timer")

    def __init__(
        self,
        fut: _AnyFuture,
        timer: asyncio.TimerHandle,
        conn: _ClientConn,
        method: int,
        timeout_s: float,
    ) -> None:
        self.fut = fut
        self.timer = timer
        self.conn = conn
        self.method = method
        self.timeout_s = timeout_s


def _resolve(fut: _AnyFuture, result: bytes) -> None:
    if not fut.done():
        # cancelled by its waiter in another thread meanwhile: nobody wants it
        with contextlib.suppress(asyncio.InvalidStateError, concurrent.futures.InvalidStateError):
            fut.set_result(result)


def _reject(fut: _AnyFuture, exc: BaseException) -> None:
    if not fut.done():
        with contextlib.suppress(asyncio.InvalidStateError, concurrent.futures.InvalidStateError):
            fut.set_exception(exc)


# A call's failure says whether its request could have reached the server, which a writer needs
# to tell "surely not stored" from "maybe stored": the transport's own failures before a request
# left this process carry details[NOT_SENT] = "1"; those after it was handed to a connection
# (lost connection, no answer in time) carry details["request_id"]; an ERROR frame's error is
# the server's verdict, with the server's details unchanged.
NOT_SENT = "not_sent"


def _unsent(exc: errors.RaftMQError) -> errors.RaftMQError:
    exc.details[NOT_SENT] = "1"
    return exc


def was_never_sent(exc: BaseException) -> bool:
    """True when a FrameClient call failed before its request left this process."""
    return isinstance(exc, errors.RaftMQError) and exc.details.get(NOT_SENT) == "1"


class FrameClient:
    """One framed connection to one server, opened on demand and reopened after a drop.

    `await call(method, payload, timeout_s)` multiplexes any number of requests (answers come
    back in any order, matched by request id); calls made in one loop iteration leave in one
    `writelines`. `call_threadsafe` does the same from any thread. When the connection drops
    (or its keepalive pings go unanswered), pending calls fail with BrokerUnavailableError.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        ssl: ssl_lib.SSLContext | None = None,
        server_hostname: str | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_pending_calls: int = 4096,
        max_pending_write_bytes: int = 16 * 1024 * 1024,
        connect_timeout_s: float = 3.0,
        keepalive_interval_s: float = 1.0,
        keepalive_timeout_s: float = 3.0,
        auth: Callable[[], tuple[int, bytes]] | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.auth = auth  # the HELLO's (auth_method, auth), made afresh per connection
        self.address = f"{host}:{port}"
        self._loop = loop
        self._ssl = ssl
        self._server_hostname = server_hostname
        self.max_frame_bytes = max_frame_bytes
        self.max_pending_calls = max_pending_calls
        self.max_pending_write_bytes = max_pending_write_bytes
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_interval_s = keepalive_interval_s
        self.keepalive_timeout_s = keepalive_timeout_s
        self._conn: _ClientConn | None = None
        self._connecting: asyncio.Task[_ClientConn] | None = None
        self._pending: dict[int, _Call] = {}
        self._next_id = 0
        self._closed = False
        # call_threadsafe: threads append here and wake the loop once per batch.
        self._inbox: collections.deque[tuple[int, Payload, float, _AnyFuture]] = collections.deque()
        self._inbox_lock = threading.Lock()
        self._inbox_wakeup = False
        # calls from threads that wait for a connection or for room in the socket, in order
        # calls waiting for a connection: (method, payload, deadline on the loop's clock, future)
        self._held: list[tuple[int, Payload, float, _AnyFuture]] = []
        self._held_task: asyncio.Task[None] | None = None
        self.late_answers = 0  # answers that came after their call timed out (dropped)
        # The stored batch version the server's latest HELLO answer said its group accepts (0:
        # not said, or not connected yet); the producer lowers it when a batch is refused.
        self.batch_version = 0

    @property
    def pending_calls(self) -> int:
        return len(self._pending)

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.ready

    async def call(self, method: int, payload: Payload, timeout_s: float) -> bytes:
        """Send one request and wait for its answer; a RaftMQError of the table on failure
        (`was_never_sent(exc)` when the request surely never left this process)."""
        try:
            loop = self._bind()
            conn = self._conn
            if conn is None or not conn.ready:
                t0 = loop.time()
                conn = await self._connect(min(self.connect_timeout_s, timeout_s))
                timeout_s = max(0.0, timeout_s - (loop.time() - t0))
            if conn.write_paused:  # the socket takes less than we write: wait, within the timeout
                t0 = loop.time()
                try:
                    await asyncio.wait_for(conn.writable(), timeout_s)
                except TimeoutError:
                    raise errors.RequestTimeoutError(
                        f"the connection to {self.address} stayed full of unsent requests "
                        f"(max_pending_write_bytes) for {timeout_s:.3g}s; nothing was sent"
                    ) from None
                timeout_s = max(0.0, timeout_s - (loop.time() - t0))
        except errors.RaftMQError as exc:
            _unsent(exc)
            raise
        fut: asyncio.Future[bytes] = loop.create_future()
        self._submit(conn, method, payload, timeout_s, fut)
        return await fut

    def call_threadsafe(
        self, method: int, payload: Payload, timeout_s: float
    ) -> concurrent.futures.Future[bytes]:
        """`call` from any thread; the client's loop must run elsewhere (e.g. a LoopThread)."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("FrameClient has no loop: pass loop= or make one call on it first")
        cfut: concurrent.futures.Future[bytes] = concurrent.futures.Future()
        self._inbox.append((method, payload, timeout_s, cfut))
        with self._inbox_lock:
            if self._inbox_wakeup:
                return cfut  # a wake-up is scheduled and will take this one too
            self._inbox_wakeup = True
        loop.call_soon_threadsafe(self._drain_inbox)
        return cfut

    def call_on_loop(
        self, method: int, payload: Payload, timeout_s: float
    ) -> concurrent.futures.Future[bytes]:
        """`call_threadsafe` from the client's own loop thread: handed to the connection now,
        without a wake-up of the loop (the caller is already on it)."""
        cfut: concurrent.futures.Future[bytes] = concurrent.futures.Future()
        self._inbox.append((method, payload, timeout_s, cfut))
        self._drain_inbox()
        return cfut

    async def connect(self) -> None:
        """Open the connection now instead of on the first call."""
        self._bind()
        await self._connect(self.connect_timeout_s)

    async def close(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort(errors.BrokerUnavailableError(f"the client of {self.address} was closed"))
        self._fail_all(
            None, errors.BrokerUnavailableError(f"the client of {self.address} was closed")
        )

    async def __aenter__(self) -> FrameClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals (loop thread only)

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("a FrameClient serves one event loop")
        if self._closed:
            raise errors.BrokerUnavailableError(f"the client of {self.address} was closed")
        return loop

    async def _connect(self, timeout_s: float) -> _ClientConn:
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._open())
            self._connecting.add_done_callback(self._connect_done)
        try:
            return await asyncio.wait_for(asyncio.shield(self._connecting), timeout_s)
        except TimeoutError:
            raise errors.BrokerUnavailableError(
                f"could not connect to {self.address} within {timeout_s:.3g}s"
            ) from None

    def _connect_done(self, task: asyncio.Task[_ClientConn]) -> None:
        self._connecting = None
        if not task.cancelled():
            task.exception()  # retrieved here so an unawaited failure is not logged as lost

    async def _open(self) -> _ClientConn:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise errors.BrokerUnavailableError(f"the client of {self.address} was closed")
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _ClientConn(self, loop),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self._server_hostname if self._ssl else None,
                ),
                self.connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            tls_hint = errors.TLS_HINT if isinstance(exc, ssl_lib.SSLError) else ""
            raise errors.BrokerUnavailableError(
                f"cannot connect to {self.address}: {exc or type(exc).__name__}{tls_hint}"
            ) from exc
        try:
            await asyncio.wait_for(asyncio.shield(conn.hello), self.connect_timeout_s)
        except TimeoutError:
            why = errors.BrokerUnavailableError(
                f"{self.address} accepted the connection but sent no HELLO within "
                f"{self.connect_timeout_s}s"
            )
            conn.abort(why)
            raise why from None
        except errors.RaftMQError as exc:  # refused (GOAWAY: version, load) or lost meanwhile
            conn.abort(exc)
            raise
        if self._closed:
            conn.abort(errors.BrokerUnavailableError("client closed"))
            raise errors.BrokerUnavailableError(f"the client of {self.address} was closed")
        self._conn = conn
        return conn

    def _new_id(self) -> int:
        rid = self._next_id
        while True:
            rid = rid + 1 if rid < MAX_REQUEST_ID else 1
            if rid not in self._pending:  # 4 billion ids: a wrap meeting a pending one is rare
                self._next_id = rid
                return rid

    def _submit(
        self,
        conn: _ClientConn,
        method: int,
        payload: Payload,
        timeout_s: float,
        fut: _AnyFuture,
    ) -> None:
        if not 0 <= method <= MAX_METHOD:
            _reject(
                fut,
                _unsent(errors.InvalidArgumentError(f"method id {method} outside 0..{MAX_METHOD}")),
            )
            return
        if len(self._pending) >= self.max_pending_calls:
            _reject(
                fut,
                _unsent(
                    errors.QueueFullError(
                        f"{len(self._pending)} calls already wait on {self.address} "
                        f"(max_pending_calls); back off and retry"
                    )
                ),
            )
            return
        if not conn.ready:  # lost or sent GOAWAY while this call waited
            _reject(
                fut,
                _unsent(
                    errors.BrokerUnavailableError(
                        f"the connection to {self.address} closed before the request was sent; "
                        "retry"
                    )
                ),
            )
            return
        if len(payload) + _REQUEST_OVERHEAD > conn.peer_max_frame:
            too_large = errors.MessageTooLargeError.for_size(len(payload), conn.peer_max_frame)
            _reject(fut, _unsent(too_large))
            return
        rid = self._new_id()
        timer = conn.loop.call_later(timeout_s, self._on_timeout, rid)
        self._pending[rid] = _Call(fut, timer, conn, method, timeout_s)
        conn.send_request(rid, method, payload)

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            self._inbox_wakeup = False
        items = []
        inbox = self._inbox
        while inbox:
            items.append(inbox.popleft())
        if not items:
            return
        conn = self._conn
        if self._held_task is None and conn is not None and conn.ready and not conn.write_paused:
            for method, payload, timeout_s, fut in items:
                self._submit(conn, method, payload, timeout_s, fut)
            return
        # Not connected, or the socket is full: hold them, in order, behind any held already.
        # A held call keeps its own timeout: connecting (up to connect_timeout_s) must not
        # stretch it, so each one expires on its own, as never sent.
        assert self._loop is not None
        now = self._loop.time()
        for method, payload, timeout_s, fut in items:
            self._held.append((method, payload, now + timeout_s, fut))
            self._loop.call_at(now + timeout_s, self._expire_held, fut, timeout_s)
        if self._held_task is None:
            self._held_task = self._loop.create_task(self._submit_held())

    async def _submit_held(self) -> None:
        try:
            while self._held:
                try:
                    conn = self._conn
                    if conn is None or not conn.ready:
                        conn = await self._connect(self.connect_timeout_s)
                    if conn.write_paused:
                        now = asyncio.get_running_loop().time()
                        wait_s = max(0.0, max(d for _, _, d, _ in self._held) - now)
                        try:
                            await asyncio.wait_for(conn.writable(), wait_s)
                        except TimeoutError:
                            raise errors.RequestTimeoutError(
                                f"the connection to {self.address} stayed full of unsent "
                                f"requests for {wait_s:.3g}s; nothing was sent"
                            ) from None
                except errors.RaftMQError as exc:
                    held, self._held = self._held, []
                    for *_, fut in held:
                        _reject(fut, _unsent(exc))
                    return
                held, self._held = self._held, []
                now = asyncio.get_running_loop().time()
                for method, payload, deadline, fut in held:
                    if not fut.done():  # not expired while held
                        self._submit(conn, method, payload, max(0.0, deadline - now), fut)
        finally:
            self._held_task = None

    def _expire_held(self, fut: _AnyFuture, timeout_s: float) -> None:
        if fut.done() or not any(f is fut for *_, f in self._held):
            return
        self._held = [h for h in self._held if h[3] is not fut]
        _reject(
            fut,
            _unsent(
                errors.RequestTimeoutError(
                    f"no connection to {self.address} within the call's {timeout_s:.3g}s; "
                    "nothing was sent"
                )
            ),
        )

    def _on_timeout(self, rid: int) -> None:
        call = self._pending.pop(rid, None)
        if call is not None:
            _reject(
                call.fut,
                errors.RequestTimeoutError(
                    f"no answer from {self.address} to method {call.method} within "
                    f"{call.timeout_s:.3g}s; the outcome is unknown (a late answer is dropped)",
                    details={"request_id": str(rid)},
                ),
            )

    def _on_answer(self, frame: Frame) -> None:
        call = self._pending.pop(frame.request_id, None)
        if call is None:
            self.late_answers += 1
            return
        call.timer.cancel()
        if frame.kind is Kind.RESPONSE:
            _resolve(call.fut, bytes(frame.payload))
        else:
            try:
                exc = decode_error(frame.payload)
            except ProtocolError as perr:
                exc = errors.InternalError(f"unreadable ERROR frame from {self.address}: {perr}")
            _reject(call.fut, exc)

    def _on_goaway(self, conn: _ClientConn) -> None:
        if self._conn is conn:
            self._conn = None  # new calls open a new connection; pending ones still get answers

    def _conn_lost(self, conn: _ClientConn, why: errors.RaftMQError) -> None:
        if self._conn is conn:
            self._conn = None
        self._fail_all(conn, why)

    def _fail_all(self, conn: _ClientConn | None, why: errors.RaftMQError) -> None:
        for rid in [r for r, c in self._pending.items() if conn is None or c.conn is conn]:
            call = self._pending.pop(rid)
            call.timer.cancel()
            _reject(call.fut, type(why)(why.message, details={"request_id": str(rid)}))


class _ClientConn(asyncio.Protocol):
    def __init__(self, client: FrameClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self.loop = loop
        self._decoder = FrameDecoder(client.max_frame_bytes, expect_hello=True)
        self._transport: asyncio.Transport | None = None
        self.hello: asyncio.Future[Hello] = loop.create_future()
        self.ready = False
        self.peer_max_frame = 0
        self.write_paused = False
        self._write_waiters: list[asyncio.Future[None]] = []
        self._out: _Out = []
        self._flush_scheduled = False
        self._last_rx = loop.time()
        self._ping_seq = 0
        self._keepalive: asyncio.TimerHandle | None = None
        self._why: errors.RaftMQError | None = None
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        transport.set_write_buffer_limits(high=self._client.max_pending_write_bytes)
        method, auth = self._client.auth() if self._client.auth is not None else (AUTH_NONE, b"")
        transport.write(
            encode_hello(
                Hello(max_frame_bytes=self._client.max_frame_bytes, auth_method=method, auth=auth)
            )
        )

    def data_received(self, data: bytes) -> None:
        self._last_rx = self.loop.time()
        if _STAMP is not None:
            _STAMP("client.read", len(data))
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            _log.warning("frame.protocol_error server=%s reason=%s", self._client.address, exc)
            self.abort(
                errors.BrokerUnavailableError(
                    f"{self._client.address} broke the framed protocol ({exc.message}); "
                    "the connection was closed"
                )
            )
            return
        client = self._client
        for frame in frames:
            kind = frame.kind
            if kind is Kind.RESPONSE or kind is Kind.ERROR:
                client._on_answer(frame)
            elif kind is Kind.PONG:
                pass
            elif kind is Kind.PING:
                self._send(Kind.PONG, frame.request_id)
            elif kind is Kind.HELLO:
                self._on_hello(frame)
            elif kind is Kind.GOAWAY:
                self._on_goaway(frame)
            else:
                self.abort(
                    errors.BrokerUnavailableError(
                        f"{client.address} sent a {kind.name} frame; the connection was closed"
                    )
                )
            if self._lost:
                return

    def _on_hello(self, frame: Frame) -> None:
        try:
            hello = decode_hello(frame.payload)
        except ProtocolError as exc:
            self.abort(errors.BrokerUnavailableError(f"bad HELLO from {self._client.address}"))
            if not self.hello.done():
                self.hello.set_exception(errors.BrokerUnavailableError(f"bad HELLO: {exc.message}"))
            return
        self.peer_max_frame = hello.max_frame_bytes
        self._client.batch_version = batch_version_of(hello)
        self.ready = True
        if not self.hello.done():
            self.hello.set_result(hello)
        self._schedule_keepalive()

    def _on_goaway(self, frame: Frame) -> None:
        try:
            why = decode_error(frame.payload)
        except ProtocolError:
            why = errors.BrokerUnavailableError(f"{self._client.address} sent GOAWAY")
        self.ready = False
        if not self.hello.done():  # the handshake was refused (version, auth, load)
            self.hello.set_exception(why)
        # Pending calls still get their answers; whatever is left when the server closes
        # fails with BrokerUnavailableError carrying the server's reason.
        self._why = errors.BrokerUnavailableError(
            f"{self._client.address} closed the connection before answering ({why.message})"
        )
        self._client._on_goaway(self)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.ready = False
        if self._keepalive is not None:
            self._keepalive.cancel()
        why = self._why or errors.BrokerUnavailableError(
            f"the connection to {self._client.address} was lost"
            + (f": {exc}" if exc else " (closed by the server)")
            + "; retry, possibly on another node"
        )
        if not self.hello.done():
            self.hello.set_exception(why)
        for waiter in self._write_waiters:
            if not waiter.done():
                waiter.set_exception(why)
        self._write_waiters.clear()
        self._client._conn_lost(self, why)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        for waiter in self._write_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._write_waiters.clear()

    async def writable(self) -> None:
        if self.write_paused:
            waiter: asyncio.Future[None] = self.loop.create_future()
            self._write_waiters.append(waiter)
            await waiter

    def abort(self, why: errors.RaftMQError) -> None:
        if self._why is None:
            self._why = why
        self.ready = False
        if self._transport is not None:
            self._transport.abort()  # connection_lost follows and fails the pending calls

    # -- keepalive: detect a dead or frozen server within interval + timeout

    def _schedule_keepalive(self) -> None:
        self._keepalive = self.loop.call_later(
            self._client.keepalive_interval_s, self._keepalive_tick
        )

    def _keepalive_tick(self) -> None:
        if self._lost:
            return
        client = self._client
        silent_s = self.loop.time() - self._last_rx
        if silent_s >= client.keepalive_timeout_s:
            _log.warning(
                "frame.keepalive_timeout server=%s silent_s=%.1f", client.address, silent_s
            )
            self.abort(
                errors.BrokerUnavailableError(
                    f"no frame from {client.address} for {silent_s:.1f}s (keepalive timeout "
                    f"{client.keepalive_timeout_s}s): the server is dead, frozen or unreachable"
                )
            )
            return
        if silent_s >= client.keepalive_interval_s * 0.9:
            self._ping_seq = self._ping_seq + 1 if self._ping_seq < MAX_REQUEST_ID else 1
            self._send(Kind.PING, self._ping_seq)
        self._schedule_keepalive()

    # -- writing: a loop iteration's first request leaves at once, the rest of the iteration's
    # requests in one writelines at its end (nats.py's flusher; a lone synchronous send does
    # not wait a loop turn: bench/w2_timeline.py)

    def send_request(self, rid: int, method: int, payload: Payload) -> None:
        request_into(self._out, rid, method, payload)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._write_out()
            self.loop.call_soon(self._flush)

    def _send(self, kind: Kind, rid: int, payload: bytes = b"") -> None:
        frame_into(self._out, kind, rid, payload)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._write_out()
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._write_out()

    def _write_out(self) -> None:
        out, self._out = self._out, []
        if out and self._transport is not None and not self._transport.is_closing():
            if _STAMP is not None:  # before the write: the reader may run before it returns
                _STAMP("client.write", len(out))
            self._transport.writelines(out)
