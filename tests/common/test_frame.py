"""The framed protocol's codec, with no sockets: layout, limits, handshake, errors, and
Hypothesis runs (any split of a frame stream decodes the same; garbage raises only
ProtocolError)."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.common import errors, frame
from raftmq.common.frame import Frame, FrameDecoder, Hello, Kind, ProtocolError

HELLO = frame.encode_hello(Hello())


def server_decoder(max_frame_bytes: int = 64 * 1024) -> FrameDecoder:
    dec = FrameDecoder(max_frame_bytes, expect_hello=True)
    [hello] = dec.feed(HELLO)
    assert hello.kind is Kind.HELLO
    return dec


def test_layout_of_a_request_is_documented_one() -> None:
    data = frame.encode_request(7, 513, b"abc")
    # u32 length (of the rest) | u8 kind | u8 flags | u32 request id | u16 method | payload
    assert data == struct.pack("<IBBIH", 6 + 2 + 3, 2, 0, 7, 513) + b"abc"
    assert frame.encode_frame(Kind.RESPONSE, 9, b"zz") == struct.pack("<IBBI", 8, 3, 0, 9) + b"zz"
    assert len(frame.encode_frame(Kind.PING, 1)) == frame.HEADER_BYTES == 10


@given(st.lists(st.binary(max_size=20), max_size=6))
def test_a_payload_in_parts_is_written_as_the_joined_bytes_without_a_copy(
    parts: list[bytes],
) -> None:
    """frame.Parts (a SEND_STORED request's batches, issue 24): the frame on the wire is the
    one of the joined payload, and the parts go to writelines as they are (not copied)."""
    payload = frame.Parts(parts)
    assert len(payload) == sum(map(len, parts))
    out: list[frame.BytesLike] = []
    size = frame.request_into(out, 5, 9, payload)
    assert b"".join(out) == frame.encode_request(5, 9, b"".join(parts))
    assert size == len(b"".join(out))
    assert all(any(o is p for o in out) for p in parts if p)
    [decoded] = server_decoder().feed(b"".join(out))
    assert bytes(decoded.payload) == b"".join(parts)
    # an answer in parts (a raw pull's: common/raw_pull.py) the same way
    out = []
    size = frame.frame_into(out, Kind.RESPONSE, 5, payload)
    assert b"".join(out) == frame.encode_frame(Kind.RESPONSE, 5, b"".join(parts))
    assert size == len(b"".join(out))
    assert all(any(o is p for o in out) for p in parts if p)


def test_hello_round_trip_and_auth_placeholder() -> None:
    dec = FrameDecoder(expect_hello=True)
    [f] = dec.feed(frame.encode_hello(Hello(max_frame_bytes=4096, auth_method=0, auth=b"tok")))
    hello = frame.decode_hello(f.payload)
    assert hello == Hello(frame.PROTOCOL_VERSION, 4096, 0, b"tok")
    assert bytes(f.payload[:4]) == frame.MAGIC


def test_frames_decode_with_zero_copy_payloads() -> None:
    dec = server_decoder()
    data = frame.encode_request(1, 3, b"one") + frame.encode_request(2, 4, b"two")
    frames = dec.feed(data)
    assert [(f.kind, f.request_id, f.method, bytes(f.payload)) for f in frames] == [
        (Kind.REQUEST, 1, 3, b"one"),
        (Kind.REQUEST, 2, 4, b"two"),
    ]
    assert frames[0].payload.obj is data  # a slice of what was fed, not a copy


def test_payload_stays_valid_after_later_feeds() -> None:
    dec = server_decoder()
    a = frame.encode_request(1, 1, b"A" * 100)
    b = frame.encode_request(2, 1, b"B" * 100)
    [f1] = dec.feed(a[:50]) + dec.feed(a[50:] + b[:20])
    assert dec.feed(b[20:])[0].payload.tobytes() == b"B" * 100
    assert bytes(f1.payload) == b"A" * 100


def test_error_frames_carry_the_error_table() -> None:
    exc = errors.NotLeaderError.for_node("n2", "broker-a", "10.0.0.1:9876")
    dec = server_decoder()
    [f] = dec.feed(frame.encode_error(5, exc))
    back = frame.decode_error(f.payload)
    assert type(back) is errors.NotLeaderError
    assert (back.code, back.message, back.leader_hint, back.details) == (
        exc.code,
        exc.message,
        exc.leader_hint,
        exc.details,
    )
    for row in errors.ERROR_TABLE:
        e = row.exc("m", details={"k": "v"})
        got = frame.decode_error(frame.error_body(e))
        assert type(got) is row.exc and got.details == {"k": "v"}


def test_frame_over_the_limit_is_refused_from_its_header() -> None:
    dec = server_decoder(max_frame_bytes=2048)
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes"):
        dec.feed(struct.pack("<IBBI", 2049, 2, 0, 1))  # header only: no need to buffer the body
    with pytest.raises(ProtocolError):  # a broken stream stays broken
        dec.feed(frame.encode_request(2, 1, b""))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (struct.pack("<IBBI", 6, 99, 0, 1), "unknown frame kind 99"),
        (struct.pack("<IBBI", 6, 3, 0x80, 1), "reserved flags"),
        (struct.pack("<IBBI", 3, 3, 0, 1), "shorter than its header"),
        (struct.pack("<IBBI", 6, 2, 0, 1), "without a method id"),
        (HELLO, "second HELLO"),
    ],
)
def test_malformed_frames(data: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        server_decoder().feed(data)


def test_truncated_frame_at_close() -> None:
    dec = server_decoder()
    dec.feed(frame.encode_request(1, 1, b"hello")[:7])
    with pytest.raises(ProtocolError, match="closed inside a frame"):
        dec.feed_eof()
    server_decoder().feed_eof()  # nothing pending: a clean close


@pytest.mark.parametrize(
    "first",
    [
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # what a gRPC client sends first
        b"GET / HTTP/1.1\r\n",
        frame.encode_request(1, 1, b"x"),  # a frame, but not HELLO
        struct.pack("<IBBI", 22, 1, 0, 0) + b"NOPE" + bytes(12),  # HELLO kind, wrong magic
    ],
)
def test_non_raftmq_peer_is_refused_on_its_first_bytes(first: bytes) -> None:
    dec = FrameDecoder(expect_hello=True)
    with pytest.raises(ProtocolError) as info:
        dec.feed(first[:14])
    assert dec.buffered_bytes == 0
    if first.startswith(b"PRI"):
        assert "gRPC" in info.value.message


def test_hello_checks() -> None:
    body = frame.encode_hello(Hello(version=9))[frame.HEADER_BYTES :]
    assert frame.decode_hello(body).version == 9  # the shell refuses versions, not the codec
    with pytest.raises(ProtocolError, match="auth_len"):
        frame.decode_hello(body + b"x")
    with pytest.raises(ProtocolError, match="max_frame_bytes"):
        frame.decode_hello(frame.encode_hello(Hello(max_frame_bytes=10))[frame.HEADER_BYTES :])


def test_local_misuse_raises_local_protocol_error() -> None:
    with pytest.raises(frame.LocalProtocolError):
        frame.encode_request(-1, 1, b"")
    with pytest.raises(frame.LocalProtocolError):
        frame.encode_request(1, 70000, b"")
    with pytest.raises(frame.LocalProtocolError):
        FrameDecoder(10, expect_hello=False)


def test_writelines_helpers_do_not_copy_payloads() -> None:
    out: list[frame.BytesLike] = []
    payload = memoryview(b"p" * 100)
    n = frame.request_into(out, 3, 2, payload)
    n += frame.frame_into(out, Kind.PONG, 4)
    assert out[1] is payload
    assert n == sum(len(p) for p in out)
    assert b"".join(out) == frame.encode_request(3, 2, payload) + frame.encode_frame(Kind.PONG, 4)


# ---- Hypothesis -----------------------------------------------------------------------------

_kinds = st.sampled_from([Kind.REQUEST, Kind.RESPONSE, Kind.ERROR, Kind.PING, Kind.PONG])
_frames = st.lists(
    st.tuples(
        _kinds,
        st.integers(0, frame.MAX_REQUEST_ID),
        st.integers(0, frame.MAX_METHOD),
        st.binary(max_size=300),
    ),
    max_size=20,
)


def _encode(kind: Kind, rid: int, method: int, payload: bytes) -> bytes:
    if kind is Kind.REQUEST:
        return frame.encode_request(rid, method, payload)
    return frame.encode_frame(kind, rid, payload)


def _plain(frames: list[Frame]) -> list[tuple[Kind, int, int, int, bytes]]:
    return [(f.kind, f.flags, f.request_id, f.method, bytes(f.payload)) for f in frames]


@settings(max_examples=300, deadline=None)
@given(_frames, st.lists(st.integers(0, 10_000), max_size=12))
def test_any_split_decodes_identically(
    specs: list[tuple[Kind, int, int, bytes]], cuts: list[int]
) -> None:
    stream = HELLO + b"".join(_encode(*s) for s in specs)
    whole = FrameDecoder(expect_hello=True).feed(stream)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    dec = FrameDecoder(expect_hello=True)
    pieces: list[Frame] = []
    for a, b in itertools.pairwise(points):
        pieces += dec.feed(stream[a:b])
    dec.feed_eof()
    assert _plain(pieces) == _plain(whole)
    expected = [(k, 0, r, m if k is Kind.REQUEST else 0, p) for k, r, m, p in specs]
    assert _plain(whole)[1:] == expected


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400), st.booleans(), st.lists(st.integers(0, 400), max_size=6))
def test_garbage_raises_only_protocol_error(
    data: bytes, after_hello: bool, cuts: list[int]
) -> None:
    dec = FrameDecoder(2048, expect_hello=not after_hello)
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    try:
        for a, b in itertools.pairwise(points):
            for f in dec.feed(data[a:b]):
                if f.kind is Kind.HELLO:
                    frame.decode_hello(f.payload)
                elif f.kind in (Kind.ERROR, Kind.GOAWAY):
                    frame.decode_error(f.payload)
        dec.feed_eof()
    except ProtocolError:
        pass
    assert dec.buffered_bytes <= len(data)


@settings(max_examples=300, deadline=None)
@given(_frames, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8))
def test_corrupted_streams_raise_only_protocol_error(
    specs: list[tuple[Kind, int, int, bytes]], flips: list[tuple[int, int]]
) -> None:
    stream = bytearray(HELLO + b"".join(_encode(*s) for s in specs))
    for pos, value in flips:
        stream[pos % len(stream)] = value
    dec = FrameDecoder(4096, expect_hello=True)
    try:
        for f in dec.feed(bytes(stream)):
            if f.kind is Kind.HELLO:
                frame.decode_hello(f.payload)
            elif f.kind is Kind.ERROR:
                frame.decode_error(f.payload)
        dec.feed_eof()
    except ProtocolError:
        pass


# ---- reading into the decoder's buffers (a server's BufferedProtocol, issue 24) ---------------


def _read_into(dec: FrameDecoder, stream: bytes, reads: list[int]) -> list[Frame]:
    """Drive `dec` as the loop drives a BufferedProtocol: each read fills at most the buffer it
    was given, and at most the next read size of `reads` (cycled)."""
    out: list[Frame] = []
    pos, k = 0, 0
    while pos < len(stream):
        room = dec.get_buffer()
        n = min(
            len(room), max(1, reads[k % len(reads)] if reads else len(stream)), len(stream) - pos
        )
        room[:n] = stream[pos : pos + n]
        pos += n
        k += 1
        out += dec.buffer_updated(n)
    return out


_big_frames = st.lists(
    st.tuples(
        _kinds,
        st.integers(0, frame.MAX_REQUEST_ID),
        st.integers(0, frame.MAX_METHOD),
        st.one_of(st.binary(max_size=40), st.binary(min_size=100, max_size=700)),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    _big_frames,
    st.lists(st.integers(1, 900), max_size=10),
    st.sampled_from([0, 256, 64 * 1024]),
)
def test_reads_into_the_buffers_decode_as_the_whole_stream(
    specs: list[tuple[Kind, int, int, bytes]], reads: list[int], budget: int
) -> None:
    """Any read sizes, a scratch smaller than some frames, a pool that lends none, some or all
    whole-frame buffers: the same frames, in order, as the stream decoded at once."""
    stream = HELLO + b"".join(_encode(*s) for s in specs)
    whole = FrameDecoder(expect_hello=True).feed(stream)
    buffers = frame.FrameBuffers(budget, scratch=64)
    got = _read_into(FrameDecoder(expect_hello=True, buffers=buffers), stream, reads)
    assert _plain(got) == _plain(whole)
    assert buffers.pooled_bytes <= budget


def test_a_stream_split_at_every_byte_decodes_the_same() -> None:
    """Two reads, cut at every byte of a stream of small and large frames, fed or read into."""
    specs = [
        (Kind.REQUEST, 1, 7, b"a" * 3),
        (Kind.REQUEST, 2, 7, bytes(range(256)) * 3),
        (Kind.PING, 3, 0, b""),
        (Kind.RESPONSE, 4, 0, b"z" * 90),
    ]
    stream = HELLO + b"".join(_encode(*s) for s in specs)
    whole = _plain(FrameDecoder(expect_hello=True).feed(stream))
    for cut in range(len(stream) + 1):
        fed = FrameDecoder(expect_hello=True)
        assert _plain(fed.feed(stream[:cut]) + fed.feed(stream[cut:])) == whole, cut
        for budget in (0, 1 << 20):
            dec = FrameDecoder(expect_hello=True, buffers=frame.FrameBuffers(budget, scratch=128))
            assert _plain(_read_into(dec, stream, [cut, len(stream)])) == whole, (cut, budget)
            dec.feed_eof()


def test_a_large_request_is_read_into_a_pooled_buffer_reused_only_once_unreferenced() -> None:
    buffers = frame.FrameBuffers(1 << 20, scratch=256)
    dec = FrameDecoder(expect_hello=True, buffers=buffers)
    assert dec.buffer_updated(0) == []
    body = b"x" * 5000
    [_hello, first] = _read_into(dec, HELLO + frame.encode_request(1, 2, body), [300])
    assert bytes(first.payload) == body
    assert type(first.payload.obj) is bytearray and buffers.lent == 1  # read there, no copy
    pooled = id(first.payload.obj)  # (not a reference: one would keep the buffer lent)
    view = first.payload[10:20]  # a handler's slice of the request outlives the frame
    del first
    [second] = _read_into(dec, frame.encode_request(2, 2, b"y" * 5000), [300])
    assert id(second.payload.obj) != pooled  # a view of the first still lives: not reused
    assert bytes(view) == b"x" * 10
    assert buffers.lent == 2
    del view
    assert buffers.lent == 1
    [third] = _read_into(dec, frame.encode_request(3, 2, b"z" * 5000), [300])
    assert id(third.payload.obj) == pooled  # nothing refers to the first's buffer: reused
    assert bytes(third.payload) == b"z" * 5000 and bytes(second.payload) == b"y" * 5000
    assert buffers.pooled_bytes == 2 * 64 * 1024  # two buffers made, the third request reused one


def test_without_room_in_the_pool_a_frame_grows_as_its_bytes_arrive() -> None:
    """A header alone commits no memory past the pool: an 8 MiB frame announced with 1 KiB sent
    holds a buffer of what arrived (at least 4 KiB), not 8 MiB."""
    dec = FrameDecoder(expect_hello=True, buffers=frame.FrameBuffers(0, scratch=1024))
    _read_into(dec, HELLO, [])
    head = frame.encode_request(1, 2, b"q" * (8 * 1024 * 1024 - 100))[:1024]
    assert _read_into(dec, head, []) == []
    assert dec.buffered_bytes == 1024
    assert len(dec.get_buffer()) <= 4096


def test_a_small_request_across_two_reads_takes_no_pooled_buffer() -> None:
    """Only a frame larger than the scratch is lent a pooled buffer: a pull that straddled two
    reads and is then held for seconds must not pin one."""
    buffers = frame.FrameBuffers(1 << 20, scratch=256)
    dec = FrameDecoder(expect_hello=True, buffers=buffers)
    stream = HELLO + frame.encode_request(1, 2, b"p" * 200)
    [_hello, pull] = _read_into(dec, stream, [len(HELLO) + 50, 1000])
    assert bytes(pull.payload) == b"p" * 200
    assert buffers.pooled_bytes == 0 and len(pull.payload.obj) == 4 + 6 + 2 + 200
