"""What one request/response costs on this machine: grpcio unary (the data path today) against a
length-prefixed frame on asyncio (+ uvloop when installed), both between two Python processes on
loopback with a 1 KiB body and an echo server. The evidence for the data path's transport
(docs/design.md, issue 14). One JSON line per result; appends to bench/results/transport.jsonl.

  sync      one request at a time                -> p50 / p99 microseconds
  window    64 requests in flight, one connection -> requests/s, client CPU us per request
  the server's CPU us per request over the whole run

Runs: grpcio unary; the bare frame (asyncio streams, no codec: the floor); the bare frame
served by an asyncio.Protocol instead of streams (same client); raftmq's own
`common.transport` FrameServer/FrameClient (the real codec, request ids, out-of-order matching,
timers); and the same client driven from a plain thread through `call_threadsafe` (the threaded
SDK's path: one hop onto the loop thread and a concurrent.futures.Future back).

Run: `.venv/bin/python bench/transport_bench.py [--requests 5000]`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import resource
import struct
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

RESULTS = Path(__file__).resolve().parent / "results" / "transport.jsonl"
BODY = b"x" * 1024
WINDOW = 64
HEADER = struct.Struct("<I")
METHOD = "/bench.Echo/Echo"


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


# ---- servers (child processes; each reports its port, then its CPU seconds when told to stop) ---


def _grpc_server(ports: Any, stop: Any, cpu: Any) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(16))
    handler = grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bench.Echo", {"Echo": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ports.put(port)
    stop.wait()
    cpu.put(_cpu_s())
    server.stop(0)


async def _frame_serve(ports: Any, stop: Any, cpu: Any) -> None:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                (n,) = HEADER.unpack(await r.readexactly(HEADER.size))
                w.write(HEADER.pack(n) + await r.readexactly(n))
        except (asyncio.IncompleteReadError, ConnectionError):
            w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    ports.put(srv.sockets[0].getsockname()[1])
    await asyncio.get_running_loop().run_in_executor(None, stop.wait)
    cpu.put(_cpu_s())
    srv.close()


def _frame_server(ports: Any, stop: Any, cpu: Any) -> None:
    _install_uvloop()
    asyncio.run(_frame_serve(ports, stop, cpu))


def _install_uvloop() -> bool:
    if os.environ.get("TRANSPORT_BENCH_LOOP") == "asyncio":  # --loop asyncio, inherited by children
        return False
    try:
        import uvloop
    except ImportError:
        return False
    uvloop.install()
    return True


class _EchoProtocol(asyncio.Protocol):
    """The bare frame's echo as an asyncio.Protocol (callbacks, no StreamReader/Writer tasks):
    the same bytes on the wire as `_frame_serve`, to measure what the Protocol style saves."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, out = 0, []
        while len(buf) - pos >= HEADER.size:
            (n,) = HEADER.unpack_from(buf, pos)
            if len(buf) - pos - HEADER.size < n:
                break
            out.append(bytes(buf[pos : pos + HEADER.size + n]))
            pos += HEADER.size + n
        del buf[:pos]
        if out and self._transport is not None:
            self._transport.writelines(out)


async def _frame_proto_serve(ports: Any, stop: Any, cpu: Any) -> None:
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(_EchoProtocol, "127.0.0.1", 0)
    ports.put(srv.sockets[0].getsockname()[1])
    await loop.run_in_executor(None, stop.wait)
    cpu.put(_cpu_s())
    srv.close()


def _frame_proto_server(ports: Any, stop: Any, cpu: Any) -> None:
    _install_uvloop()
    asyncio.run(_frame_proto_serve(ports, stop, cpu))


async def _framed_serve(ports: Any, stop: Any, cpu: Any) -> None:
    from raftmq.common.transport import FrameServer, RequestContext

    async def echo(payload: memoryview, ctx: RequestContext) -> memoryview:
        return payload

    srv = FrameServer({1: echo})
    await srv.start("127.0.0.1", 0)
    ports.put(srv.port)
    await asyncio.get_running_loop().run_in_executor(None, stop.wait)
    cpu.put(_cpu_s())
    await srv.close(1)


def _framed_server(ports: Any, stop: Any, cpu: Any) -> None:
    _install_uvloop()
    asyncio.run(_framed_serve(ports, stop, cpu))


# ---- clients ------------------------------------------------------------------------------------


def _grpc_client(port: int, n: int) -> dict[str, float]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(METHOD)
        for _ in range(200):
            call(BODY)
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            call(BODY)
            lat.append(time.perf_counter() - t)
        cpu0, t0 = _cpu_s(), time.perf_counter()
        window = threading.Semaphore(WINDOW)
        for _ in range(n):
            window.acquire()
            call.future(BODY).add_done_callback(lambda _f: window.release())
        for _ in range(WINDOW):
            window.acquire()
        elapsed = time.perf_counter() - t0
        return {
            "p50_us": _pct(lat, 50) * 1e6,
            "p99_us": _pct(lat, 99) * 1e6,
            "window_req_per_s": n / elapsed,
            "window_client_cpu_us": (_cpu_s() - cpu0) / n * 1e6,
        }


async def _frame_client_async(port: int, n: int) -> dict[str, float]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    frame = HEADER.pack(len(BODY)) + BODY

    async def one() -> None:
        w.write(frame)
        (size,) = HEADER.unpack(await r.readexactly(HEADER.size))
        await r.readexactly(size)

    for _ in range(200):
        await one()
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        await one()
        lat.append(time.perf_counter() - t)
    cpu0, t0 = _cpu_s(), time.perf_counter()
    # A window of 64 on one connection: replies come back in order, so the writer stays WINDOW
    # frames ahead of the reader.
    sent = 0
    for _ in range(min(WINDOW, n)):
        w.write(frame)
        sent += 1
    for _ in range(n):
        (size,) = HEADER.unpack(await r.readexactly(HEADER.size))
        await r.readexactly(size)
        if sent < n:
            w.write(frame)
            sent += 1
    elapsed = time.perf_counter() - t0
    w.close()
    return {
        "p50_us": _pct(lat, 50) * 1e6,
        "p99_us": _pct(lat, 99) * 1e6,
        "window_req_per_s": n / elapsed,
        "window_client_cpu_us": (_cpu_s() - cpu0) / n * 1e6,
    }


def _frame_client(port: int, n: int) -> dict[str, float]:
    return asyncio.run(_frame_client_async(port, n))


async def _framed_client_async(port: int, n: int) -> dict[str, float]:
    from raftmq.common.transport import FrameClient

    async with FrameClient("127.0.0.1", port) as client:
        for _ in range(200):
            await client.call(1, BODY, 5)
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            await client.call(1, BODY, 5)
            lat.append(time.perf_counter() - t)
        cpu0, t0 = _cpu_s(), time.perf_counter()

        async def lane(count: int) -> None:  # WINDOW lanes: WINDOW calls always in flight
            for _ in range(count):
                await client.call(1, BODY, 5)

        await asyncio.gather(*(lane(n // WINDOW + (i < n % WINDOW)) for i in range(WINDOW)))
        elapsed = time.perf_counter() - t0
    return {
        "p50_us": _pct(lat, 50) * 1e6,
        "p99_us": _pct(lat, 99) * 1e6,
        "window_req_per_s": n / elapsed,
        "window_client_cpu_us": (_cpu_s() - cpu0) / n * 1e6,
    }


def _framed_client(port: int, n: int) -> dict[str, float]:
    return asyncio.run(_framed_client_async(port, n))


def _framed_thread_client(port: int, n: int) -> dict[str, float]:
    """A plain thread calls through `call_threadsafe`; the client's loop runs in a LoopThread.
    CPU counts the whole process (the caller thread and the loop thread)."""
    from raftmq.common.transport import FrameClient, LoopThread

    uv = os.environ.get("TRANSPORT_BENCH_LOOP") != "asyncio"
    with LoopThread(loop=None if uv else asyncio.new_event_loop()) as lt:
        client = FrameClient("127.0.0.1", port, loop=lt.loop)
        for _ in range(200):
            client.call_threadsafe(1, BODY, 5).result()
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            client.call_threadsafe(1, BODY, 5).result()
            lat.append(time.perf_counter() - t)
        cpu0, t0 = _cpu_s(), time.perf_counter()
        window = threading.Semaphore(WINDOW)
        for _ in range(n):
            window.acquire()
            client.call_threadsafe(1, BODY, 5).add_done_callback(lambda _f: window.release())
        for _ in range(WINDOW):
            window.acquire()
        elapsed = time.perf_counter() - t0
        lt.run(client.close())
    return {
        "p50_us": _pct(lat, 50) * 1e6,
        "p99_us": _pct(lat, 99) * 1e6,
        "window_req_per_s": n / elapsed,
        "window_client_cpu_us": (_cpu_s() - cpu0) / n * 1e6,
    }


def _measure(
    name: str, server: Callable[..., None], client: Callable[[int, int], dict[str, float]], n: int
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ports, cpu, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=server, args=(ports, stop, cpu), daemon=True)
    proc.start()
    try:
        port = ports.get(timeout=30)
        out = client(port, n)
        stop.set()
        server_cpu_s = cpu.get(timeout=30)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    return {
        "bench": "transport",
        "name": name,
        "requests": n,
        "body_bytes": len(BODY),
        "window": WINDOW,
        **{k: round(v, 1) for k, v in out.items()},
        # the server served 200 warm-up, n sync and n windowed requests
        "server_cpu_us_per_req": round(server_cpu_s / (2 * n + 200) * 1e6, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument(
        "--loop", choices=["uvloop", "asyncio"], default="uvloop", help="asyncio: no uvloop"
    )
    ap.add_argument("--only", default="", help="comma-separated run names (default: all)")
    args = ap.parse_args()
    os.environ["TRANSPORT_BENCH_LOOP"] = args.loop
    uv = _install_uvloop()
    meta = {
        "host": platform.node(),
        "cores": os.cpu_count(),
        "grpcio": grpc.__version__,
        "loadavg_1m": os.getloadavg()[0],
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    runs = [
        ("grpcio_unary", _grpc_server, _grpc_client),
        ("frame_asyncio" + ("_uvloop" if uv else ""), _frame_server, _frame_client),
        ("frame_protocol" + ("_uvloop" if uv else ""), _frame_proto_server, _frame_client),
        ("raftmq_frame_transport" + ("_uvloop" if uv else ""), _framed_server, _framed_client),
        (
            "raftmq_frame_transport_threadsafe" + ("_uvloop" if uv else ""),
            _framed_server,
            _framed_thread_client,
        ),
    ]
    if args.only:
        wanted = set(args.only.split(","))
        runs = [r for r in runs if r[0] in wanted or r[0].removesuffix("_uvloop") in wanted]
    with RESULTS.open("a") as out:
        for name, server, client in runs:
            rec = {**_measure(name, server, client, args.requests), **meta}
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
