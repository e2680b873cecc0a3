"""One framed data-path connection pool per SDK client: a LoopThread (uvloop when installed), or
the caller's own running loop (`use_loop`, the asyncio face), and one multiplexed FrameClient per
node's data address, bounded, least recently used closed first.

Calls are non-blocking: `submit` returns a Future of the parsed response that completes on the
pool's loop thread, so its done-callbacks must never block (no route look-ups, no waiting on
another call, no user code): they hand such work to a thread of their own. Nothing here retries.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from google.protobuf.message import DecodeError, Message

from raftmq.common import stored_batch, tls
from raftmq.common.auth import Credentials
from raftmq.common.auth_client import client_signer
from raftmq.common.data_api import PAYLOADS, DataMethod
from raftmq.common.errors import (
    BrokerUnavailableError,
    DiskPressureError,
    InternalError,
    InvalidArgumentError,
    NotLeaderError,
    OutOfOrderSequenceError,
    RaftMQError,
    RequestTimeoutError,
)
from raftmq.common.frame import Payload
from raftmq.common.transport import NOT_SENT, FrameClient, LoopThread, was_never_sent

log = logging.getLogger("raftmq.client")

DEFAULT_MAX_CONNECTIONS = 256  # data addresses with an open client (one connection each)
CLOSE_TIMEOUT_S = 5.0
BLOCKING_MARGIN_S = 5.0  # a blocking call waits this much past its timeout (the timer fires first)


def split_address(address: str) -> tuple[str, int]:
    """ "host:port" (IPv6 hosts in brackets) -> (host, port); InvalidArgumentError otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(f"data address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def no_data_address(address: str) -> BrokerUnavailableError:
    """A node whose route names no framed data address: the SDK sends and pulls only there."""
    return BrokerUnavailableError(
        f"broker {address} advertises no data address (started with --data-listen off?); the "
        "SDK sends and pulls over the framed data path only: restart it with --data-listen"
    )


def may_have_stored(err: RaftMQError) -> bool:
    """The framed path's twin of producer/retry.py's rule: False only when the attempt surely
    stored nothing: the transport failed it before the request left this process (no
    connection, refused handshake, closed before sending: `was_never_sent`), or a node refused
    it as not the leader or as out of order (refused unstored). A lost connection or a missing
    answer after the request was handed to the socket, and any other verdict of the server, may
    have reached the log."""
    # DISK_PRESSURE, like NOT_LEADER, is answered before anything is proposed.
    return not (
        was_never_sent(err)
        or isinstance(err, (NotLeaderError, OutOfOrderSequenceError, DiskPressureError))
    )


class DataPool:
    """Thread-safe. The loop thread starts on the first call, so a client whose nodes offer no
    data address never starts one; `close()` fails what is pending and stops it."""

    def __init__(
        self,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        name: str = "raftmq-data",
        tls_config: tls.Tls | Any | None = tls.PROCESS,
        credentials: Credentials | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self._ssl = tls.client_ssl(tls_config)  # one context for every connection of the pool
        # issue 19: each connection's HELLO is signed (once per connection)
        self._signer = client_signer(credentials)
        self._max = max_connections
        self._name = name
        self._lock = threading.Lock()
        self._clients: collections.OrderedDict[str, FrameClient] = collections.OrderedDict()
        self._loop_thread: LoopThread | None = None
        # The caller's loop (use_loop) and the thread that runs it: then no LoopThread starts.
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._own_thread = 0
        self._closing: asyncio.Task[None] | None = None
        self._closed = False
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._clients)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The pool's event loop (started on first use)."""
        with self._lock:
            return self._loop_locked()

    def _loop_locked(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise BrokerUnavailableError("the client was closed")
        if self._own_loop is not None:
            return self._own_loop
        if self._loop_thread is None:
            self._loop_thread = LoopThread(self._name)
        return self._loop_thread.loop

    def use_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run every connection on `loop`, the running loop of the calling thread (the asyncio
        face: sends and answers never cross a thread). Once, before the first call; the pool
        then never starts a LoopThread, and its loop must outlive it (close the pool first)."""
        with self._lock:
            if self._own_loop is loop:
                return
            if self._own_loop is not None or self._loop_thread is not None:
                raise InvalidArgumentError(
                    "this client already runs on another event loop (or its own I/O thread): "
                    "use one client per loop, made inside the loop that uses it"
                )
            self._own_loop = loop
            self._own_thread = threading.get_ident()

    def on_loop_thread(self) -> bool:
        own = self._own_loop
        if own is not None:  # the caller's loop: this thread while it runs that loop
            return threading.get_ident() == self._own_thread and own.is_running()
        lt = self._loop_thread
        return lt is not None and threading.current_thread() is lt._thread

    def client(self, data_address: str) -> FrameClient:
        """The FrameClient of `data_address`, created on first use; past max_connections the
        least recently used one is closed (its pending calls fail as a lost connection)."""
        with self._lock:
            fc = self._clients.get(data_address)
            if fc is not None:
                self._clients.move_to_end(data_address)
                return fc
            loop = self._loop_locked()
            host, port = split_address(data_address)
            fc = FrameClient(
                host,
                port,
                loop=loop,
                ssl=self._ssl,
                server_hostname=host,
                auth=self._signer.hello_auth if self._signer is not None else None,
            )
            self._clients[data_address] = fc
            evicted = []
            while len(self._clients) > self._max:
                evicted.append(self._clients.popitem(last=False)[1])
        for old in evicted:
            self.evictions += 1
            log.info("data_pool.evicted address=%s", old.address)
            asyncio.run_coroutine_threadsafe(old.close(), loop)
        return fc

    def batch_version(self, data_address: str) -> int:
        """The stored batch version to encode a batch for `data_address` in: what its latest
        HELLO answer said its broker group accepts (common/frame.server_hello), never past what
        this SDK writes; the oldest before an answer, or from a server of before."""
        with self._lock:
            fc = self._clients.get(data_address)
        said = fc.batch_version if fc is not None else 0
        return min(said, stored_batch.VERSION) if said else stored_batch.OLDEST_VERSION

    def lower_batch_version(self, data_address: str, version: int) -> None:
        """A batch was refused for its version: encode in `version` for `data_address` until
        its next HELLO answer says otherwise."""
        with self._lock:
            fc = self._clients.get(data_address)
        if fc is not None:
            fc.batch_version = max(stored_batch.OLDEST_VERSION, version)

    def submit_raw(
        self, data_address: str, method: DataMethod, payload: Payload, timeout_s: float
    ) -> Future[bytes]:
        """Send a binary payload (SEND_STORED, or a serialized request for submit); a Future of
        the answer's bytes, failing with the typed RaftMQError. Never blocks; the Future
        completes on the loop thread."""
        out: Future[bytes] = Future()
        try:
            fc = self.client(data_address)
        except RaftMQError as exc:
            exc.details.setdefault(NOT_SENT, "1")  # never left: see may_have_stored
            out.set_exception(exc)
            return out
        if self.on_loop_thread():  # a done-callback's next call: no wake-up needed
            return fc.call_on_loop(int(method), payload, timeout_s)
        return fc.call_threadsafe(int(method), payload, timeout_s)

    def submit(
        self, data_address: str, method: DataMethod, request: Message, timeout_s: float
    ) -> Future[Message]:
        """Send `request` to `data_address`; a Future of the response (PAYLOADS' type), failing
        with the typed RaftMQError. Never blocks; the Future completes on the loop thread."""
        out: Future[Message] = Future()
        response_type = PAYLOADS[method][1]
        raw = self.submit_raw(data_address, method, request.SerializeToString(), timeout_s)

        def parse(f: Future[bytes]) -> None:
            if out.done():  # cancelled by its caller meanwhile: nobody wants the answer
                return
            exc = f.exception()
            try:
                if exc is not None:
                    out.set_exception(exc)
                    return
                try:
                    msg = response_type.FromString(f.result())
                except DecodeError as derr:
                    out.set_exception(
                        InternalError(
                            f"{data_address} answered {method.name} with bytes that are not a "
                            f"{response_type.__name__}: {derr}"
                        )
                    )
                    return
                out.set_result(msg)
            except InvalidStateError:
                pass  # cancelled between the check and now

        raw.add_done_callback(parse)
        return out

    def call(
        self, data_address: str, method: DataMethod, request: Message, timeout_s: float
    ) -> Message:
        """`submit` and wait: for threads that may block (never the loop thread)."""
        assert not self.on_loop_thread(), "a blocking data call on the data pool's loop thread"
        fut = self.submit(data_address, method, request, timeout_s)
        try:
            return fut.result(timeout_s + BLOCKING_MARGIN_S)
        except FutureTimeout:
            raise RequestTimeoutError(
                f"no answer from {data_address} to {method.name} within {timeout_s:.3g}s"
            ) from None

    def close(self) -> None:
        """Close every connection (pending calls fail with BrokerUnavailableError) and stop the
        loop thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            clients = list(self._clients.values())
            self._clients.clear()
            lt, self._loop_thread = self._loop_thread, None
            own = self._own_loop

        async def close_all() -> None:
            await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

        if own is not None:  # the caller's loop: close the clients on it, never stop it
            if not clients or own.is_closed():
                return
            if self.on_loop_thread():  # the task is kept: a loop holds only weak references
                self._closing = own.create_task(close_all())
                return
            try:
                asyncio.run_coroutine_threadsafe(close_all(), own).result(CLOSE_TIMEOUT_S)
            except (FutureTimeout, RuntimeError) as exc:
                log.warning("data_pool.close_slow error=%s", exc)
            return
        if lt is None:
            return
        if clients and not self.on_loop_thread():
            try:
                lt.run(close_all(), CLOSE_TIMEOUT_S)
            except (FutureTimeout, RuntimeError) as exc:
                log.warning("data_pool.close_slow error=%s", exc)
        lt.stop()

    def __enter__(self) -> DataPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
