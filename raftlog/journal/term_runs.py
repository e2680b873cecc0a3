"""The term-runs file: (first index of run, term) pairs with a CRC, so opening a journal needs no
header read per record. Encoding is pure; the two file helpers only read or atomically replace it.

A decoded file is trusted only if its crc, magic, version, length and ordering all check out.
"""

from __future__ import annotations

import bisect
import itertools
import struct
import zlib
from pathlib import Path

from raftmq.raftlog.meta import write_file_atomically

TERMS_FILE = "terms"
_TERMS_HEAD = struct.Struct("<4sII")  # magic, version, number of runs
_TERMS_MAGIC = b"RMQT"
_TERMS_VERSION = 1
_RUN = struct.Struct("<QQ")
_CRC = struct.Struct("<I")
MAX_TERMS_FILE_BYTES = 64 << 20

Run = tuple[int, int]  # (first index of the run, term)


def encode_runs(starts: list[int], terms: list[int]) -> bytes:
    body = _TERMS_HEAD.pack(_TERMS_MAGIC, _TERMS_VERSION, len(starts)) + b"".join(
        _RUN.pack(s, t) for s, t in zip(starts, terms, strict=True)
    )
    return body + _CRC.pack(zlib.crc32(body))


def decode_runs(data: bytes) -> list[Run] | None:
    """The runs stored in a terms file, or None if it is damaged or not ours."""
    if len(data) < _TERMS_HEAD.size + _CRC.size:
        return None
    body = data[: -_CRC.size]
    if zlib.crc32(body) != _CRC.unpack_from(data, len(body))[0]:
        return None
    magic, version, n = _TERMS_HEAD.unpack_from(body)
    if magic != _TERMS_MAGIC or version != _TERMS_VERSION:
        return None
    if len(body) != _TERMS_HEAD.size + n * _RUN.size:
        return None
    runs = [_RUN.unpack_from(body, _TERMS_HEAD.size + i * _RUN.size) for i in range(n)]
    for (s0, t0), (s1, t1) in itertools.pairwise(runs):
        if not (s1 > s0 and t1 > t0):
            return None
    return [(int(s), int(t)) for s, t in runs]


def runs_from(runs: list[Run], first_index: int) -> list[Run]:
    """The runs that describe records at or after first_index (the run covering it included)."""
    k = max(0, bisect.bisect_right([s for s, _ in runs], first_index) - 1)
    return runs[k:]


def load_terms_bytes(directory: Path) -> bytes | None:
    try:
        with open(directory / TERMS_FILE, "rb") as f:
            return f.read(MAX_TERMS_FILE_BYTES + 1)
    except FileNotFoundError:
        return None


def write_terms(directory: Path, starts: list[int], terms: list[int]) -> None:
    write_file_atomically(directory / TERMS_FILE, encode_runs(starts, terms))
