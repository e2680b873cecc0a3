"""An inbound peer connection cut into frames (a u32 length, then the body) by a BufferedProtocol:
small frames are parsed out of one scratch buffer many per read; a frame larger than the scratch
gets a buffer of its own that the socket reads into directly, and is handed on as that buffer.

asyncio's StreamReader copied every frame twice on top of the kernel's copy (into its buffer,
then out of it with readexactly): with 64 KiB appends that was ~20 % of a follower's CPU
(docs/benchmarks.md). Each complete frame goes to `on_frame` inside the read callback, so while
the node is busy the peer's bytes wait in the socket, not in memory here; a frame over `limit` (a
peer's hello is held to a small one until the node accepts it) ends the connection unread.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

# Small frames (acks, heartbeats, votes) are parsed from here, several per read; a larger one (an
# append of a W1-sized entry is ~60 KiB and up) gets a buffer of its own.
SCRATCH_BYTES = 64 * 1024
# A large frame's buffer is allocated whole up to this; beyond it, it doubles as its bytes arrive,
# so a length alone (a peer's first 4 bytes) never commits more memory than was sent.
PREALLOC_BYTES = 4 << 20
_HEAD = struct.Struct("<I")


class FrameTooLargeError(ValueError):
    pass


class FrameReader(asyncio.BufferedProtocol):
    """`on_frame(body)` per frame: bytes for a frame that fit the scratch buffer, a bytearray of
    its own for a larger one (owned by the callee from then on). An exception from `on_frame` or
    an oversized frame closes the transport and is `error` (with `done` set) for the owner."""

    def __init__(
        self,
        on_frame: Callable[[bytes | bytearray], None],
        limit: int,
        *,
        scratch: int = SCRATCH_BYTES,
        prealloc: int = PREALLOC_BYTES,
        on_read: Callable[[], None] | None = None,
    ) -> None:
        self._on_frame = on_frame
        self._on_read = on_read  # after the frames of one socket read were handed on
        self.limit = limit  # the owner raises it once the peer is accepted
        self._scratch = bytearray(scratch)
        self._start = 0  # the first byte in the scratch not yet handed on
        self._end = 0  # the end of what the socket put in the scratch
        self._big: bytearray | None = None  # a large frame being read into its own buffer
        self._big_got = 0
        self._big_need = 0  # its length (the buffer may be shorter yet: PREALLOC_BYTES)
        self._prealloc = prealloc
        self.transport: asyncio.BaseTransport | None = None
        self.error: BaseException | None = None
        self.done = asyncio.get_running_loop().create_future()

    # ---- asyncio's callbacks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._big is not None:
            if self._big_got == len(self._big):  # full but the frame is longer: double it
                grown = bytearray(min(self._big_need, 2 * len(self._big)))
                grown[: self._big_got] = self._big  # a new buffer: the old may still be exported
                self._big = grown
            return memoryview(self._big)[self._big_got :]
        if self._end == len(self._scratch):  # full of a partial frame: move it to the front
            self._compact()
        return memoryview(self._scratch)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._big is not None:
                self._big_got += nbytes
                if self._big_got == self._big_need:
                    frame, self._big = self._big, None
                    self._on_frame(frame)
            else:
                self._end += nbytes
                self._parse()
            if self._on_read is not None:
                self._on_read()
        except Exception as exc:  # the connection ends; the owner says why
            self.fail(exc)

    def eof_received(self) -> bool:
        return False  # close on EOF

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)
        if exc is not None and self.error is None:
            self.error = exc

    # ---- framing ------------------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._scratch
        while self._big is None and self._end - self._start >= _HEAD.size:
            (n,) = _HEAD.unpack_from(buf, self._start)
            if n > self.limit:
                raise FrameTooLargeError(f"frame of {n} bytes is over the limit of {self.limit}")
            body = self._start + _HEAD.size
            have = self._end - body
            if have >= n:
                self._start = body + n
                self._on_frame(bytes(memoryview(buf)[body : body + n]))
            elif _HEAD.size + n > len(buf):
                # Larger than the scratch: its own buffer, the part already here copied once.
                big = bytearray(min(n, max(self._prealloc, have)))
                big[:have] = memoryview(buf)[body : self._end]
                self._big, self._big_got = big, have  # have < n: the rest comes from the socket
                self._big_need = n
                self._start = self._end = 0
            else:
                break  # a partial frame that fits: wait for the rest in the scratch
        if self._start == self._end:
            self._start = self._end = 0

    def _compact(self) -> None:
        rest = self._end - self._start
        self._scratch[:rest] = self._scratch[self._start : self._end]
        self._start, self._end = 0, rest

    def fail(self, exc: BaseException) -> None:
        """End the connection for `exc` (the owner's reason, or a frame's)."""
        if self.error is None:
            self.error = exc
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)
