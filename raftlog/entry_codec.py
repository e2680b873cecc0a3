"""Binary layout of a data entry: the submissions that group commit packed into one Raft entry.

Sans-I/O: bytes in, bytes out. A data command is `DATA_COMMAND_TYPE` + u32 count + count x u32
lengths + the chunks, so replication and reads never unpickle message bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

# pysyncobj's own command types are 0..3 (REGULAR, NO_OP, MEMBERSHIP, VERSION); pysyncobj skips any
# other type at apply time, which is exactly what a data entry needs (its meaning is the reader's).
DATA_COMMAND_TYPE = 0x40
_TYPE = bytes([DATA_COMMAND_TYPE])
_COUNT = struct.Struct("<I")
HEADER_BYTES = 1 + _COUNT.size
PER_CHUNK_BYTES = 4


class MalformedEntryError(ValueError):
    """A data command whose framing does not add up (a bug or corruption, never served)."""


def encoded_size(chunk_sizes: Sequence[int]) -> int:
    return HEADER_BYTES + PER_CHUNK_BYTES * len(chunk_sizes) + sum(chunk_sizes)


def encode_data(chunks: Sequence[bytes | bytearray | memoryview]) -> bytes:
    if not chunks:
        raise ValueError("a data entry carries at least one chunk")
    lengths = struct.pack(f"<{len(chunks)}I", *(len(c) for c in chunks))
    return b"".join((_TYPE, _COUNT.pack(len(chunks)), lengths, *chunks))


def is_data(command: bytes) -> bool:
    return len(command) > 0 and command[0] == DATA_COMMAND_TYPE


def decode_data(command: bytes) -> tuple[bytes, ...]:
    """Chunks of a data command, in submission order; () for pysyncobj's own commands."""
    if not is_data(command):
        return ()
    if len(command) < HEADER_BYTES:
        raise MalformedEntryError("data entry shorter than its header")
    (count,) = _COUNT.unpack_from(command, 1)
    if count == 1 and len(command) >= HEADER_BYTES + PER_CHUNK_BYTES:
        # One submission per entry (a synchronous sender's every entry): one slice, no table.
        (length,) = _COUNT.unpack_from(command, HEADER_BYTES)
        if HEADER_BYTES + PER_CHUNK_BYTES + length != len(command):
            raise MalformedEntryError("data entry chunk lengths do not add up to its size")
        chunk = command[HEADER_BYTES + PER_CHUNK_BYTES :]
        return (chunk if type(chunk) is bytes else bytes(chunk),)
    table_end = HEADER_BYTES + PER_CHUNK_BYTES * count
    if count == 0 or table_end > len(command):
        raise MalformedEntryError(f"data entry declares {count} chunks that do not fit")
    lengths = struct.unpack_from(f"<{count}I", command, HEADER_BYTES)
    if table_end + sum(lengths) != len(command):
        raise MalformedEntryError("data entry chunk lengths do not add up to its size")
    view = memoryview(command)
    chunks: list[bytes] = []
    pos = table_end
    for n in lengths:
        chunks.append(bytes(view[pos : pos + n]))
        pos += n
    return tuple(chunks)
