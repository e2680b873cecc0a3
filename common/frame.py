"""Sans-I/O codec of the framed data-path protocol (produce, pull, heartbeat, offset commit).

Turns bytes into `Frame`s and values into bytes; it owns no socket, clock or task (h11's model),
so `common/transport.py` and any other shell drive it. Garbage from the peer raises only
`ProtocolError`; misuse by the local caller raises `LocalProtocolError`.

Wire layout (all integers little-endian, like the stored record batches):

    frame    = u32 length | u8 kind | u8 flags | u32 request_id | body      (length = 6 + len(body))
    REQUEST  body = u16 method | payload            (the method rides in the body, not the kind
                                                     space: 65 535 methods, kinds stay few)
    RESPONSE body = payload
    ERROR    body = common_pb2.ErrorDetail          (the same error table as gRPC's trailers)
    PING     body = empty, request_id = ping sequence; PONG echoes the sequence
    GOAWAY   body = common_pb2.ErrorDetail (why),  request_id = the last request id accepted
    HELLO    body = "RMQF" | u16 version | u16 reserved (0) | u32 max_frame_bytes
                    | u16 auth_method (0 = none) | u16 auth_len | auth bytes
                    (a server's answer: auth_method 0, and auth bytes its notes, server_hello)

The first frame on a connection, in each direction, is HELLO: the client speaks first, the server
answers with its own HELLO (or GOAWAY and a close). A decoder that expects HELLO checks the first
header before waiting for more: a gRPC client (its preface starts "PRI * HTTP/2.0") or any other
peer fails on the first 4 to 10 bytes. `flags` is reserved: version 1 sends 0 and rejects others.
"""

from __future__ import annotations

import enum
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from raftmq.common import errors
from raftmq.common.pb import common_pb2

PROTOCOL_VERSION = 1
MAGIC = b"RMQF"
AUTH_NONE = 0
AUTH_HMAC_SHA1 = 1  # access key, date-time, signature (common/auth.py; issue 19)

# Frame sizes count the bytes after the u32 length (kind, flags, request id, body).
DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024  # a produce batch of 4 MiB (RocketMQ's cap) and room
MIN_MAX_FRAME_BYTES = 1024  # a peer must accept at least an ErrorDetail of a clipped message
MAX_HELLO_BYTES = 4096  # bounds what an unauthenticated peer can make us buffer
MAX_REQUEST_ID = 0xFFFF_FFFF
MAX_METHOD = 0xFFFF

_HEADER = struct.Struct("<IBBI")  # length, kind, flags, request_id
_REQ_HEADER = struct.Struct("<IBBIH")  # ... + method
_METHOD = struct.Struct("<H")
_HELLO = struct.Struct("<4sHHIHH")  # magic, version, reserved, max_frame_bytes, auth, auth_len
_LEN = struct.Struct("<I")

BytesLike = bytes | bytearray | memoryview


class Parts:
    """A payload in several buffers, written by `writelines` as they are: a SEND_STORED request
    of stored batches is never joined into one bytes object (a copy of every batch, issue 24)."""

    __slots__ = ("_size", "parts")

    def __init__(self, parts: Sequence[BytesLike]) -> None:
        self.parts = tuple(parts)
        self._size = sum(memoryview(p).nbytes for p in self.parts)

    def __len__(self) -> int:
        return self._size

    def join(self) -> bytes:
        return b"".join(self.parts)


Payload = BytesLike | Parts  # what a request carries, and an answer

HEADER_BYTES = _HEADER.size  # 10
REQUEST_HEADER_BYTES = _REQ_HEADER.size  # 12
_REST = HEADER_BYTES - _LEN.size  # bytes counted by `length` before the body: 6


class Kind(enum.IntEnum):
    """What a frame is. Values are on the wire: never renumber, only add."""

    HELLO = 1
    REQUEST = 2
    RESPONSE = 3
    ERROR = 4
    PING = 5
    PONG = 6
    GOAWAY = 7


# kind byte -> member (a tuple index is cheaper than Kind(k) on the hot path); None = unknown
_KINDS: tuple[Kind | None, ...] = tuple(
    Kind(k) if k in Kind._value2member_map_ else None for k in range(256)
)


class ProtocolError(Exception):
    """The peer broke the protocol (h11's RemoteProtocolError): close the connection.

    `error` is the typed error to send in the GOAWAY before closing (the peer's fault, so a
    caller-fault code) and to log.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_error(self) -> errors.RaftMQError:
        return errors.InvalidArgumentError(f"framed protocol error: {self.message}")


class LocalProtocolError(ValueError):
    """This process misused the codec (an id out of range, a body over the limit): a bug here."""


class Frame(NamedTuple):
    """One decoded frame. A NamedTuple, not a dataclass: one is built per request on the hot
    path and tuple construction is several times cheaper. `payload` is a slice of the received
    bytes (no copy); `method` is 0 unless kind is REQUEST."""

    kind: Kind
    flags: int
    request_id: int
    method: int
    payload: memoryview


@dataclass(frozen=True, slots=True)
class Hello:
    """The handshake either side sends first."""

    version: int = PROTOCOL_VERSION
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    auth_method: int = AUTH_NONE  # AUTH_NONE or AUTH_HMAC_SHA1 (signed, common/auth.py)
    auth: bytes = b""


# A server's HELLO answer authenticates nothing (the client's HELLO does), and clients of before
# read nothing of its auth fields; so the answer carries the server's notes there: u8 the newest
# stored batch version (common/stored_batch.py) its broker group accepts in SEND_STORED, which
# the SDK encodes in. No notes (a server of before): 0, that is the oldest version.
def server_hello(max_frame_bytes: int, batch_version: int) -> Hello:
    """The server's HELLO answer with its notes (batch_version 0: none)."""
    return Hello(
        max_frame_bytes=max_frame_bytes, auth=bytes((batch_version,)) * (batch_version > 0)
    )


def batch_version_of(hello: Hello) -> int:
    """The stored batch version a server's HELLO answer says its group accepts; 0: not said."""
    return hello.auth[0] if hello.auth else 0


# ---- decoding -----------------------------------------------------------------------------------

SCRATCH_BYTES = 64 * 1024  # a server's one read buffer for small frames (one read at a time)
_LEND_STEP = 64 * 1024  # lent buffers are rounded up to this, so frames of near sizes share them
_MIN_GROWN = 4096  # a frame's buffer when the pool is spent starts at this or what arrived


class FrameBuffers:
    """The buffers a server's connections read frames into (issue 24: the request's bytes read
    once, by the kernel, into the buffer the handler gets).

    `scratch`: one read buffer shared by every connection of a loop (reads happen one at a time
    and each is parsed before the next): complete frames in it are copied out, once each. An
    incomplete frame gets a buffer of its own that the socket then reads into directly: `lend`
    gives a whole-frame buffer from a pool bounded by `budget` bytes (reused, so no allocation,
    zeroing or page faults per request), None when the pool is spent, and the decoder then grows
    a buffer as the frame's bytes arrive, so a length alone never commits memory beyond the pool.

    A lent buffer goes back to the pool by itself: it is reused or freed only once nothing but
    the pool refers to it (a frame's payload, any memoryview cut from it or a handler's
    reference keeps it lent), so a pooled buffer is never rewritten under a live view.
    """

    def __init__(self, budget: int, *, scratch: int = SCRATCH_BYTES) -> None:
        self.budget = budget
        self.scratch_bytes = scratch
        self._scratch: bytearray | None = None  # allocated at the first buffered read
        self._bufs: list[bytearray] = []  # every pooled buffer, lent or not
        self.pooled_bytes = 0

    @property
    def scratch(self) -> bytearray:
        if self._scratch is None:
            self._scratch = bytearray(self.scratch_bytes)
        return self._scratch

    def lend(self, n: int) -> bytearray | None:
        """A buffer of at least `n` bytes that nothing else refers to, or None."""
        bufs = self._bufs
        best = -1
        for k in range(len(bufs)):
            size = len(bufs[k])
            if size >= n and self._idle(k) and (best < 0 or size < len(bufs[best])):
                best = k
        if best >= 0:
            return bufs[best]
        size = -(-n // _LEND_STEP) * _LEND_STEP
        if size > self.budget:
            return None
        if self.pooled_bytes + size > self.budget:
            self._free(self.pooled_bytes + size - self.budget)
            if self.pooled_bytes + size > self.budget:
                return None
        buf = bytearray(size)
        self._bufs.append(buf)  # (a new list if _free ran)
        self.pooled_bytes += size
        return buf

    @property
    def lent(self) -> int:
        """Pooled buffers in use now (referred to from outside the pool)."""
        return sum(not self._idle(k) for k in range(len(self._bufs)))

    def _idle(self, k: int) -> bool:
        """Whether only the pool refers to its k-th buffer: its list, and here the argument
        (a frame's payload, any view cut from it, a local anywhere is one more)."""
        return sys.getrefcount(self._bufs[k]) <= 2

    def _free(self, want: int) -> None:
        """Drop unused buffers, largest first, until `want` bytes are freed or none is left."""
        bufs = self._bufs
        idle = sorted((k for k in range(len(bufs)) if self._idle(k)), key=lambda k: -len(bufs[k]))
        dropped: set[int] = set()
        for k in idle:
            if want <= 0:
                break
            dropped.add(k)
            want -= len(bufs[k])
        if dropped:
            self._bufs = [bufs[k] for k in range(len(bufs)) if k not in dropped]
            self.pooled_bytes = sum(map(len, self._bufs))


class FrameDecoder:
    """Received bytes in, complete frames out: fed (`feed`, bytes the transport made) or read
    into (`get_buffer` / `buffer_updated`, an asyncio.BufferedProtocol's calls).

    Payloads are memoryview slices of a buffer that is not written again while they live: the
    bytes handed to `feed`, one copy of a read's complete frames, or an incomplete frame's own
    buffer (lent by `buffers` or grown as its bytes arrive), which the socket reads into. Memory
    held per connection is one incomplete frame: at most what was received, or a pooled buffer.
    """

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        *,
        expect_hello: bool,
        buffers: FrameBuffers | None = None,
    ):
        if max_frame_bytes < MIN_MAX_FRAME_BYTES:
            raise LocalProtocolError(f"max_frame_bytes {max_frame_bytes} < {MIN_MAX_FRAME_BYTES}")
        self.max_frame_bytes = max_frame_bytes
        self._expect_hello = expect_hello
        self._buffers = buffers if buffers is not None else FrameBuffers(0)
        # The incomplete frame: its buffer, bytes in it, and bytes it must hold (HEADER_BYTES
        # until its header is in, then the whole frame); None between frames.
        self._part: bytearray | None = None
        self._got = 0
        self._need = 0
        self._head_only = False  # _part holds a header whose frame's size is not read yet
        self._failed: ProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        return self._got if self._part is not None else 0

    def feed(self, data: bytes) -> list[Frame]:
        """Decode every complete frame in what was received so far; keep the incomplete tail."""
        self._check_failed()
        try:
            frames: list[Frame] = []
            view = memoryview(data)
            while view:
                if self._part is None:  # frames straight from `data`: views of it, no copy
                    if self._expect_hello:
                        self._check_hello_prefix(view)
                    pos = self._parse(view, frames, copy=False)
                    self._keep(view[pos:])
                    break
                room = self._room()
                n = min(len(room), len(view))
                room[:n] = view[:n]
                view = view[n:]
                self._filled(n, frames)
            return frames
        except ProtocolError as exc:
            raise self._fail(exc) from None

    def get_buffer(self) -> memoryview:
        """Where the next read goes: the incomplete frame's own buffer (only up to its end), or
        the shared scratch."""
        self._check_failed()
        if self._part is not None:
            return self._room()
        return memoryview(self._buffers.scratch)

    def buffer_updated(self, nbytes: int) -> list[Frame]:
        """`nbytes` were read into the last `get_buffer`: the frames they complete."""
        self._check_failed()
        try:
            frames: list[Frame] = []
            if self._part is not None:
                self._filled(nbytes, frames)
            elif nbytes:
                view = memoryview(self._buffers.scratch)[:nbytes]
                if self._expect_hello:
                    self._check_hello_prefix(view)
                pos = self._parse(view, frames, copy=True)
                self._keep(view[pos:])
            return frames
        except ProtocolError as exc:
            raise self._fail(exc) from None

    def feed_eof(self) -> None:
        """The peer closed its side: a partial frame left over is a truncation."""
        if self._part is not None and self._got:
            n = self._got
            self._part = None
            raise ProtocolError(f"connection closed inside a frame ({n} bytes of it received)")
        self._part = None

    def _check_failed(self) -> None:
        if self._failed is not None:
            raise self._failed  # a broken stream stays broken

    def _fail(self, exc: ProtocolError) -> ProtocolError:
        self._failed = exc
        self._part = None
        return exc

    def _room(self) -> memoryview:
        part = self._part
        assert part is not None
        if self._got == len(part) < self._need:  # grown, full, its frame longer: double it
            grown = bytearray(min(self._need, 2 * len(part)))
            grown[: self._got] = part  # a new buffer: the old one may still be exported
            self._part = part = grown
        return memoryview(part)[self._got : self._need]

    def _keep(self, tail: memoryview) -> None:
        """An incomplete frame's first bytes (copied once) into a buffer of its own."""
        if not tail:
            return
        if self._expect_hello:
            self._check_hello_prefix(tail)
        if len(tail) < HEADER_BYTES:  # its size is not known yet: a buffer for the header
            part = self._part = bytearray(HEADER_BYTES)
            self._need, self._head_only = HEADER_BYTES, True
        else:
            part = self._own(self._check_header(tail, 0)[0], len(tail))
        part[: len(tail)] = tail
        self._got = len(tail)

    def _own(self, length: int, have: int) -> bytearray:
        """A buffer for a frame of `length` (its u32 length excluded) of which `have` bytes are
        in: a frame larger than the scratch is lent one whole when the pool has room; a smaller one
        (a request that straddled two reads) or one the pool cannot take gets a buffer that grows
        as its bytes arrive, so a long poll held for seconds pins no pooled buffer."""
        need = _LEN.size + length
        buffers = self._buffers
        part = buffers.lend(need) if need > buffers.scratch_bytes else None
        if part is None:
            part = bytearray(min(need, max(have, _MIN_GROWN)))
        self._part, self._need, self._head_only = part, need, False
        return part

    def _filled(self, n: int, out: list[Frame]) -> None:
        """`n` more bytes are in the incomplete frame's buffer."""
        part = self._part
        assert part is not None
        self._got += n
        if self._expect_hello:
            self._check_hello_prefix(memoryview(part)[: self._got])
        if self._got < self._need:
            return
        if self._head_only:  # the header is in: the frame's size is known
            length = self._check_header(memoryview(part), 0)[0]
            if _LEN.size + length > HEADER_BYTES:
                self._own(length, HEADER_BYTES)[:HEADER_BYTES] = part
                return
        self._part = None
        view = memoryview(part)[: self._need]
        pos = self._parse(view, out, copy=False)
        assert pos == len(view), "a frame's own buffer holds exactly that frame"

    def _check_hello_prefix(self, data: bytes | bytearray | memoryview) -> None:
        """Reject a non-raftmq peer on its first bytes, before buffering anything it sends.
        The first frame is HELLO (or a GOAWAY: a server refusing the handshake)."""
        if len(data) >= _LEN.size:
            (length,) = _LEN.unpack_from(data, 0)
            if not _REST <= length <= MAX_HELLO_BYTES:
                raise ProtocolError(_not_raftmq(data))
        if len(data) >= HEADER_BYTES:
            kind = data[_LEN.size]
            if kind == Kind.GOAWAY:
                return
            magic = bytes(data[HEADER_BYTES : HEADER_BYTES + len(MAGIC)])
            if kind != Kind.HELLO or magic != MAGIC[: len(magic)]:
                raise ProtocolError(_not_raftmq(data))

    def _check_header(self, view: memoryview, pos: int) -> tuple[int, Kind, int]:
        """(length, kind, request id) of the header at `pos`, checked before its body is read."""
        length, kind_byte, flags, request_id = _HEADER.unpack_from(view, pos)
        if length > self.max_frame_bytes:
            raise ProtocolError(
                f"frame of {length} bytes exceeds max_frame_bytes {self.max_frame_bytes}"
            )
        if length < _REST:
            raise ProtocolError(f"frame length {length} is shorter than its header")
        kind = _KINDS[kind_byte]
        if kind is None:
            raise ProtocolError(f"unknown frame kind {kind_byte}")
        if flags:
            raise ProtocolError(f"reserved flags {flags:#04x} set on a {kind.name} frame")
        return length, kind, request_id

    def _parse(self, view: memoryview, out: list[Frame], *, copy: bool) -> int:
        """Append the complete frames at the start of `view` to `out`; the end of the last.
        copy: the payloads are cut from one copy of those frames (`view` is the scratch)."""
        pos, end = 0, len(view)
        spans: list[tuple[Kind, int, int, int, int]] = []  # kind, request id, method, body
        check = self._check_header
        while end - pos >= HEADER_BYTES:
            length, kind, request_id = check(view, pos)
            stop = pos + _LEN.size + length
            if stop > end:
                break
            if self._expect_hello:
                if kind is Kind.HELLO:
                    self._expect_hello = False
                elif kind is not Kind.GOAWAY:
                    raise ProtocolError(f"the first frame must be HELLO, not {kind.name}")
            elif kind is Kind.HELLO:
                raise ProtocolError("a second HELLO on one connection")
            if kind is Kind.REQUEST:
                if length < _REST + _METHOD.size:
                    raise ProtocolError("REQUEST frame without a method id")
                (method,) = _METHOD.unpack_from(view, pos + HEADER_BYTES)
                spans.append((kind, request_id, method, pos + REQUEST_HEADER_BYTES, stop))
            else:
                spans.append((kind, request_id, 0, pos + HEADER_BYTES, stop))
            pos = stop
        # From the scratch: one copy of the read's complete frames, each payload cut from it.
        src = memoryview(view[:pos].tobytes()) if copy and pos else view
        for kind, request_id, method, start, stop in spans:
            out.append(Frame(kind, 0, request_id, method, src[start:stop]))
        return pos


def _not_raftmq(data: bytes | bytearray | memoryview) -> str:
    head = bytes(data[:16])
    what = " (an HTTP/2 or gRPC client?)" if head.startswith(b"PRI * HTTP/2") else ""
    return (
        f"not a raftmq framed-protocol client{what}: a connection must start with a HELLO "
        f"frame carrying {MAGIC!r}; first bytes {head!r}"
    )


def decode_hello(payload: memoryview | bytes) -> Hello:
    """The peer's HELLO body; ProtocolError if it is not one this version understands."""
    if len(payload) < _HELLO.size:
        raise ProtocolError(f"HELLO of {len(payload)} bytes is shorter than {_HELLO.size}")
    magic, version, reserved, max_frame, auth_method, auth_len = _HELLO.unpack_from(payload, 0)
    if magic != MAGIC:
        raise ProtocolError(f"HELLO magic {magic!r} is not {MAGIC!r}")
    if reserved:
        raise ProtocolError(f"HELLO reserved field is {reserved}, not 0")
    if len(payload) != _HELLO.size + auth_len:
        raise ProtocolError(f"HELLO of {len(payload)} bytes does not match auth_len {auth_len}")
    if max_frame < MIN_MAX_FRAME_BYTES:
        raise ProtocolError(f"peer max_frame_bytes {max_frame} < {MIN_MAX_FRAME_BYTES}")
    return Hello(version, max_frame, auth_method, bytes(payload[_HELLO.size :]))


def decode_error(payload: memoryview | bytes) -> errors.RaftMQError:
    """The typed error an ERROR or GOAWAY frame carries (same class, code, message, details)."""
    try:
        detail = common_pb2.ErrorDetail.FromString(bytes(payload))
    except Exception as exc:  # protobuf's DecodeError; the body is the peer's garbage
        raise ProtocolError(f"ERROR frame body is not an ErrorDetail: {exc}") from exc
    return error_from_detail(detail)


_BY_CODE: Mapping[str, type[errors.RaftMQError]] = {r.code: r.exc for r in errors.ERROR_TABLE}


def error_from_detail(detail: common_pb2.ErrorDetail) -> errors.RaftMQError:
    """The error table's class for `detail.code`; an unknown code becomes InternalError."""
    try:
        code = common_pb2.ErrorCode.Name(detail.code)
    except ValueError:
        code = str(detail.code)
    exc_type = _BY_CODE.get(code)
    if exc_type is None:
        return errors.InternalError(
            f"peer answered with unknown error code {code}: {detail.message}",
            details={"code": code, **detail.details},
        )
    return exc_type(detail.message, leader_hint=detail.leader_hint, details=dict(detail.details))


# ---- encoding -----------------------------------------------------------------------------------


def request_into(
    out: list[BytesLike],
    request_id: int,
    method: int,
    payload: Payload,
) -> int:
    """Append a REQUEST's header and payload (not copied) to `out` for `writelines`; returns
    the frame's size on the wire."""
    length = _REST + _METHOD.size + len(payload)
    out.append(_REQ_HEADER.pack(length, Kind.REQUEST, 0, request_id, method))
    if isinstance(payload, Parts):
        out += payload.parts
    elif payload:
        out.append(payload)
    return _LEN.size + length


def frame_into(
    out: list[BytesLike],
    kind: Kind,
    request_id: int,
    payload: Payload = b"",
) -> int:
    """Append any non-REQUEST frame to `out` (its payload's parts not copied: a raw pull's
    answer, common/raw_pull.py); returns its size on the wire."""
    length = _REST + len(payload)
    out.append(_HEADER.pack(length, kind, 0, request_id))
    if isinstance(payload, Parts):
        out += payload.parts
    elif payload:
        out.append(payload)
    return _LEN.size + length


def encode_request(request_id: int, method: int, payload: Payload) -> bytes:
    if not 0 <= method <= MAX_METHOD:
        raise LocalProtocolError(f"method id {method} outside 0..{MAX_METHOD}")
    _check_id(request_id)
    parts: list[BytesLike] = []
    request_into(parts, request_id, method, payload)
    return b"".join(parts)


def encode_frame(kind: Kind, request_id: int, payload: BytesLike = b"") -> bytes:
    if kind is Kind.REQUEST:
        raise LocalProtocolError("use encode_request for REQUEST frames (they carry a method)")
    _check_id(request_id)
    parts: list[BytesLike] = []
    frame_into(parts, kind, request_id, payload)
    return b"".join(parts)


def encode_hello(hello: Hello) -> bytes:
    if len(hello.auth) > MAX_HELLO_BYTES - _REST - _HELLO.size:
        raise LocalProtocolError(f"auth of {len(hello.auth)} bytes does not fit a HELLO")
    body = (
        _HELLO.pack(
            MAGIC, hello.version, 0, hello.max_frame_bytes, hello.auth_method, len(hello.auth)
        )
        + hello.auth
    )
    return encode_frame(Kind.HELLO, 0, body)


def error_body(exc: errors.RaftMQError) -> bytes:
    """An ERROR or GOAWAY body: the error table's ErrorDetail (code, clipped message, details)."""
    return errors.to_detail(exc).SerializeToString()


def encode_error(request_id: int, exc: errors.RaftMQError) -> bytes:
    return encode_frame(Kind.ERROR, request_id, error_body(exc))


def encode_goaway(last_request_id: int, exc: errors.RaftMQError) -> bytes:
    return encode_frame(Kind.GOAWAY, last_request_id, error_body(exc))


def _check_id(request_id: int) -> None:
    if not 0 <= request_id <= MAX_REQUEST_ID:
        raise LocalProtocolError(f"request id {request_id} outside 0..{MAX_REQUEST_ID}")
