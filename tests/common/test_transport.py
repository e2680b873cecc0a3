"""FrameServer and FrameClient over real loopback sockets (and a real server process where a
crash or a freeze matters): concurrency, typed errors, limits, foreign peers, dead servers,
timeouts, backpressure, graceful close, the threaded bridge and TLS."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import random
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from raftmq.common import errors, frame
from raftmq.common.frame import FrameDecoder, Hello, Kind
from raftmq.common.transport import (
    FrameClient,
    FrameServer,
    LoopThread,
    RequestContext,
    new_event_loop,
    was_never_sent,
)

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
ECHO, SLEEP, FAIL, CRASH, BLOCK = 1, 2, 3, 4, 5


def run(coro: Coroutine[Any, Any, T], loop_kind: str = "uvloop", timeout_s: float = 30) -> T:
    loop = new_event_loop() if loop_kind == "uvloop" else asyncio.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, timeout_s))
    finally:
        loop.close()


@pytest.fixture(params=["uvloop", "asyncio"])
def loop_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def echo(payload: memoryview, ctx: RequestContext) -> bytes:
    return bytes(payload)


async def sleep_then_echo(payload: memoryview, ctx: RequestContext) -> bytes:
    await asyncio.sleep(float(bytes(payload)))
    return bytes(payload)


async def fail(payload: memoryview, ctx: RequestContext) -> bytes:
    raise errors.NotLeaderError.for_node("n2", "broker-a", "10.0.0.2:8081")


async def crash(payload: memoryview, ctx: RequestContext) -> bytes:
    raise ValueError("secret-db-password=hunter2")


HANDLERS: dict[int, Callable[[memoryview, RequestContext], Awaitable[bytes]]] = {
    ECHO: echo,
    SLEEP: sleep_then_echo,
    FAIL: fail,
    CRASH: crash,
}


async def hello_conn(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection that has done the handshake, for tests that misbehave on purpose."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(frame.encode_hello(Hello()))
    dec = FrameDecoder(expect_hello=True)
    [f] = dec.feed(await r.readexactly(frame.HEADER_BYTES + 16))
    assert f.kind is Kind.HELLO
    return r, w


async def read_to_close(r: asyncio.StreamReader) -> list[frame.Frame]:
    """Everything the server sends until it closes (the test fails on a hang via run's timeout)."""
    data = await r.read()
    frames = FrameDecoder(expect_hello=False).feed(data)
    return frames


# ---- calls --------------------------------------------------------------------------------------


def test_many_concurrent_calls_on_one_connection_complete_out_of_order(loop_kind: str) -> None:
    async def main() -> None:
        async with FrameServer(HANDLERS) as server:
            await server.start()
            async with FrameClient("127.0.0.1", server.port) as client:
                done: list[int] = []

                async def one(i: int) -> None:
                    delay = f"{random.random() * 0.05:.4f}".encode()
                    assert await client.call(SLEEP, delay, 10) == delay
                    done.append(i)

                await asyncio.gather(*(one(i) for i in range(300)))
                assert sorted(done) == list(range(300))
                assert done != list(range(300))  # answers came back in another order
                assert server.connections == 1
                big = os.urandom(1 << 20)
                assert await client.call(ECHO, big, 10) == big
                assert await client.call(ECHO, b"", 10) == b""

    run(main(), loop_kind)


def test_handler_error_arrives_as_the_same_typed_error(loop_kind: str) -> None:
    async def main() -> None:
        async with FrameServer(HANDLERS) as server:
            await server.start()
            async with FrameClient("127.0.0.1", server.port) as client:
                with pytest.raises(errors.NotLeaderError) as info:
                    await client.call(FAIL, b"", 5)
                want = errors.NotLeaderError.for_node("n2", "broker-a", "10.0.0.2:8081")
                got = info.value
                assert (got.code, got.message, got.leader_hint, got.details) == (
                    want.code,
                    want.message,
                    want.leader_hint,
                    want.details,
                )
                assert got.retryable
                with pytest.raises(errors.UnsupportedError, match="method 99"):
                    await client.call(99, b"", 5)
                with pytest.raises(errors.InvalidArgumentError, match="method id"):
                    await client.call(70_000, b"", 5)

    run(main(), loop_kind)


def test_internal_error_never_leaks_the_traceback(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> errors.RaftMQError:
        async with FrameServer(HANDLERS) as server:
            await server.start()
            async with FrameClient("127.0.0.1", server.port) as client:
                with pytest.raises(errors.InternalError) as info:
                    await client.call(CRASH, b"", 5)
                assert await client.call(ECHO, b"still", 5) == b"still"
                return info.value

    with caplog.at_level(logging.ERROR):
        exc = run(main())
    error_id = exc.details["error_id"]
    assert error_id in exc.message and exc.code == "INTERNAL"
    for secret in ("hunter2", "Traceback", "File ", ".py"):
        assert secret not in exc.message and secret not in str(exc.details)
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # the traceback stays in the server log


def test_timeout_fails_the_call_and_drops_the_late_answer() -> None:
    async def main() -> None:
        async with FrameServer(HANDLERS) as server:
            await server.start()
            async with FrameClient("127.0.0.1", server.port) as client:
                t0 = time.monotonic()
                with pytest.raises(errors.RequestTimeoutError):
                    await client.call(SLEEP, b"0.5", 0.1)
                assert time.monotonic() - t0 < 0.4
                await asyncio.sleep(0.6)
                assert client.late_answers == 1
                assert client.pending_calls == 0
                assert await client.call(ECHO, b"ok", 5) == b"ok"

    run(main())


def test_payload_over_the_servers_limit_fails_before_sending() -> None:
    async def main() -> None:
        async with FrameServer(HANDLERS, max_frame_bytes=4096) as server:
            await server.start()
            async with FrameClient("127.0.0.1", server.port) as client:
                with pytest.raises(errors.MessageTooLargeError):
                    await client.call(ECHO, b"x" * 4096, 5)
                assert await client.call(ECHO, b"x" * 4000, 5) == b"x" * 4000

    run(main())


def test_a_loop_iteration_writes_its_first_frame_at_once_and_the_rest_in_one_writelines() -> None:
    async def main() -> None:
        async with FrameServer(HANDLERS) as server:
            await server.start()
            async with FrameClient("127.0.0.1", server.port) as client:
                await client.connect()
                conn = client._conn
                assert conn is not None
                real = conn._transport
                assert real is not None
                batches: list[int] = []

                class Counting:
                    def writelines(self, parts: list[bytes]) -> None:
                        batches.append(len(parts))
                        real.writelines(parts)

                    def __getattr__(self, name: str) -> Any:
                        return getattr(real, name)

                conn._transport = Counting()  # type: ignore[assignment]
                futs = [asyncio.ensure_future(client.call(ECHO, b"%d" % i, 5)) for i in range(50)]
                answers = await asyncio.gather(*futs)
                assert answers == [b"%d" % i for i in range(50)]
                # the first request's header and payload at once (a lone send waits no loop
                # turn), the other 49 requests' in one call at the end of the iteration
                assert batches == [2, 98]

    run(main())


def test_reconnects_on_demand_after_the_connection_drops() -> None:
    async def main() -> None:
        async with FrameServer(HANDLERS) as server:
            await server.start()
            async with FrameClient("127.0.0.1", server.port) as client:
                assert await client.call(ECHO, b"1", 5) == b"1"
                pending = asyncio.ensure_future(client.call(SLEEP, b"5", 10))
                await asyncio.sleep(0.05)
                for conn in list(server._conns):
                    conn.shutdown()  # the server drops the connection under a pending call
                with pytest.raises(errors.BrokerUnavailableError) as info:
                    await pending
                assert info.value.retryable
                assert await client.call(ECHO, b"2", 5) == b"2"  # a new connection

    run(main())


def test_unreachable_server_is_broker_unavailable() -> None:
    async def main() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # nothing listens here
        async with FrameClient("127.0.0.1", port) as client:
            with pytest.raises(errors.BrokerUnavailableError, match="cannot connect"):
                await client.call(ECHO, b"", 2)

    run(main())


# ---- foreign peers and limits -------------------------------------------------------------------


def test_grpc_client_and_garbage_get_a_clean_close_and_others_are_served() -> None:
    with LoopThread() as lt:
        server = FrameServer(HANDLERS)
        lt.run(server.start())
        client = FrameClient("127.0.0.1", server.port, loop=lt.loop)
        try:
            with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                call = channel.unary_unary("/raftmq.v1.Broker/SendMessage")
                with pytest.raises(grpc.RpcError) as info:
                    call(b"", timeout=3)
                assert info.value.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.INTERNAL,
                    grpc.StatusCode.UNKNOWN,
                )
            for garbage in (os.urandom(64), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 10):
                with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
                    s.sendall(garbage)
                    received = b""
                    while chunk := s.recv(4096):  # the server closes: recv ends with b""
                        received += chunk
                    [goaway] = FrameDecoder(expect_hello=True).feed(received)
                    assert goaway.kind is Kind.GOAWAY
                    assert "not a raftmq" in frame.decode_error(goaway.payload).message
            assert client.call_threadsafe(ECHO, b"alive", 5).result(5) == b"alive"
            assert server.rejected_connections >= 4
            assert server.connections == 1
        finally:
            lt.run(client.close())
            lt.run(server.close(1))


def test_frame_over_the_limit_closes_that_connection_only() -> None:
    async def main() -> None:
        async with FrameServer(HANDLERS, max_frame_bytes=64 * 1024) as server:
            await server.start()
            async with FrameClient("127.0.0.1", server.port) as good:
                assert await good.call(ECHO, b"a", 5) == b"a"
                r, w = await hello_conn(server.port)
                w.write(struct.pack("<IBBIH", 10 * 1024 * 1024, Kind.REQUEST, 0, 1, ECHO))
                [goaway] = await read_to_close(r)
                assert goaway.kind is Kind.GOAWAY
                assert "exceeds max_frame_bytes" in frame.decode_error(goaway.payload).message
                w.close()
                assert await good.call(ECHO, b"b", 5) == b"b"
                assert server.connections == 1

    run(main())


def test_handshake_refused_for_another_version_and_silent_peers_time_out() -> None:
    async def main() -> None:
        async with FrameServer(HANDLERS, hello_timeout_s=0.3) as server:
            await server.start()
            r, w = await asyncio.open_connection("127.0.0.1", server.port)
            w.write(frame.encode_hello(Hello(version=2)))
            [goaway] = await read_to_close(r)
            exc = frame.decode_error(goaway.payload)
            assert isinstance(exc, errors.UnsupportedError) and "version 2" in exc.message
            w.close()
            r, w = await asyncio.open_connection("127.0.0.1", server.port)  # says nothing
            t0 = time.monotonic()
            assert await r.read() != b""  # a GOAWAY, then the close
            assert time.monotonic() - t0 < 2
            w.close()

    run(main())


def test_backpressure_bounds_tasks_and_buffers_of_a_client_that_does_not_read() -> None:
    max_inflight = 8
    release = asyncio.Event

    async def main() -> None:
        gate = release()

        async def block(payload: memoryview, ctx: RequestContext) -> bytes:
            await gate.wait()
            return b"r" * 32 * 1024

        server = FrameServer(
            {BLOCK: block, ECHO: echo},
            max_inflight_per_conn=max_inflight,
            max_pending_write_bytes=128 * 1024,
        )
        await server.start()
        r, w = await hello_conn(server.port)
        n = 10 * max_inflight
        for i in range(n):
            w.write(frame.encode_request(i + 1, BLOCK, b"q" * 100))
        await w.drain()
        await asyncio.sleep(0.3)
        assert server.inflight == max_inflight  # the rest wait unread or decoded in one backlog
        assert server.backlog <= n - max_inflight
        # Release: answers of 32 KiB each pile up while the client still does not read.
        gate.set()
        peak_tasks = peak_buffer = 0
        for _ in range(30):
            await asyncio.sleep(0.02)
            peak_tasks = max(peak_tasks, server.inflight)
            peak_buffer = max(peak_buffer, server.write_buffer_bytes)
        assert peak_tasks <= max_inflight
        # bounded: the high-water mark plus what the tasks in flight may add
        assert peak_buffer <= 128 * 1024 + (max_inflight + 1) * (32 * 1024 + 64)
        # Now read everything: all n answers arrive, in full.
        dec = FrameDecoder(expect_hello=False)
        got: list[frame.Frame] = []
        while len(got) < n:
            got += dec.feed(await r.read(1 << 16))
        assert sorted(f.request_id for f in got) == list(range(1, n + 1))
        assert all(len(f.payload) == 32 * 1024 for f in got)
        w.close()
        await server.close(1)

    run(main())


def test_a_burst_starts_at_most_the_turn_budget_per_loop_turn_taking_connections_in_turn(
    loop_kind: str,
) -> None:
    """A burst of requests must not all start in one loop turn (a thousand long polls did, and
    held the loop's timers and every answer behind them; on a loop shared with the Raft timers,
    past an election timeout), and one connection's burst must not start before another's
    first request."""
    budget, conns, per_conn = 4, 10, 20

    async def main() -> None:
        loop = asyncio.get_running_loop()
        turn = 0
        ticking = True

        def tick() -> None:  # one increment per loop turn (a call_soon runs in the next one)
            nonlocal turn
            turn += 1
            if ticking:
                loop.call_soon(tick)

        started: list[tuple[int, int, int]] = []  # (turn, connection, request) at each start

        async def note(payload: memoryview, ctx: RequestContext) -> bytes:
            started.append((turn, ctx.conn_id, ctx.request_id))
            return bytes(payload)

        server = FrameServer({ECHO: note}, max_starts_per_turn=budget)
        await server.start()
        writers = []
        for _ in range(conns):
            r, w = await hello_conn(server.port)
            writers.append((r, w))
        loop.call_soon(tick)
        # every burst is in the server's socket buffers before the server reads any of them
        for _, w in writers:
            w.write(b"".join(frame.encode_request(i + 1, ECHO, b"x") for i in range(per_conn)))
        await asyncio.gather(*(w.drain() for _, w in writers))
        for r, _ in writers:
            dec, got = FrameDecoder(expect_hello=False), []
            while len(got) < per_conn:
                got += dec.feed(await r.read(1 << 16))
            assert sorted(f.request_id for f in got) == list(range(1, per_conn + 1))
        ticking = False
        per_turn: dict[int, int] = {}
        for t, _, _ in started:
            per_turn[t] = per_turn.get(t, 0) + 1
        assert len(started) == conns * per_conn
        # Twice the budget at most: FrameServer.may_start says why a turn may see two windows.
        assert max(per_turn.values()) <= 2 * budget, per_turn
        assert len(per_turn) >= conns * per_conn // (2 * budget)
        # In turn: until every connection has started its first request, none has started more
        # than one window's worth (the first connection read may take a turn's budget before
        # the others are read; after that the waiting connections take one request each).
        order = [(c, rid) for _, c, rid in started]
        last_first = max(order.index((c, 1)) for c in {c for c, _ in order})
        ahead: dict[int, int] = {}
        for c, _ in order[: last_first + 1]:
            ahead[c] = ahead.get(c, 0) + 1
        assert max(ahead.values()) <= 2 * budget, order[: last_first + 1]
        for _, w in writers:
            w.close()
        await server.close(1)

    run(main(), loop_kind)


def test_a_server_full_of_long_requests_is_not_mistaken_for_a_dead_one() -> None:
    async def main() -> None:
        # 2 in flight per connection, each 1.5 s: the server stops reading, so it cannot answer
        # the client's pings; its own pings must keep the 0.6 s keepalive satisfied.
        async with FrameServer(HANDLERS, max_inflight_per_conn=2) as server:
            await server.start()
            async with FrameClient(
                "127.0.0.1", server.port, keepalive_interval_s=0.2, keepalive_timeout_s=0.6
            ) as client:
                answers = await asyncio.gather(*(client.call(SLEEP, b"1.5", 10) for _ in range(4)))
                assert answers == [b"1.5"] * 4

    run(main())


def test_a_client_whose_socket_is_full_waits_then_times_out_without_sending() -> None:
    async def main() -> None:
        gate = asyncio.Event()

        async def block(payload: memoryview, ctx: RequestContext) -> bytes:
            await gate.wait()
            return b"done"

        async with FrameServer({BLOCK: block}, max_inflight_per_conn=1) as server:
            await server.start()
            async with FrameClient(
                "127.0.0.1", server.port, max_pending_write_bytes=256 * 1024
            ) as client:
                big = b"x" * (1 << 20)
                calls = [asyncio.ensure_future(client.call(BLOCK, big, 30)) for _ in range(24)]
                await asyncio.sleep(0.3)  # the server reads one, the kernel takes a few MiB
                conn = client._conn
                assert conn is not None and conn.write_paused
                with pytest.raises(errors.RequestTimeoutError, match="nothing was sent"):
                    await client.call(BLOCK, b"one more", 0.3)
                gate.set()
                assert await asyncio.gather(*calls) == [b"done"] * 24
                assert await client.call(BLOCK, b"now", 5) == b"done"

    run(main())


def test_graceful_close_lets_in_flight_finish_and_refuses_new_work_retryably() -> None:
    async def main() -> None:
        server = FrameServer(HANDLERS)
        await server.start()
        async with FrameClient("127.0.0.1", server.port) as client:
            slow = [asyncio.ensure_future(client.call(SLEEP, b"0.3", 5)) for _ in range(5)]
            await asyncio.sleep(0.05)
            closing = asyncio.ensure_future(server.close(grace_s=3))
            await asyncio.sleep(0.05)
            assert [await f for f in slow] == [b"0.3"] * 5
            with pytest.raises(errors.BrokerUnavailableError) as info:
                await client.call(ECHO, b"late", 2)
            assert info.value.retryable
            await closing

    run(main())


def test_calls_outliving_the_grace_period_fail_retryably() -> None:
    async def main() -> None:
        server = FrameServer(HANDLERS)
        await server.start()
        async with FrameClient("127.0.0.1", server.port) as client:
            stuck = asyncio.ensure_future(client.call(SLEEP, b"30", 60))
            await asyncio.sleep(0.05)
            t0 = time.monotonic()
            await server.close(grace_s=0.2)
            with pytest.raises(errors.BrokerUnavailableError) as info:
                await stuck
            assert time.monotonic() - t0 < 2
            assert "shutting down" in info.value.message
            assert server.inflight == 0

    run(main())


def test_connections_over_max_connections_are_refused_with_a_retryable_error() -> None:
    async def main() -> None:
        async with FrameServer(HANDLERS, max_connections=2) as server:
            await server.start()
            clients = [FrameClient("127.0.0.1", server.port) for _ in range(3)]
            assert await clients[0].call(ECHO, b"0", 5) == b"0"
            assert await clients[1].call(ECHO, b"1", 5) == b"1"
            with pytest.raises(errors.ThrottledError) as info:
                await clients[2].call(ECHO, b"2", 5)
            assert info.value.retryable
            await clients[0].close()
            await asyncio.sleep(0.05)
            assert await clients[2].call(ECHO, b"2", 5) == b"2"  # room again
            for c in clients:
                await c.close()

    run(main())


# ---- a real server process: crash and freeze ----------------------------------------------------


@contextlib.contextmanager
def child_server() -> Iterator[tuple[subprocess.Popen[str], int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.common.frame_child"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield proc, port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_pending_calls_fail_retryably_when_the_server_dies_or_freezes(sig: signal.Signals) -> None:
    interval_s, timeout_s = 0.3, 1.2

    async def main(port: int, proc: subprocess.Popen[str]) -> float:
        async with FrameClient(
            "127.0.0.1", port, keepalive_interval_s=interval_s, keepalive_timeout_s=timeout_s
        ) as client:
            assert await client.call(1, b"up", 5) == b"up"
            calls = [asyncio.ensure_future(client.call(2, b"30", 60)) for _ in range(20)]
            await asyncio.sleep(0.2)
            os.kill(proc.pid, sig)
            t0 = time.monotonic()
            results = await asyncio.gather(*calls, return_exceptions=True)
            took = time.monotonic() - t0
            assert all(isinstance(r, errors.BrokerUnavailableError) for r in results), results
            assert all(r.retryable for r in results if isinstance(r, errors.RaftMQError))
            return took

    with child_server() as (proc, port):
        took = run(main(port, proc))
    # SIGKILL closes the socket (immediate); SIGSTOP leaves it open: only keepalive notices
    assert took < timeout_s + interval_s + 0.5
    if sig is signal.SIGSTOP:
        assert took >= timeout_s - interval_s - 0.1


# ---- the threaded bridge and TLS ----------------------------------------------------------------


def test_call_threadsafe_from_many_threads() -> None:
    with LoopThread() as lt:
        server = FrameServer(HANDLERS)
        lt.run(server.start())
        client = FrameClient("127.0.0.1", server.port, loop=lt.loop)
        failures: list[BaseException] = []

        def worker(k: int) -> None:
            try:
                futs = [client.call_threadsafe(ECHO, b"%d-%d" % (k, i), 10) for i in range(500)]
                assert [f.result(10) for f in futs] == [b"%d-%d" % (k, i) for i in range(500)]
                with pytest.raises(errors.NotLeaderError):
                    client.call_threadsafe(FAIL, b"", 10).result(10)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not failures
        assert server.connections == 1
        lt.run(client.close())
        with pytest.raises(errors.BrokerUnavailableError):
            client.call_threadsafe(ECHO, b"", 1).result(5)
        lt.run(server.close(1))


def test_call_threadsafe_keeps_one_threads_order_across_the_connect() -> None:
    seen: list[bytes] = []

    async def record(payload: memoryview, ctx: RequestContext) -> bytes:
        seen.append(bytes(payload))  # handlers start in arrival order
        return b""

    with LoopThread() as lt:
        server = FrameServer({ECHO: record})
        lt.run(server.start())
        client = FrameClient("127.0.0.1", server.port, loop=lt.loop)
        sent = [b"%d" % i for i in range(300)]
        futs = []
        for i, p in enumerate(sent):
            futs.append(client.call_threadsafe(ECHO, p, 10))
            if i == 100:
                time.sleep(0.01)  # some while the connection opens, some after
        for f in futs:
            f.result(10)
        assert seen == sent
        lt.run(client.close())
        lt.run(server.close(1))


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_tls(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))

    async def main() -> None:
        async with FrameServer(HANDLERS, ssl=server_ctx) as server:
            await server.start()
            async with FrameClient(
                "127.0.0.1", server.port, ssl=client_ctx, server_hostname="localhost"
            ) as client:
                assert await client.call(ECHO, b"secret", 5) == b"secret"
                with pytest.raises(errors.NotLeaderError):
                    await client.call(FAIL, b"", 5)
            async with FrameClient("127.0.0.1", server.port) as plain:  # no TLS: refused
                with pytest.raises(errors.BrokerUnavailableError):
                    await plain.call(ECHO, b"", 2)

    run(main())


def test_a_call_waiting_for_the_connection_keeps_its_own_timeout() -> None:
    """A peer that accepts TCP but never says HELLO (a SIGSTOPped broker): a threadsafe call
    held for the connection fails at its own timeout, as never sent, not after the longer
    connect timeout (the producer's send timeout counts on it)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        with LoopThread() as lt:
            client = FrameClient("127.0.0.1", silent.getsockname()[1], loop=lt.loop)
            t0 = time.monotonic()
            fut = client.call_threadsafe(ECHO, b"x", 0.3)
            exc = fut.exception(10)
            elapsed = time.monotonic() - t0
            assert isinstance(exc, errors.RequestTimeoutError), exc
            assert was_never_sent(exc)
            assert elapsed < 1.5, f"held {elapsed:.2f} s for a 0.3 s call"
            lt.run(client.close())
    finally:
        silent.close()


# ---- fair shares (issue 27) ---------------------------------------------------------------------


def test_one_client_host_holds_at_most_its_share_and_others_still_connect() -> None:
    async def main() -> None:
        async with FrameServer(HANDLERS, max_connections=8, max_connections_per_address=3) as srv:
            await srv.start()
            held = []
            for _ in range(3):
                r, w = await asyncio.open_connection(
                    "127.0.0.1", srv.port, local_addr=("127.0.0.2", 0)
                )
                w.write(frame.encode_hello(Hello()))
                held.append((r, w))
            r, w = await asyncio.open_connection("127.0.0.1", srv.port, local_addr=("127.0.0.2", 0))
            [goaway] = await read_to_close(r)
            exc = frame.decode_error(goaway.payload)
            assert isinstance(exc, errors.ThrottledError)
            assert "127.0.0.2" in exc.message and "limit per client address" in exc.message
            w.close()
            async with FrameClient("127.0.0.1", srv.port) as other:  # another host: served
                assert await other.call(ECHO, b"x", 5) == b"x"
            for _, hw in held:  # the share is given back when they close
                hw.close()
            await asyncio.sleep(0)
            await wait_for_condition(lambda: srv.shares.held_by("127.0.0.2") == 0)
            r, w = await asyncio.open_connection("127.0.0.1", srv.port, local_addr=("127.0.0.2", 0))
            w.write(frame.encode_hello(Hello()))
            await wait_for_condition(lambda: srv.shares.held_by("127.0.0.2") == 1)
            w.close()

    run(main())


def test_one_user_holds_at_most_its_share() -> None:
    def authenticate(method: int, auth: bytes) -> str:
        return auth.decode()  # the HELLO names its user (the real check is common/auth_guard.py)

    async def main() -> None:
        async with FrameServer(
            HANDLERS, max_connections_per_user=2, authenticate=authenticate
        ) as srv:
            await srv.start()
            held = []
            for _ in range(2):
                r, w = await asyncio.open_connection("127.0.0.1", srv.port)
                w.write(
                    frame.encode_hello(Hello(auth_method=frame.AUTH_HMAC_SHA1, auth=b"mallory"))
                )
                held.append(w)
            r, w = await asyncio.open_connection("127.0.0.1", srv.port)
            w.write(frame.encode_hello(Hello(auth_method=frame.AUTH_HMAC_SHA1, auth=b"mallory")))
            frames = await read_to_close(r)
            exc = frame.decode_error(frames[-1].payload)
            assert isinstance(exc, errors.ThrottledError) and "'mallory'" in exc.message
            r, w2 = await asyncio.open_connection("127.0.0.1", srv.port)
            w2.write(frame.encode_hello(Hello(auth_method=frame.AUTH_HMAC_SHA1, auth=b"alice")))
            await wait_for_condition(lambda: srv.shares.held_by_user("alice") == 1)
            for hw in [*held, w, w2]:
                hw.close()
            await wait_for_condition(lambda: srv.shares.total == 0)
            assert srv.shares.held_by_user("mallory") == 0

    run(main())


def test_a_connection_that_said_hello_and_then_nothing_is_closed_at_the_idle_timeout() -> None:
    async def main() -> None:
        async with FrameServer(HANDLERS, idle_timeout_s=0.4) as srv:
            await srv.start()
            r, w = await hello_conn(srv.port)
            t0 = time.monotonic()
            frames = await read_to_close(r)
            assert 0.3 < time.monotonic() - t0 < 3
            exc = frame.decode_error(frames[-1].payload)
            assert isinstance(exc, errors.BrokerUnavailableError) and "no frame" in exc.message
            assert srv.shares.total == 0
            w.close()

    run(main())


async def wait_for_condition(cond: Callable[[], bool], timeout_s: float = 5) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
def test_large_requests_in_flight_are_read_whole_over_either_loop_and_tls(
    tmp_path: Path, secure: bool, loop_kind: str
) -> None:
    """Requests larger than the server's scratch, many in flight, with a frame buffer pool of
    1 MiB: some are read into pooled buffers, the rest into buffers grown as their bytes arrive;
    every answer is its own request's bytes (a pooled buffer rewritten under a live request
    would answer another's), over TCP and TLS, on uvloop's and asyncio's transports."""
    server_ctx = client_ctx = None
    if secure:
        cert, key = _self_signed(tmp_path)
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(cert, key)
        client_ctx = ssl.create_default_context(cafile=str(cert))
    sizes = [200_000, 700_000, 3_000_000, 70_000, 1_100_000] * 3
    bodies = [bytes([k % 251]) * n + k.to_bytes(4, "little") for k, n in enumerate(sizes)]

    async def main() -> None:
        async with FrameServer(HANDLERS, ssl=server_ctx, frame_buffer_bytes=1 << 20) as server:
            await server.start()
            async with FrameClient(
                "127.0.0.1", server.port, ssl=client_ctx, server_hostname="localhost"
            ) as client:
                answers = await asyncio.gather(*(client.call(ECHO, b, 20) for b in bodies))
                assert answers == bodies
                assert server.buffers.pooled_bytes <= 1 << 20
                answers = await asyncio.gather(*(client.call(ECHO, b, 20) for b in bodies[:4]))
                assert answers == bodies[:4]

    run(main(), loop_kind, timeout_s=60)
