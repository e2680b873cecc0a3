"""Sans-I/O codec of the transaction events the leader puts in the Raft log: an end (commit,
rollback, unknown), a check sent, a move after max checks. Each is one chunk of an entry, kinds
20-22 of common/record_batch.py's Kind; every replica applies it with the time it carries (the
leader's clock when it proposed the event), never its own clock.

The half message itself is an ordinary produce batch of one message carrying the system
properties below (clients cannot set them: validate_message refuses reserved names), so its bytes
stay where that entry put them and a commit points the real topic's ConsumeQueue at them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from raftmq.broker.transaction import Resolution
from raftmq.common.record_batch import VERSION, Kind, MalformedBatchError

# RocketMQ's property names (MessageConst), set by the broker on a half message.
PROP_TRAN_MSG = "TRAN_MSG"  # "true": a half message
PROP_PRODUCER_GROUP = "PGROUP"
PROP_TRANSACTION_ID = "__transactionId__"
PROP_CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
# Not a RocketMQ name: the producer instance that sent the half (under the reserved prefix).
PROP_TRANSACTION_CLIENT = "__RMQ.TRANSACTION_CLIENT"

# The half message's batch-level mark: its producer id, one that no client can send
# (validate_producer_id refuses unprintable ids) and that no copy of a consumed message carries
# (consumers never see producer ids), unlike the TRAN_MSG property a committed message keeps.
HALF_PRODUCER_ID = "\x00transaction-half"

TXN_KINDS = frozenset({Kind.TXN_END, Kind.TXN_CHECK, Kind.TXN_MOVED})

_RESOLUTION_CODE = {Resolution.COMMIT: 1, Resolution.ROLLBACK: 2, Resolution.UNKNOWN: 3}
_CODE_RESOLUTION = {v: k for k, v in _RESOLUTION_CODE.items()}
_END_HEAD = struct.Struct("<BBBBQ")  # kind, version, resolution, from_check, ts ms
_CHECK_HEAD = struct.Struct("<BBBQ")  # kind, version, has client, ts ms
_MOVED_HEAD = struct.Struct("<BBQ")  # kind, version, ts ms
_U16 = struct.Struct("<H")
_U64_MAX = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class TxnEnd:
    txn_id: str
    resolution: Resolution
    ts_ms: int
    from_check: bool = False


@dataclass(frozen=True, slots=True)
class TxnCheck:
    txn_id: str
    ts_ms: int
    client: str | None  # None: no live producer of the group (the check still counts)


@dataclass(frozen=True, slots=True)
class TxnMoved:
    txn_id: str
    ts_ms: int


TxnRecord = TxnEnd | TxnCheck | TxnMoved


def _short(s: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > 0xFFFF:
        raise ValueError(f"string of {len(b)} bytes does not fit a transaction record")
    return _U16.pack(len(b)) + b


def _ts(ts_ms: int) -> int:
    if not 0 <= ts_ms <= _U64_MAX:
        raise ValueError(f"timestamp {ts_ms} out of range")
    return ts_ms


def encode_txn(record: TxnRecord) -> bytes:
    if isinstance(record, TxnEnd):
        head = _END_HEAD.pack(
            Kind.TXN_END,
            VERSION,
            _RESOLUTION_CODE[record.resolution],
            int(record.from_check),
            _ts(record.ts_ms),
        )
        return head + _short(record.txn_id)
    if isinstance(record, TxnCheck):
        head = _CHECK_HEAD.pack(
            Kind.TXN_CHECK, VERSION, int(record.client is not None), _ts(record.ts_ms)
        )
        return head + _short(record.txn_id) + _short(record.client or "")
    if isinstance(record, TxnMoved):
        return _MOVED_HEAD.pack(Kind.TXN_MOVED, VERSION, _ts(record.ts_ms)) + _short(record.txn_id)
    raise TypeError(f"not a transaction record: {type(record).__name__}")


def is_txn_chunk(chunk: bytes | bytearray | memoryview) -> bool:
    return len(chunk) > 0 and chunk[0] in TXN_KINDS


def decode_txn(data: bytes | bytearray | memoryview) -> TxnRecord:
    """The record in `data`; MalformedBatchError for any bad length, kind, version or string."""
    data = bytes(data)
    if len(data) < 2 or data[0] not in TXN_KINDS:
        raise MalformedBatchError("not a transaction record")
    if data[1] != VERSION:
        raise MalformedBatchError(f"transaction record version {data[1]} is not supported")
    try:
        if data[0] == Kind.TXN_END:
            _, _, code, from_check, ts = _END_HEAD.unpack_from(data, 0)
            if code not in _CODE_RESOLUTION or from_check > 1:
                raise MalformedBatchError(f"transaction end with resolution code {code}")
            txn_id, pos = _read_short(data, _END_HEAD.size)
            _end(data, pos)
            return TxnEnd(txn_id, _CODE_RESOLUTION[code], ts, bool(from_check))
        if data[0] == Kind.TXN_CHECK:
            _, _, has_client, ts = _CHECK_HEAD.unpack_from(data, 0)
            txn_id, pos = _read_short(data, _CHECK_HEAD.size)
            client, pos = _read_short(data, pos)
            _end(data, pos)
            return TxnCheck(txn_id, ts, client if has_client else None)
        _, _, ts = _MOVED_HEAD.unpack_from(data, 0)
        txn_id, pos = _read_short(data, _MOVED_HEAD.size)
        _end(data, pos)
        return TxnMoved(txn_id, ts)
    except struct.error as exc:
        raise MalformedBatchError(f"truncated transaction record: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise MalformedBatchError(f"invalid utf-8 in a transaction record: {exc}") from exc


def _read_short(data: bytes, pos: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(data, pos)
    end = pos + 2 + n
    if end > len(data):
        raise MalformedBatchError(f"string of {n} bytes at {pos} overruns the record")
    return data[pos + 2 : end].decode("utf-8"), end


def _end(data: bytes, pos: int) -> None:
    if pos != len(data):
        raise MalformedBatchError(f"{len(data) - pos} trailing bytes after a transaction record")
