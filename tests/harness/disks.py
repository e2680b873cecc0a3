"""A small tmpfs and a filler that leaves it with no free byte: a full disk for real processes
(the mount needs root; callers skip otherwise)."""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tmpfs(path: Path, size_mib: int) -> Iterator[Path]:
    path.mkdir(parents=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)], check=True
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Write a filler file until the file system has no space left."""
    filler = directory / "filler"
    chunk = b"\0" * (1 << 16)
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    for size in (4096, 512, 1):  # the last partial pages too
        with open(filler, "ab", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * size)
    return filler
