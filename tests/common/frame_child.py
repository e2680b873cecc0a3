"""A FrameServer in its own process for the transport tests: echo (method 1) and sleep (method
2: sleeps the float seconds in the payload, then echoes it). Prints its port, serves until
killed."""

from __future__ import annotations

import asyncio
import sys

from raftmq.common.transport import FrameServer, RequestContext, new_event_loop


async def echo(payload: memoryview, ctx: RequestContext) -> bytes:
    return bytes(payload)


async def sleep(payload: memoryview, ctx: RequestContext) -> bytes:
    await asyncio.sleep(float(bytes(payload)))
    return bytes(payload)


async def main() -> None:
    server = FrameServer({1: echo, 2: sleep}, idle_timeout_s=60)
    await server.start("127.0.0.1", 0)
    print(server.port, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    sys.exit(new_event_loop().run_until_complete(main()))
