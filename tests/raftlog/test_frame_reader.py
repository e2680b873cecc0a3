"""The Raft port's frame reader (raftlog/frame_reader.py) driven as asyncio drives it: whatever
the reads' sizes, the same frames in order, large ones in their own buffer, and a frame over the
limit ends the connection before anything is allocated for it."""

from __future__ import annotations

import asyncio
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.raftlog.frame_reader import FrameReader, FrameTooLargeError

HEAD = struct.Struct("<I")


class Transport(asyncio.BaseTransport):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def close(self) -> None:
        self.closed = True


def feed(reader: FrameReader, stream: bytes, cuts: list[int]) -> None:
    """`stream` delivered in reads of the sizes in `cuts` (then the rest), as the loop does:
    into the buffer get_buffer hands out, at most its length per read."""
    at = 0
    sizes = iter(cuts)
    while at < len(stream) and not reader.done.done():
        buf = reader.get_buffer(-1)
        n = min(len(buf), len(stream) - at, max(1, next(sizes, len(stream))))
        buf[:n] = stream[at : at + n]
        at += n
        reader.buffer_updated(n)


def frames_of(bodies: list[bytes]) -> bytes:
    return b"".join(HEAD.pack(len(b)) + b for b in bodies)


def run(
    bodies: list[bytes], cuts: list[int], *, scratch: int, limit: int = 1 << 20
) -> tuple[list[bytes | bytearray], FrameReader, Transport]:
    async def go() -> tuple[list[bytes | bytearray], FrameReader, Transport]:
        got: list[bytes | bytearray] = []
        reader = FrameReader(got.append, limit, scratch=scratch, prealloc=16)
        transport = Transport()
        reader.connection_made(transport)
        feed(reader, frames_of(bodies), cuts)
        return got, reader, transport

    return asyncio.run(go())


@settings(max_examples=300, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=300), max_size=12),
    cuts=st.lists(st.integers(1, 400), max_size=40),
)
def test_any_reads_give_the_same_frames_in_order(bodies: list[bytes], cuts: list[int]) -> None:
    # A small scratch and a small preallocation, so frames of every kind: several per read, split
    # across reads, larger than the scratch (their own buffer, grown as their bytes arrive), empty.
    got, reader, transport = run(bodies, cuts, scratch=64)
    assert [bytes(g) for g in got] == bodies
    assert reader.error is None and not transport.closed
    for g, b in zip(got, bodies, strict=True):
        # Whatever does not fit the scratch with its length is handed over in a buffer of its
        # own, not copied again.
        assert isinstance(g, bytearray) == (len(b) + HEAD.size > 64), (len(b), type(g))


def test_a_frame_over_the_limit_ends_the_connection_unread() -> None:
    got, reader, transport = run([b"ok", b"x" * 5000, b"never"], [10_000], scratch=64, limit=4096)
    assert got == [b"ok"]
    assert isinstance(reader.error, FrameTooLargeError) and "5000 bytes" in str(reader.error)
    assert transport.closed and reader.done.done()


def test_an_error_of_the_frames_owner_ends_the_connection() -> None:
    async def go() -> tuple[FrameReader, Transport]:
        def refuse(body: bytes | bytearray) -> None:
            raise ValueError(f"refused {bytes(body)!r}")

        reader = FrameReader(refuse, 1024, scratch=64)
        transport = Transport()
        reader.connection_made(transport)
        feed(reader, frames_of([b"hello", b"more"]), [100])
        return reader, transport

    reader, transport = asyncio.run(go())
    assert isinstance(reader.error, ValueError) and "hello" in str(reader.error)
    assert transport.closed


def test_a_length_alone_commits_no_more_memory_than_the_preallocation() -> None:
    """A peer's first 4 bytes announcing 200 MiB (the limit allows it) get a buffer of
    PREALLOC_BYTES, not 200 MiB; it grows only as the frame's bytes arrive."""

    async def go() -> int:
        reader = FrameReader(lambda body: None, 256 << 20, scratch=64, prealloc=1 << 20)
        reader.connection_made(Transport())
        feed(reader, HEAD.pack(200 << 20) + b"x" * 100, [])
        return len(reader.get_buffer(-1))

    assert asyncio.run(go()) == (1 << 20) - 100


def test_on_read_follows_each_reads_frames() -> None:
    """`on_read` is called once per socket read, after every frame that read completed (a
    follower handles its Ready there), large frames included."""

    async def go() -> tuple[list[object], list[object]]:
        seen: list[object] = []
        reader = FrameReader(
            seen.append, 1 << 20, scratch=64, prealloc=16, on_read=lambda: seen.append("read")
        )
        reader.connection_made(Transport())
        small = frames_of([b"a", b"bb"])
        feed(reader, small, [len(small)])  # two frames in one read
        after_small = list(seen)
        seen.clear()
        feed(reader, frames_of([b"x" * 200]), [10, 100, 1000])  # one frame over several reads
        return after_small, seen

    after_small, after_big = asyncio.run(go())
    assert after_small == [b"a", b"bb", "read"]
    assert after_big[-2:] == [b"x" * 200, "read"]
    assert set(after_big[:-2]) == {"read"}  # one per read before the frame was whole
