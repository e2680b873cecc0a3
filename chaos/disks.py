"""Small disks for the full-disk faults: each named node's data directory on its own
size-limited tmpfs (mounted before the node starts, unmounted after it stops), which a fault
fills with a filler file and the heal frees. Needs root, as the rest of the chaos suite does;
it never touches a path outside the run's data directories."""

from __future__ import annotations

import contextlib
import errno
import shutil
import subprocess
from pathlib import Path
from types import TracebackType

FILLER = "chaos-filler"
DEFAULT_SIZE_MIB = 64  # the setting: room for a run's data, quickly filled
CHUNK_BYTES = 1 << 16


class TmpfsDisks:
    """Use as a context manager around the nodes' whole life."""

    def __init__(self, data_dirs: dict[str, Path], size_mib: int = DEFAULT_SIZE_MIB) -> None:
        self.data_dirs = dict(data_dirs)
        self.size_mib = size_mib
        self._mounted: list[Path] = []

    def __enter__(self) -> TmpfsDisks:
        try:
            for d in self.data_dirs.values():
                d.mkdir(parents=True, exist_ok=True)
                subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", f"size={self.size_mib}m", "tmpfs", str(d)],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                self._mounted.append(d)
        except BaseException:
            self.unmount()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.unmount()

    def unmount(self) -> None:
        while self._mounted:
            d = self._mounted.pop()
            # The node's log lives on its tmpfs: keep a copy beside it, or the run loses it.
            log = d / "process.log"
            with contextlib.suppress(OSError):
                if log.exists():
                    shutil.copyfile(log, d.parent / f"{d.name}.process.log")
            subprocess.run(["umount", "-l", str(d)], check=False, capture_output=True)

    def fill(self, name: str) -> int:
        """Write the filler until the node's disk has no space left; the bytes written."""
        path = self.data_dirs[name] / FILLER
        written = 0
        with open(path, "ab", buffering=0) as f:
            for size in (CHUNK_BYTES, 4096, 512, 1):  # down to the last partial page
                block = b"\0" * size
                while True:
                    try:
                        written += f.write(block) or 0
                    except OSError as exc:
                        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                            raise
                        break
        return written

    def free(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.data_dirs[name] / FILLER).unlink()

    def free_all(self) -> None:
        for name in self.data_dirs:
            self.free(name)
