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

The first frame on a connection, in each direction, is HELLO: the client speaks first, the server
answers with its own HELLO (or GOAWAY and a close). A decoder that expects HELLO checks the first
header before waiting for more: a gRPC client (its preface starts "PRI * HTTP/2.0") or any other
peer fails on the first 4 to 10 bytes. `flags` is reserved: version 1 sends 0 and rejects others.
"""

from __future__ import annotations

import enum
import struct
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


# ---- decoding -----------------------------------------------------------------------------------


class FrameDecoder:
    """Feed it received bytes, get complete frames back.

    Payloads are memoryview slices of an immutable bytes object (the data handed to `feed`, or
    the reads a frame spans joined once it is complete), so they stay valid after later feeds.
    Memory held is bounded by `max_frame_bytes` plus one read.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, *, expect_hello: bool):
        if max_frame_bytes < MIN_MAX_FRAME_BYTES:
            raise LocalProtocolError(f"max_frame_bytes {max_frame_bytes} < {MIN_MAX_FRAME_BYTES}")
        self.max_frame_bytes = max_frame_bytes
        self._expect_hello = expect_hello
        # The reads of an incomplete frame, kept as received and joined once when it completes
        # (one copy: a 1 MiB pull answer spans many reads, and growing a buffer by each read
        # then copying it out was two to three).
        self._pending: list[BytesLike] = []
        self._pending_bytes = 0
        self._need = HEADER_BYTES  # bytes pending before the next parse can progress
        self._failed: ProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        return self._pending_bytes

    def feed(self, data: bytes) -> list[Frame]:
        """Decode every complete frame in what was received so far; keep the incomplete tail."""
        if self._failed is not None:
            raise self._failed  # a broken stream stays broken
        try:
            return self._feed(data)
        except ProtocolError as exc:
            self._failed = exc
            self._pending, self._pending_bytes = [], 0
            raise

    def feed_eof(self) -> None:
        """The peer closed its side: a partial frame left over is a truncation."""
        if self._pending_bytes:
            n = self._pending_bytes
            self._pending, self._pending_bytes = [], 0
            raise ProtocolError(f"connection closed inside a frame ({n} bytes of it received)")

    def _feed(self, data: bytes) -> list[Frame]:
        if self._pending_bytes:
            self._pending.append(data if isinstance(data, bytes) else bytes(data))
            self._pending_bytes += len(data)
            if self._expect_hello:  # (the first frame only, at most MAX_HELLO_BYTES)
                self._check_hello_prefix(b"".join(self._pending))
            if self._pending_bytes < self._need:
                return []
            view = memoryview(b"".join(self._pending))  # one copy, once a frame is complete
            self._pending, self._pending_bytes = [], 0
        else:
            if not data:
                return []
            if self._expect_hello:
                self._check_hello_prefix(data)
            view = memoryview(data)
        frames: list[Frame] = []
        pos = self._parse(view, frames)
        if pos < len(view):
            tail = view[pos:]  # kept as it is: `data` is immutable, or the join made here
            self._pending = [tail if isinstance(view.obj, bytes) else bytes(tail)]
            self._pending_bytes = len(tail)
        return frames

    def _check_hello_prefix(self, data: bytes | bytearray) -> None:
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

    def _parse(self, view: memoryview, out: list[Frame]) -> int:
        pos, end, limit = 0, len(view), self.max_frame_bytes
        unpack = _HEADER.unpack_from
        while end - pos >= HEADER_BYTES:
            length, kind_byte, flags, request_id = unpack(view, pos)
            if length > limit:
                raise ProtocolError(f"frame of {length} bytes exceeds max_frame_bytes {limit}")
            if length < _REST:
                raise ProtocolError(f"frame length {length} is shorter than its header")
            kind = _KINDS[kind_byte]
            if kind is None:
                raise ProtocolError(f"unknown frame kind {kind_byte}")
            if flags:
                raise ProtocolError(f"reserved flags {flags:#04x} set on a {kind.name} frame")
            stop = pos + _LEN.size + length
            if stop > end:
                self._need = stop - pos
                return pos
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
                body = view[pos + REQUEST_HEADER_BYTES : stop]
            else:
                method = 0
                body = view[pos + HEADER_BYTES : stop]
            out.append(Frame(kind, flags, request_id, method, body))
            pos = stop
        self._need = HEADER_BYTES
        return pos


def _not_raftmq(data: bytes | bytearray) -> str:
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
