"""Test-only framed data server in front of a real broker node: serves every DataMethod on a
FrameServer by forwarding the request to the node's gRPC Broker service (a proxy on loopback).

It stands in for the broker's own data server until that is merged, so the SDK's framed path is
tested against real brokers. Point a client at it with `client.routes._override_data_addresses`
(gRPC address -> proxy address). Run as a process (`python -m tests.client.frame_broker
--target HOST:PORT [--hold-sends]`) to kill it with SIGKILL in the middle of a send.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from raftmq.client.routes import CHANNEL_OPTIONS
from raftmq.common.data_api import PAYLOADS, DataMethod
from raftmq.common.errors import from_rpc_error
from raftmq.common.pb import broker_pb2, broker_pb2_grpc
from raftmq.common.transport import FrameServer, Handler, LoopThread, RequestContext

# DataMethod -> the gRPC Broker method of the same payloads
GRPC_NAMES: dict[DataMethod, str] = {
    DataMethod.SEND_MESSAGE: "SendMessage",
    DataMethod.PULL_MESSAGE: "PullMessage",
    DataMethod.COMMIT_OFFSET: "CommitOffset",
    DataMethod.QUERY_OFFSET: "QueryOffset",
    DataMethod.GET_QUEUE_BOUNDS: "GetQueueBounds",
    DataMethod.SEARCH_OFFSET_BY_TIMESTAMP: "SearchOffsetByTimestamp",
    DataMethod.HEARTBEAT: "Heartbeat",
}
FORWARD_TIMEOUT_S = 10.0


class FrameBrokerProxy:
    """One FrameServer on its own loop thread forwarding to the broker at `target` (gRPC).
    `hold_sends`: forward a send, then never answer it (the client sees a lost connection when
    this proxy dies: a send that was stored but whose answer never came)."""

    def __init__(self, target: str, *, hold_sends: bool = False) -> None:
        self.target = target
        self.hold_sends = hold_sends
        self.calls: collections.Counter[str] = collections.Counter()
        self.held = threading.Event()  # set once a send is held
        self._calls_lock = threading.Lock()
        self._channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = broker_pb2_grpc.BrokerStub(self._channel)
        self._pool = ThreadPoolExecutor(64, thread_name_prefix="frame-broker")
        self._lt = LoopThread("frame-broker")
        handlers: dict[int, Handler] = {int(m): self._handler(m) for m in GRPC_NAMES}
        self._server = FrameServer(handlers)
        self._lt.run(self._server.start("127.0.0.1", 0), 10)
        self.address = f"127.0.0.1:{self._server.port}"

    def _handler(self, method: DataMethod) -> Handler:
        request_type = PAYLOADS[method][0]
        fn = getattr(self._stub, GRPC_NAMES[method])

        async def handle(payload: memoryview, ctx: RequestContext) -> bytes:
            req: Any = request_type.FromString(bytes(payload))
            timeout_s = FORWARD_TIMEOUT_S
            if isinstance(req, broker_pb2.PullMessageRequest):
                timeout_s += req.max_wait_ms / 1000
            with self._calls_lock:
                self.calls[method.name] += 1

            def forward() -> bytes:
                try:
                    out: bytes = fn(req, timeout=timeout_s).SerializeToString()
                except grpc.RpcError as exc:
                    raise from_rpc_error(exc) from None
                return out

            out = await asyncio.get_running_loop().run_in_executor(self._pool, forward)
            if self.hold_sends and method is DataMethod.SEND_MESSAGE:
                self.held.set()
                await asyncio.Event().wait()  # stored, never answered
            return out

        handle.__qualname__ = f"FrameBrokerProxy.{GRPC_NAMES[method]}"
        return handle

    def count(self, method: DataMethod) -> int:
        with self._calls_lock:
            return self.calls[method.name]

    def close(self) -> None:
        try:
            self._lt.run(self._server.close(grace_s=0.5), 10)
        finally:
            self._lt.stop()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._channel.close()

    def __enter__(self) -> FrameBrokerProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True, help="the broker node's gRPC host:port")
    p.add_argument("--hold-sends", action="store_true")
    args = p.parse_args(argv)
    proxy = FrameBrokerProxy(args.target, hold_sends=args.hold_sends)
    print(f"frame_broker.started address={proxy.address}", flush=True)
    threading.Event().wait()  # until killed
    return 0


if __name__ == "__main__":
    sys.exit(main())
