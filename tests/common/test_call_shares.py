"""common/call_shares.py on real gRPC servers (threaded and asyncio) over real sockets: a client
host past its share of calls running is refused at once with THROTTLED while another host (::1
beside 127.0.0.1 on a dual-stack port) is served; a call's share is given back when it ends."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import pytest

from raftmq.common.call_shares import AioCallShares, CallShares, per_address_cap
from raftmq.common.errors import ERROR_DETAIL_KEY
from raftmq.common.pb import common_pb2

SHARE = 3


def _code_of(exc: grpc.RpcError) -> str:
    for key, value in exc.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == ERROR_DETAIL_KEY:
            return common_pb2.ErrorCode.Name(common_pb2.ErrorDetail.FromString(value).code)
    return ""


def test_the_default_share_leaves_an_eighth_of_the_threads_to_other_hosts() -> None:
    assert per_address_cap(0, 128) == 112 and per_address_cap(0, 16) == 14
    assert per_address_cap(0, 4) == 3 and per_address_cap(0, 1) == 1
    assert per_address_cap(5, 128) == 5


@pytest.fixture
def threaded() -> Iterator[tuple[int, threading.Event, list[int]]]:
    release = threading.Event()
    running = [0]

    def block(request: bytes, context: grpc.ServicerContext) -> bytes:
        running[0] += 1
        release.wait(30)
        return request

    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        "t.T",
        {
            "Block": grpc.unary_unary_rpc_method_handler(block),
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(16), interceptors=[CallShares(SHARE)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("[::]:0")
    server.start()
    try:
        yield port, release, running
    finally:
        release.set()
        server.stop(0)


def test_a_host_past_its_share_is_throttled_and_another_is_served(
    threaded: tuple[int, threading.Event, list[int]],
) -> None:
    port, release, running = threaded
    with (
        grpc.insecure_channel(f"127.0.0.1:{port}") as greedy,
        grpc.insecure_channel(f"[::1]:{port}") as other,
    ):
        block = greedy.unary_unary("/t.T/Block")
        held = [block.future(b"x", timeout=30) for _ in range(SHARE)]
        deadline = time.monotonic() + 10
        while running[0] < SHARE:
            assert time.monotonic() < deadline, "the held calls did not start"
            time.sleep(0.01)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            block(b"y", timeout=10)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _code_of(refused.value) == "THROTTLED"
        assert "127.0.0.1 already holds 3 gRPC calls in flight" in str(refused.value.details())
        assert time.monotonic() - t0 < 2
        assert other.unary_unary("/t.T/Echo")(b"ok", timeout=5) == b"ok"
        release.set()
        assert [f.result(10) for f in held] == [b"x"] * SHARE
        assert greedy.unary_unary("/t.T/Echo")(b"again", timeout=5) == b"again"


def test_the_asyncio_server_counts_streams_while_they_are_open() -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
            yield b"first"
            await release.wait()
            yield b"last"

        async def echo(request: bytes, context: Any) -> bytes:
            return request

        handler = grpc.method_handlers_generic_handler(
            "t.T",
            {
                "Stream": grpc.unary_stream_rpc_method_handler(stream),
                "Echo": grpc.unary_unary_rpc_method_handler(echo),
            },
        )
        server = grpc.aio.server(interceptors=[AioCallShares(SHARE)])
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("[::]:0")
        await server.start()
        try:
            async with (
                grpc.aio.insecure_channel(f"127.0.0.1:{port}") as greedy,
                grpc.aio.insecure_channel(f"[::1]:{port}") as other,
            ):
                open_streams = [greedy.unary_stream("/t.T/Stream")(b"") for _ in range(SHARE)]
                for call in open_streams:
                    assert await call.read() == b"first"
                extra = greedy.unary_stream("/t.T/Stream")(b"")
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await extra.read()
                assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                with pytest.raises(grpc.aio.AioRpcError):
                    await greedy.unary_unary("/t.T/Echo")(b"", timeout=5)
                assert await other.unary_unary("/t.T/Echo")(b"ok", timeout=5) == b"ok"
                release.set()
                for call in open_streams:
                    assert await call.read() == b"last"
                    assert await call.read() is grpc.aio.EOF
                assert await greedy.unary_unary("/t.T/Echo")(b"again", timeout=5) == b"again"
        finally:
            await server.stop(0)

    asyncio.run(asyncio.wait_for(main(), 60))
