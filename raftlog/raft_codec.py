"""The native Raft shell's wire format: raft_messages values to plain binary frames and back, plus
the per-connection protection by the Raft password: AES-GCM sealing of each frame without TLS, a
proof in the hello under TLS.

Sans-I/O: bytes in, values out; never unpickles, never trusts a length it has not checked. The
sender and receiver ids are not on the wire: the connection's hello names the sender.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import Final

from raftmq.raftlog.election import LogPosition, PreVoteReply, PreVoteRequest
from raftmq.raftlog.raft_messages import (
    AppendEntries,
    AppendResponse,
    Entry,
    InstallSnapshot,
    Message,
    PreVote,
    PreVoteResponse,
    RequestVote,
    TimeoutNow,
    VoteResponse,
)
from raftmq.raftlog.snapshot import Snapshot

# frame = u32 body length | body; the first frame on a connection is the hello.
FRAME_HEADER: Final = struct.Struct("<I")
MAX_FRAME_BYTES: Final = 256 << 20
HELLO_MAGIC: Final = b"RMQR"
HELLO_VERSION: Final = 1
NONCE_BYTES: Final = 16
_KEY_SALT: Final = b"raftmq-native-raft-v1"

_U8 = struct.Struct("<B")
_HELLO = struct.Struct("<4sHB16s")  # magic, version, mode, nonce; then a proof, the sender id
_APPEND = struct.Struct("<QQQQI")  # term, prev_index, prev_term, commit, count
_ENTRY = struct.Struct("<QI")  # term, data length (indexes follow prev_index)
_APPEND_RESP = struct.Struct("<QBQQB")  # term, success, next_index, rejected_prev, eligible
_SNAP = struct.Struct("<QQQ")  # term, base_index, base_term; then the state
_VOTE = struct.Struct("<QQQB")  # term, last_term, last_index, transfer
_VOTE_RESP = struct.Struct("<QB")
_PRE_VOTE = struct.Struct("<QQQQ")  # round_id, term, last_term, last_index
_PRE_VOTE_RESP = struct.Struct("<QBQ")  # round_id, granted, term
_TERM = struct.Struct("<Q")

_APPEND_T, _APPEND_RESP_T, _SNAP_T, _VOTE_T, _VOTE_RESP_T, _PRE_T, _PRE_RESP_T, _TNOW_T = range(8)
_FETCH_T, _COPY_T = 8, 9
_COPY = struct.Struct("<QQB")  # index, term, found; then the record's bytes


@dataclass(frozen=True, slots=True)
class FetchRecord:
    """Repair, not Raft: "send me your copy of entry `index`" (ours failed its check)."""

    index: int


@dataclass(frozen=True, slots=True)
class RecordCopy:
    """The answer: a peer's checked copy, or data None when it has no good one."""

    index: int
    term: int
    data: bytes | None


Frame = Message | FetchRecord | RecordCopy


class BadMessageError(ValueError):
    """A frame that does not decode (a bug, a foreign peer or a wrong password): the connection
    carrying it is closed; Raft retries, so nothing else happens."""


def derive_key(password: str) -> bytes:
    """A 256-bit key from the Raft password (slow on purpose: done once per process)."""
    return hashlib.pbkdf2_hmac("sha256", password.encode(), _KEY_SALT, 100_000)


def looks_like_tls(first: bytes) -> bool:
    """Whether a connection's first byte opens a TLS handshake record (content type 22). Our
    hello frame opens with its length's low byte, 22 only for a 255-byte sender id, which no
    host:port is: so the two are told apart before either side reads a frame."""
    return first[:1] == b"\x16"


# How a connection protects its frames, the hello's mode byte:
PLAIN: Final = 0  # no password, no TLS
SEALED: Final = 1  # each frame AES-GCM sealed under the password (no TLS)
PROVED: Final = 2  # TLS carries the frames; the hello proves the password (HMAC), frames plain
MODES: Final = (PLAIN, SEALED, PROVED)
PROOF_BYTES: Final = 32


@dataclass(frozen=True, slots=True)
class Hello:
    sender: str
    mode: int
    nonce: bytes
    proof: bytes = b""  # PROVED only: hello_proof(key, nonce, sender)


def hello_mode(key: bytes | None, tls: bool) -> int:
    if key is None:
        return PLAIN
    return PROVED if tls else SEALED


def hello_proof(key: bytes, nonce: bytes, sender: str) -> bytes:
    """The password's proof in a hello under TLS: a fresh nonce per connection, and only the
    receiving node reads it (TLS), so it cannot be lifted off the wire and replayed."""
    return hmac.new(key, b"raftmq-raft-hello|" + nonce + sender.encode(), "sha256").digest()


def encode_hello(sender: str, mode: int, nonce: bytes, proof: bytes = b"") -> bytes:
    if (mode == PROVED) != (len(proof) == PROOF_BYTES):
        raise ValueError("a PROVED hello carries a proof of PROOF_BYTES, the others none")
    return _HELLO.pack(HELLO_MAGIC, HELLO_VERSION, mode, nonce) + proof + sender.encode()


def decode_hello(body: bytes) -> Hello:
    if len(body) < _HELLO.size:
        raise BadMessageError("hello too short: not a raftmq native Raft peer")
    magic, version, mode, nonce = _HELLO.unpack_from(body)
    if magic != HELLO_MAGIC or version != HELLO_VERSION:
        raise BadMessageError(f"not a raftmq native Raft peer (magic {magic!r}, v{version})")
    if mode not in MODES:
        raise BadMessageError(f"hello of unknown mode {mode}")
    pos = _HELLO.size
    proof = b""
    if mode == PROVED:
        proof, pos = body[pos : pos + PROOF_BYTES], pos + PROOF_BYTES
        if len(proof) != PROOF_BYTES:
            raise BadMessageError("hello's proof is truncated")
    try:
        sender = body[pos:].decode()
    except UnicodeDecodeError as exc:
        raise BadMessageError("hello sender id is not text") from exc
    return Hello(sender, mode, nonce, proof)


class Sealer:
    """AES-GCM over one direction of one connection: the nonce counts frames, so a frame
    replayed, dropped or reordered inside the connection fails to open (a whole recorded
    connection replayed only repeats old Raft messages, which Raft tolerates by design)."""

    def __init__(self, key: bytes, connection_nonce: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(hashlib.sha256(key + connection_nonce).digest())
        self._counter = 0

    def _nonce(self) -> bytes:
        self._counter += 1
        return self._counter.to_bytes(12, "little")

    def seal(self, body: bytes) -> bytes:
        return self._aead.encrypt(self._nonce(), body, None)

    def open(self, body: bytes | bytearray) -> bytes:
        from cryptography.exceptions import InvalidTag

        try:
            return self._aead.decrypt(self._nonce(), body, None)
        except InvalidTag as exc:
            raise BadMessageError(
                "frame failed authentication: is the Raft password the same on every node?"
            ) from exc


def encode(m: Frame) -> list[bytes]:
    """A message's frame body as buffers (entry data are not copied)."""
    if isinstance(m, FetchRecord):
        return [_U8.pack(_FETCH_T), _TERM.pack(m.index)]
    if isinstance(m, RecordCopy):
        head = _COPY.pack(m.index, m.term, m.data is not None)
        return [_U8.pack(_COPY_T), head, m.data or b""]
    if isinstance(m, AppendEntries):
        out = [
            _U8.pack(_APPEND_T),
            _APPEND.pack(m.term, m.prev_index, m.prev_term, m.commit, len(m.entries)),
        ]
        for e in m.entries:
            out.append(_ENTRY.pack(e.term, len(e.data)))
            out.append(e.data)
        return out
    if isinstance(m, AppendResponse):
        body = _APPEND_RESP.pack(m.term, m.success, m.next_index, m.rejected_prev, m.eligible)
        return [_U8.pack(_APPEND_RESP_T), body]
    if isinstance(m, InstallSnapshot):
        s = m.snapshot
        return [_U8.pack(_SNAP_T), _SNAP.pack(m.term, s.base_index, s.base_term), s.state]
    if isinstance(m, RequestVote):
        body = _VOTE.pack(m.term, m.last.last_term, m.last.last_index, m.transfer)
        return [_U8.pack(_VOTE_T), body]
    if isinstance(m, VoteResponse):
        return [_U8.pack(_VOTE_RESP_T), _VOTE_RESP.pack(m.term, m.granted)]
    if isinstance(m, PreVote):
        r = m.request
        body = _PRE_VOTE.pack(r.round_id, r.term, r.log.last_term, r.log.last_index)
        return [_U8.pack(_PRE_T), body]
    if isinstance(m, PreVoteResponse):
        p = m.reply
        return [_U8.pack(_PRE_RESP_T), _PRE_VOTE_RESP.pack(p.round_id, p.granted, p.term)]
    return [_U8.pack(_TNOW_T), _TERM.pack(m.term)]


def decode(body: bytes | bytearray, sender: str, to: str) -> Frame:
    """The message in a frame body from `sender` (named by its connection's hello)."""
    if not body:
        raise BadMessageError("empty frame")
    kind = body[0]
    try:
        if kind == _APPEND_T:
            return _decode_append(body, sender, to)
        if kind == _APPEND_RESP_T:
            term, ok, nxt, rej, elig = _APPEND_RESP.unpack_from(body, 1)
            return AppendResponse(sender, to, term, bool(ok), nxt, rej, bool(elig))
        if kind == _SNAP_T:
            term, base, base_term = _SNAP.unpack_from(body, 1)
            state = bytes(body[1 + _SNAP.size :])
            return InstallSnapshot(sender, to, term, Snapshot(base, base_term, state))
        if kind == _VOTE_T:
            term, lt, li, transfer = _VOTE.unpack_from(body, 1)
            return RequestVote(sender, to, term, LogPosition(lt, li), bool(transfer))
        if kind == _VOTE_RESP_T:
            term, granted = _VOTE_RESP.unpack_from(body, 1)
            return VoteResponse(sender, to, term, bool(granted))
        if kind == _PRE_T:
            rid, term, lt, li = _PRE_VOTE.unpack_from(body, 1)
            return PreVote(sender, to, PreVoteRequest(sender, rid, term, LogPosition(lt, li)))
        if kind == _PRE_RESP_T:
            rid, granted, term = _PRE_VOTE_RESP.unpack_from(body, 1)
            return PreVoteResponse(sender, to, PreVoteReply(sender, rid, bool(granted), term))
        if kind == _TNOW_T:
            (term,) = _TERM.unpack_from(body, 1)
            return TimeoutNow(sender, to, term)
        if kind == _FETCH_T:
            (index,) = _TERM.unpack_from(body, 1)
            return FetchRecord(index)
        if kind == _COPY_T:
            index, term, found = _COPY.unpack_from(body, 1)
            return RecordCopy(index, term, bytes(body[1 + _COPY.size :]) if found else None)
    except struct.error as exc:
        raise BadMessageError(f"message of kind {kind} is truncated") from exc
    raise BadMessageError(f"unknown message kind {kind}")


def _decode_append(body: bytes | bytearray, sender: str, to: str) -> AppendEntries:
    term, prev, prev_term, commit, count = _APPEND.unpack_from(body, 1)
    pos = 1 + _APPEND.size
    view = memoryview(body)
    entries: list[Entry] = []
    for k in range(count):
        eterm, n = _ENTRY.unpack_from(body, pos)
        pos += _ENTRY.size
        if pos + n > len(body):
            raise BadMessageError("append entry runs past its frame")
        entries.append(Entry(bytes(view[pos : pos + n]), prev + 1 + k, eterm))
        pos += n
    if pos != len(body):
        raise BadMessageError("append frame has trailing bytes")
    return AppendEntries(sender, to, term, prev, prev_term, commit, tuple(entries))
