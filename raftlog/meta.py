"""Raft's durable per-node state (current term, vote, commit index hint) and the atomic file write.

A store replaces its file atomically and fsyncs before returning; it must never hand back a value
from a file that failed its checksum, nor leave a half-written file under the real name.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from raftmq.raftlog.errors import CorruptJournalError

_CRC = struct.Struct("<I")
_MAX_META_BYTES = 64 << 10  # a meta body is ~100 bytes; anything bigger is not ours


@dataclass(frozen=True, slots=True)
class RaftMeta:
    current_term: int = 0
    voted_for: str | None = None
    commit_index: int = 0

    def __post_init__(self) -> None:
        if self.current_term < 0 or self.commit_index < 0:
            raise ValueError(f"term and commit index must be >= 0, got {self}")


def fsync_directory(directory: Path) -> None:
    """Make creations, removals and renames inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file, durably.

    Writes a sibling temporary file, fsyncs it, renames it over `path`, then fsyncs the directory
    (without that last step the rename itself may be lost on power failure).
    """
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)


def encode_meta(meta: RaftMeta) -> bytes:
    body = json.dumps(
        {
            "current_term": meta.current_term,
            "voted_for": meta.voted_for,
            "commit_index": meta.commit_index,
        },
        separators=(",", ":"),
    ).encode()
    return _CRC.pack(zlib.crc32(body)) + body


def decode_meta(data: bytes, path: Path) -> RaftMeta:
    """Parse a meta file's bytes; any damage raises CorruptJournalError naming `path`."""
    if len(data) < _CRC.size:
        raise CorruptJournalError(str(path), 0, f"meta file is {len(data)} bytes, too short")
    (crc,) = _CRC.unpack_from(data)
    body = data[_CRC.size :]
    if zlib.crc32(body) != crc:
        raise CorruptJournalError(str(path), 0, "meta file checksum mismatch")
    try:
        obj = json.loads(body)
        term, voted, commit = obj["current_term"], obj["voted_for"], obj["commit_index"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptJournalError(str(path), _CRC.size, f"meta body unreadable: {exc}") from exc
    # bool is an int subclass; a checksummed file holding one is still not ours.
    if not (
        type(term) is int and type(commit) is int and (voted is None or isinstance(voted, str))
    ):
        raise CorruptJournalError(str(path), _CRC.size, f"meta fields have wrong types: {obj}")
    try:
        return RaftMeta(term, voted, commit)
    except ValueError as exc:
        raise CorruptJournalError(str(path), _CRC.size, str(exc)) from exc


class MetaStore:
    """The file holding one node's RaftMeta. Not thread-safe: Raft's own thread owns it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> RaftMeta:
        """The stored meta; defaults when the file does not exist yet (a fresh node)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(_MAX_META_BYTES + 1)
        except FileNotFoundError:
            return RaftMeta()
        if len(data) > _MAX_META_BYTES:
            raise CorruptJournalError(str(self.path), 0, "meta file is larger than any meta")
        return decode_meta(data, self.path)

    def store(self, meta: RaftMeta) -> None:
        """Durable before returning: Raft sends no vote or term until this completes."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomically(self.path, encode_meta(meta))
