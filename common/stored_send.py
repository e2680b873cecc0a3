"""The SEND_STORED frame (issue 24): a producer's v2 stored batches (common/stored_batch.py) as
they are, and the leader's answer as fixed-size records, one per batch. Sans-I/O; no protobuf
and no Python object per message. Decoders raise only InvalidArgumentError (a request) or
MalformedBatchError (an answer), never struct.error or IndexError.

Request:  `<HHI` version 1, reserved 0, timeout ms; then per batch a u32 length and the batch.
Answer:   `<HHIq` version 1, group length, batch count, term; the group (utf-8); per batch a
          32-byte record `<HBBIqQII` (error code, duplicate, reserved, count, first offset, raft
          index, slot, first position); then, per failed batch in order, a u32 length and its
          ErrorDetail protobuf (the one error table's code, message and details: failures are
          rare, their text is not fixed-size); then, only when the broker held the answer for
          the user's produce quota (issue 27), a u32 of how long in ms.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from raftmq.common.errors import InvalidArgumentError, RaftMQError, to_detail
from raftmq.common.frame import Parts
from raftmq.common.pb import common_pb2
from raftmq.common.record_batch import MalformedBatchError

__all__ = [
    "BATCH_VERSION_DETAIL",
    "BatchAnswer",
    "StoredSendAnswer",
    "decode_answer",
    "decode_request",
    "encode_answer",
    "encode_request",
]

VERSION = 1
# A batch refused for its stored batch version (UnsupportedError) names the version its broker
# group accepts in this detail: the producer re-encodes the batch in it and sends it again.
BATCH_VERSION_DETAIL = "stored_batch_version"
_REQUEST = struct.Struct("<HHI")
_LEN = struct.Struct("<I")
_ANSWER = struct.Struct("<HHIq")
_RECORD = struct.Struct("<HBBIqQII")
RECORD_BYTES = _RECORD.size  # 32
_U32_MAX = 0xFFFF_FFFF


@dataclass(frozen=True, slots=True)
class BatchAnswer:
    """One batch's outcome: where it is (ids derived from raft_index, slot and first_position
    + i), or `error`. first_offset -1 with raft_index > 0: stored, offsets not known yet;
    raft_index 0: a duplicate whose original the broker no longer remembers."""

    count: int
    first_offset: int
    raft_index: int
    slot: int
    first_position: int
    duplicate: bool
    error: common_pb2.ErrorDetail | None = None


@dataclass(frozen=True, slots=True)
class StoredSendAnswer:
    broker_group: str
    term: int
    results: list[BatchAnswer]
    throttle_ms: int = 0  # how long the broker held the answer (the user's produce quota)


def request_parts(batches: Sequence[bytes | bytearray | memoryview], timeout_ms: int) -> Parts:
    """A SEND_STORED request as the buffers to write: the batches are not copied."""
    parts: list[bytes | bytearray | memoryview] = [
        _REQUEST.pack(VERSION, 0, max(0, min(timeout_ms, _U32_MAX)))
    ]
    pack = _LEN.pack
    for b in batches:
        parts.append(pack(len(b)))
        parts.append(b)
    return Parts(parts)


def encode_request(batches: Sequence[bytes | bytearray | memoryview], timeout_ms: int) -> bytes:
    return request_parts(batches, timeout_ms).join()


def decode_request(payload: memoryview, max_batches: int) -> tuple[int, list[memoryview]]:
    """(timeout ms, the batches as views of `payload`): lengths only, the batches are checked
    one by one by their reader (stored_batch.check_batch)."""
    size = payload.nbytes
    if size < _REQUEST.size:
        raise InvalidArgumentError(f"a SEND_STORED request of {size} bytes has no header")
    version, reserved, timeout_ms = _REQUEST.unpack_from(payload, 0)
    if version != VERSION or reserved:
        raise InvalidArgumentError(f"SEND_STORED request version {version} is not {VERSION}")
    at = _REQUEST.size
    batches: list[memoryview] = []
    while at < size:
        if len(batches) >= max_batches:
            raise InvalidArgumentError(
                f"more than {max_batches} batches in one SEND_STORED request"
            )
        if at + 4 > size:
            raise InvalidArgumentError(f"a batch length at byte {at} overruns the request")
        (n,) = _LEN.unpack_from(payload, at)
        at += 4
        if at + n > size:
            raise InvalidArgumentError(
                f"a batch of {n} bytes at byte {at} overruns the {size}-byte request"
            )
        batches.append(payload[at : at + n])
        at += n
    if not batches:
        raise InvalidArgumentError("a SEND_STORED request must carry at least one batch")
    return timeout_ms, batches


def encode_answer(
    broker_group: str,
    term: int,
    results: Sequence[BatchAnswer | RaftMQError],
    throttle_ms: int = 0,
) -> bytes:
    group = broker_group.encode("utf-8")
    parts = [_ANSWER.pack(VERSION, len(group), len(results), term), group]
    errors: list[bytes] = []
    pack = _RECORD.pack
    for r in results:
        if isinstance(r, RaftMQError):
            detail = to_detail(r)
            parts.append(pack(detail.code, 0, 0, 0, -1, 0, 0, 0))
            raw = detail.SerializeToString()
            errors.append(_LEN.pack(len(raw)))
            errors.append(raw)
        else:
            parts.append(
                pack(
                    0,
                    r.duplicate,
                    0,
                    r.count,
                    r.first_offset,
                    max(r.raft_index, 0),
                    r.slot,
                    r.first_position,
                )
            )
    parts.extend(errors)
    if throttle_ms > 0:  # absent when not held: unthrottled answers stay as they were
        parts.append(_LEN.pack(min(throttle_ms, _U32_MAX)))
    return b"".join(parts)


def decode_answer(raw: bytes) -> StoredSendAnswer:
    try:
        version, group_len, n, term = _ANSWER.unpack_from(raw, 0)
        if version != VERSION:
            raise MalformedBatchError(f"SEND_STORED answer version {version} is not {VERSION}")
        at = _ANSWER.size
        group = raw[at : at + group_len].decode("utf-8")
        at += group_len
        records = list(_RECORD.iter_unpack(raw[at : at + n * RECORD_BYTES]))
        if len(records) != n:
            raise MalformedBatchError(f"SEND_STORED answer: {len(records)} records, not {n}")
        at += n * RECORD_BYTES
        results: list[BatchAnswer] = []
        for code, dup, _, count, first, index, slot, position in records:
            error = None
            if code:
                (size,) = _LEN.unpack_from(raw, at)
                at += 4
                if at + size > len(raw):
                    raise MalformedBatchError("SEND_STORED answer: an error detail overruns it")
                error = common_pb2.ErrorDetail.FromString(raw[at : at + size])
                at += size
            results.append(BatchAnswer(count, first, index, slot, position, bool(dup), error))
        throttle_ms = 0
        if len(raw) - at == _LEN.size:
            (throttle_ms,) = _LEN.unpack_from(raw, at)
            at += _LEN.size
        if at != len(raw):
            raise MalformedBatchError(f"SEND_STORED answer: {len(raw) - at} bytes after it")
    except MalformedBatchError:
        raise
    except (struct.error, UnicodeDecodeError, DecodeError) as exc:
        raise MalformedBatchError(f"SEND_STORED answer is malformed: {exc}") from exc
    return StoredSendAnswer(group, term, results, throttle_ms)
