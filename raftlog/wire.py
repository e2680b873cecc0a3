"""FramedConnection: pysyncobj's TcpConnection rebuilt with `<IB` length+flags frames of pickle 5.

It unpickles network bytes, acceptable only because raft peers are trusted members of one cluster
(authenticated when a password is set); it must never raise a peer's error into the poller or block.
"""

from __future__ import annotations

import base64
import collections
import errno
import hmac
import ipaddress
import itertools
import logging
import pickle
import socket
import struct
import sys
import time
from collections.abc import Callable
from socket import socket as Socket
from typing import Any, Final, Protocol

from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE

log = logging.getLogger("raftlog.wire")

# Frame = header (payload length, flags) + payload; little-endian so every platform agrees.
FRAME_HEADER: Final = struct.Struct("<IB")
FRAME_HEADER_BYTES: Final = FRAME_HEADER.size
MAX_FRAME_BYTES: Final = 256 << 20  # payload limit both ways; a larger header is a protocol error
FLAG_ENCRYPTED: Final = 0x01  # payload is a Fernet token over the pickle
KNOWN_FLAGS: Final = FLAG_ENCRYPTED
PICKLE_PROTOCOL: Final = 5  # bytes stay bytes (protocol 2 round-trips them through latin-1 str)

# Fairness: one READ event reads at most this many chunks, so one peer streaming a large message
# cannot hold the single tick thread (research/raft.md section 3.5).
MAX_RECVS_PER_EVENT: Final = 8
# send() and WRITE events stop after this many socket writes; the WRITE subscription resumes.
MAX_SENDS_PER_FLUSH: Final = 16
MAX_CHUNKS_PER_SEND: Final = 64  # buffers gathered into one sendmsg() (IOV_MAX is 1024 on Linux)
# Frames smaller than this are copied into shared segments of about this size (one copy, fewer
# syscalls); larger payloads are queued as they are, never copied.
SEGMENT_BYTES: Final = 64 << 10
# Bytes queued to one peer before the connection is dropped: a sender without flow control
# (plain pysyncobj re-sends its log tail on every rewind) must not exhaust memory.
MAX_QUEUED_BYTES: Final = 1 << 30
DEFAULT_BUFFER_BYTES: Final = 1 << 16

# Fernet token layout (version byte, 8-byte big-endian timestamp, ...), base64url: the first
# 12 characters decode to exactly those 9 bytes.
_FERNET_PREFIX_CHARS: Final = 12
_FERNET_TIMESTAMP: Final = struct.Struct(">BQ")

_READ: Final[int] = POLL_EVENT_TYPE.READ
_WRITE: Final[int] = POLL_EVENT_TYPE.WRITE
_ERROR: Final[int] = POLL_EVENT_TYPE.ERROR


class Poller(Protocol):
    """The part of pysyncobj.poller.Poller a connection uses."""

    def subscribe(
        self, descr: int, callback: Callable[[int, int], None], eventMask: int
    ) -> None: ...

    def unsubscribe(self, descr: int) -> None: ...


class Encryptor(Protocol):
    """The part of cryptography.fernet.Fernet that pysyncobj's password option hands us."""

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes: ...

    def decrypt(self, token: bytes) -> bytes: ...


class BadFrameError(Exception):
    """The peer sent bytes that are not a valid frame; the connection is dropped, never raised."""


def encode_header(payload_bytes: int, flags: int) -> bytes:
    """Header for a payload of `payload_bytes`; refuses what the peer would reject."""
    if payload_bytes > MAX_FRAME_BYTES:
        # The caller's fault: a message this big would make every peer drop the connection.
        raise ValueError(
            f"raft message of {payload_bytes} bytes exceeds MAX_FRAME_BYTES={MAX_FRAME_BYTES}; "
            "lower the replication batch size"
        )
    if flags & ~KNOWN_FLAGS:
        raise ValueError(f"unknown frame flags {flags:#x}")
    return FRAME_HEADER.pack(payload_bytes, flags)


def next_frame(buf: bytearray, start: int) -> tuple[int, int, int] | None:
    """Locate the frame at `buf[start:]` without copying: (flags, payload_start, payload_end).

    None when the frame is not complete yet; BadFrameError as soon as the header is invalid, so an
    oversized length is rejected before its bytes are buffered.
    """
    if len(buf) - start < FRAME_HEADER_BYTES:
        return None
    payload_bytes, flags = FRAME_HEADER.unpack_from(buf, start)
    if payload_bytes > MAX_FRAME_BYTES:
        raise BadFrameError(f"frame_length={payload_bytes} exceeds max={MAX_FRAME_BYTES}")
    if flags & ~KNOWN_FLAGS:
        raise BadFrameError(f"unknown_flags={flags:#x}")
    payload_start = start + FRAME_HEADER_BYTES
    payload_end = payload_start + payload_bytes
    if payload_end > len(buf):
        return None
    return flags, payload_start, payload_end


def fernet_timestamp(token: bytes) -> int:
    """Timestamp field of a Fernet token; only meaningful once the token's HMAC was verified."""
    _version, timestamp = _FERNET_TIMESTAMP.unpack(
        base64.urlsafe_b64decode(token[:_FERNET_PREFIX_CHARS])
    )
    return int(timestamp)


def set_keepalive(sock: socket.socket, idle_s: int, interval_s: int, max_fails: int) -> None:
    """TCP keepalive: first probe after idle_s idle, then every interval_s, max_fails probes."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if sys.platform == "linux":
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max_fails)
    elif sys.platform == "darwin":
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPALIVE, idle_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max_fails)
    elif sys.platform == "win32":
        sock.ioctl(socket.SIO_KEEPALIVE_VALS, (1, idle_s * 1000, interval_s * 1000))


def _address_family(host: str) -> socket.AddressFamily:
    # The transport resolves names itself and hands us literal addresses.
    if ipaddress.ip_address(host).version == 4:
        return socket.AF_INET
    return socket.AF_INET6


class FramedConnection:
    """One TCP connection between two raft members, driven by pysyncobj's poller (one thread).

    Names and semantics follow pysyncobj.tcp_connection.TcpConnection so that transport.py and
    tcp_server.py can construct and drive it unchanged; only the bytes on the wire differ.
    """

    def __init__(
        self,
        poller: Poller,
        onMessageReceived: Callable[[Any], None] | None = None,
        onConnected: Callable[[], None] | None = None,
        onDisconnected: Callable[[], None] | None = None,
        socket: Socket | None = None,  # pysyncobj's keyword: an accepted, connected socket
        timeout: float = 10.0,
        sendBufferSize: int = DEFAULT_BUFFER_BYTES,
        recvBufferSize: int = DEFAULT_BUFFER_BYTES,
        keepalive: tuple[int, int, int] | None = None,
    ) -> None:
        if recvBufferSize <= 0 or sendBufferSize <= 0:
            raise ValueError("sendBufferSize and recvBufferSize must be positive")
        # Set by transport.py for the password option; see send() and _decode().
        self.sendRandKey: bytes | None = None
        self.recvRandKey: bytes | None = None
        self.recvLastTimestamp = 0
        self.encryptor: Encryptor | None = None

        self._poller = poller
        self._on_message = onMessageReceived
        self._on_connected = onConnected
        self._on_disconnected = onDisconnected
        self._timeout_s = timeout
        self._send_buffer_bytes = sendBufferSize
        self._recv_buffer_bytes = recvBufferSize
        self._keepalive = keepalive
        self._scratch = bytearray(recvBufferSize)  # recv_into target; never resized
        self._scratch_view = memoryview(self._scratch)
        # Write queue: chunks rather than one contiguous buffer, so neither appending nor consuming
        # copies queued bytes (compacting a few hundred MiB under the GIL stalled all three tick
        # threads of a test cluster for 0.45 s). Only the last chunk grows, at its end, and only
        # when it is a bytearray segment of small frames.
        self._wqueue: collections.deque[bytes | bytearray] = collections.deque()
        self._wqueue_bytes = 0  # sum of len() over _wqueue
        self._whead_sent = 0  # bytes of _wqueue[0] already written to the socket
        self._rbuf = bytearray()
        self._rstart = 0  # bytes of _rbuf already parsed and delivered
        self._last_read = time.monotonic()
        # Bumped whenever the socket is dropped or replaced: a callback may disconnect or even
        # reconnect this object, after which the caller's loop must not touch the old buffers.
        self._generation = 0
        self._subscribed_mask = 0
        self._connect_pending = False  # non-blocking connect() not yet confirmed by the poller
        self._peer = "?"
        self._socket: Socket | None = None
        self._fileno: int | None = None
        self._state: int = CONNECTION_STATE.DISCONNECTED
        if socket is not None:
            # Accepted by tcp_server.py: already connected.
            self._socket = socket
            self._fileno = socket.fileno()
            self._peer = _peer_name(socket)
            self._state = CONNECTION_STATE.CONNECTED
            socket.setblocking(False)
            self._apply_socket_options()
            self._subscribe()

    # -- pysyncobj's interface -------------------------------------------------------------------

    @property
    def state(self) -> int:
        return self._state

    def setOnConnectedCallback(self, onConnected: Callable[[], None] | None) -> None:
        self._on_connected = onConnected

    def setOnMessageReceivedCallback(self, onMessageReceived: Callable[[Any], None] | None) -> None:
        self._on_message = onMessageReceived

    def setOnDisconnectedCallback(self, onDisconnected: Callable[[], None] | None) -> None:
        self._on_disconnected = onDisconnected

    def setSockoptKeepalive(self) -> None:
        if self._socket is None or self._keepalive is None:
            return
        idle_s, interval_s, max_fails = self._keepalive
        set_keepalive(self._socket, idle_s, interval_s, max_fails)

    def fileno(self) -> int | None:
        return self._fileno

    def getSendBufferSize(self) -> int:
        """Bytes queued by send() and not yet accepted by the kernel."""
        return self._wqueue_bytes - self._whead_sent

    def connect(self, host: str | None, port: int) -> bool:
        """Start a non-blocking connect; onConnected fires from the poller once it completes."""
        if host is None:
            return False
        self._drop_socket()
        try:
            family = _address_family(host)
        except ValueError:
            log.warning("wire.connect_failed peer=%s:%s reason=not_an_ip_address", host, port)
            return False
        sock = socket.socket(family, socket.SOCK_STREAM)
        self._socket = sock
        self._peer = f"{host}:{port}"
        self._apply_socket_options()
        sock.setblocking(False)
        self._last_read = time.monotonic()
        err = sock.connect_ex((host, port))
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            log.debug("wire.connect_failed peer=%s reason=%s", self._peer, errno.errorcode.get(err))
            self._drop_socket()
            return False
        self._fileno = sock.fileno()
        self._state = CONNECTION_STATE.CONNECTING
        self._connect_pending = True
        self._subscribe()
        return True

    def send(self, message: Any) -> None:
        """Queue one message and write what the socket takes now; the rest goes on WRITE events."""
        if self._state == CONNECTION_STATE.DISCONNECTED:
            return  # like the original: dropped; transport.send() sees the state and reports it
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        payload = pickle.dumps(message, protocol=PICKLE_PROTOCOL)
        flags = 0
        if self.encryptor is not None:
            # pysyncobj stamps tokens with the monotonic clock; only per-connection order matters.
            payload = self.encryptor.encrypt_at_time(payload, int(time.monotonic()))
            flags |= FLAG_ENCRYPTED
        header = encode_header(len(payload), flags)
        if self.getSendBufferSize() + len(header) + len(payload) > MAX_QUEUED_BYTES:
            log.warning(
                "wire.send_queue_full peer=%s queued_bytes=%d max=%d",
                self._peer,
                self.getSendBufferSize(),
                MAX_QUEUED_BYTES,
            )
            self.disconnect()
            return
        self._enqueue(header, payload)
        if self._timed_out():
            return
        if not self._connect_pending:
            self._flush()
        if self._state != CONNECTION_STATE.DISCONNECTED:
            self._subscribe()

    def disconnect(self) -> None:
        notify = self._on_disconnected is not None and self._state != CONNECTION_STATE.DISCONNECTED
        self.sendRandKey = None
        self.recvRandKey = None
        self.recvLastTimestamp = 0
        self._drop_socket()
        if notify and self._on_disconnected is not None:
            self._on_disconnected()

    # -- internals -------------------------------------------------------------------------------

    def _apply_socket_options(self) -> None:
        sock = self._socket
        assert sock is not None
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_buffer_bytes)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.setSockoptKeepalive()

    def _drop_socket(self) -> None:
        """Close without callbacks; leaves a clean DISCONNECTED object that connect() can reuse."""
        self._generation += 1
        if self._fileno is not None:
            # Unsubscribe before close: once closed, the descriptor number may be reused.
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._subscribed_mask = 0
        self._connect_pending = False
        self._wqueue.clear()
        self._wqueue_bytes = 0
        self._whead_sent = 0
        self._rbuf = bytearray()
        self._rstart = 0
        self._state = CONNECTION_STATE.DISCONNECTED

    def _subscribe(self) -> None:
        """Poller mask: READ|ERROR, plus WRITE only while a connect or queued bytes wait for it."""
        if self._fileno is None:
            return
        mask = _READ | _ERROR
        if self._connect_pending or self._wqueue:
            mask |= _WRITE
        if mask != self._subscribed_mask:
            self._poller.subscribe(self._fileno, self._on_event, mask)
            self._subscribed_mask = mask

    def _timed_out(self) -> bool:
        if time.monotonic() - self._last_read > self._timeout_s:
            log.debug("wire.timeout peer=%s timeout_s=%s", self._peer, self._timeout_s)
            self.disconnect()
            return True
        return False

    def _on_event(self, descr: int, event: int) -> None:
        if descr != self._fileno:
            # A stale event for a descriptor we already let go of (poll results are batched).
            self._poller.unsubscribe(descr)
            return
        if event & _ERROR:
            self.disconnect()
            return
        if self._timed_out():
            return
        generation = self._generation
        if self._connect_pending and event & (_READ | _WRITE):
            self._finish_connect()
            if self._generation != generation:
                return
        if event & _WRITE:
            self._flush()
            if self._generation != generation:
                return
        if event & _READ:
            self._read_and_deliver()
            if self._generation != generation:
                return
        self._subscribe()

    def _finish_connect(self) -> None:
        sock = self._socket
        assert sock is not None
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            log.debug("wire.connect_failed peer=%s reason=%s", self._peer, errno.errorcode.get(err))
            self.disconnect()
            return
        generation = self._generation
        self._connect_pending = False
        # Same order as the original: onConnected runs while the state still says CONNECTING.
        if self._on_connected is not None:
            self._on_connected()
            if self._generation != generation:
                return
        self._state = CONNECTION_STATE.CONNECTED
        self._last_read = time.monotonic()

    def _enqueue(self, header: bytes, payload: bytes) -> None:
        queue = self._wqueue
        if len(payload) >= SEGMENT_BYTES:
            queue.append(header)
            queue.append(payload)
        else:
            tail = queue[-1] if queue else None
            if isinstance(tail, bytearray) and len(tail) < SEGMENT_BYTES:
                tail += header
                tail += payload
            else:
                queue.append(bytearray(header) + payload)
        self._wqueue_bytes += len(header) + len(payload)

    def _flush(self) -> None:
        sock = self._socket
        assert sock is not None
        queue = self._wqueue
        for _ in range(MAX_SENDS_PER_FLUSH):
            if not queue:
                break
            with memoryview(queue[0]) as head:
                views = [head[self._whead_sent :]]
            offered = views[0].nbytes
            # Offer about what the kernel can take (it doubles SO_SNDBUF): building views for a
            # deep backlog on every send() while the peer is slow costs more than the syscall.
            for chunk in itertools.islice(queue, 1, MAX_CHUNKS_PER_SEND):
                if offered >= 2 * self._send_buffer_bytes:
                    break
                views.append(memoryview(chunk))
                offered += len(chunk)
            try:
                if sys.platform == "win32":
                    sent = sock.send(views[0])
                else:
                    sent = sock.sendmsg(views)
            except BlockingIOError:
                break
            except OSError as e:
                log.debug("wire.send_failed peer=%s reason=%s", self._peer, e)
                self.disconnect()
                return
            finally:
                # Views on the tail segment would stop _enqueue() from growing it.
                for v in views:
                    v.release()
            self._consume_sent(sent)
            if sent < offered:
                break  # the kernel buffer is full: wait for a WRITE event

    def _consume_sent(self, sent: int) -> None:
        queue = self._wqueue
        done = self._whead_sent + sent
        while queue and done >= len(queue[0]):
            chunk_bytes = len(queue.popleft())
            done -= chunk_bytes
            self._wqueue_bytes -= chunk_bytes
        assert done == 0 or queue, "the kernel took more bytes than were queued"
        self._whead_sent = done

    def _read_and_deliver(self) -> None:
        sock = self._socket
        assert sock is not None
        generation = self._generation
        got_bytes = 0
        peer_closed = False
        for _ in range(MAX_RECVS_PER_EVENT):
            try:
                n = sock.recv_into(self._scratch, self._recv_buffer_bytes)
            except BlockingIOError:
                break
            except OSError as e:
                log.debug("wire.recv_failed peer=%s reason=%s", self._peer, e)
                self.disconnect()
                return
            if n == 0:
                peer_closed = True
                break
            got_bytes += n
            self._rbuf += self._scratch_view[:n]
            if n < self._recv_buffer_bytes:
                break  # drained: another recv would only say EAGAIN
        if got_bytes:
            self._last_read = time.monotonic()
        try:
            self._deliver_frames()
        finally:
            if self._generation == generation:
                self._compact_read_buffer()
        if peer_closed and self._generation == generation:
            self.disconnect()

    def _deliver_frames(self) -> None:
        generation = self._generation
        while True:
            buf = self._rbuf
            try:
                frame = next_frame(buf, self._rstart)
                if frame is None:
                    return
                flags, payload_start, payload_end = frame
                with memoryview(buf) as view, view[payload_start:payload_end] as payload:
                    message = self._decode(payload, flags)
            except BadFrameError as e:
                self._bad_frame(str(e))
                return
            # Consume before the callback: if it raises, the next event resumes at the next frame.
            self._rstart = payload_end
            if self._on_message is not None:
                self._on_message(message)
                if self._generation != generation:
                    return

    def _decode(self, payload: memoryview, flags: int) -> Any:
        encryptor = self.encryptor
        data: memoryview | bytes = payload
        if encryptor is not None:
            # With a password set, plaintext must never be accepted: that would bypass it.
            if not flags & FLAG_ENCRYPTED:
                raise BadFrameError("plaintext frame on an encrypted connection")
            token = bytes(payload)
            try:
                # decrypt() verifies the HMAC, which covers the timestamp read next.
                data = encryptor.decrypt(token)
                timestamp = fernet_timestamp(token)
            except Exception as e:
                # cryptography's InvalidToken is no ValueError; any failure is the peer's.
                raise BadFrameError(f"decrypt_failed={type(e).__name__}") from e
            if timestamp < self.recvLastTimestamp:
                raise BadFrameError(
                    f"timestamp_went_back={timestamp} last={self.recvLastTimestamp}"
                )
            self.recvLastTimestamp = timestamp
        elif flags & FLAG_ENCRYPTED:
            raise BadFrameError("encrypted frame but no password configured")
        try:
            message = pickle.loads(data)
        except Exception as e:
            # Unpickling garbage can raise almost anything (EOFError, KeyError, ImportError, ...).
            raise BadFrameError(f"unpickle_failed={type(e).__name__}") from e
        expected_key = self.recvRandKey
        if expected_key:
            if not (
                isinstance(message, tuple)
                and len(message) == 2
                and isinstance(message[0], bytes)
                and hmac.compare_digest(message[0], expected_key)
            ):
                raise BadFrameError("wrong_rand_key")
            message = message[1]
        return message

    def _compact_read_buffer(self) -> None:
        if self._rstart == 0:
            return
        if self._rstart >= len(self._rbuf):
            self._rbuf = bytearray()
        else:
            del self._rbuf[: self._rstart]
        self._rstart = 0

    def _bad_frame(self, reason: str) -> None:
        log.warning("wire.bad_frame peer=%s reason=%s", self._peer, reason)
        self.disconnect()


def _peer_name(sock: socket.socket) -> str:
    try:
        addr = sock.getpeername()
    except OSError:
        return "?"
    return f"{addr[0]}:{addr[1]}"
