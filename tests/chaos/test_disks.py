"""TmpfsDisks: a small tmpfs per node, filled to the last byte and freed (needs root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftmq.chaos.disks import TmpfsDisks

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")


def test_fill_and_free(tmp_path: Path) -> None:
    d = tmp_path / "n0"
    with TmpfsDisks({"n0": d}, size_mib=4) as disks:
        assert os.path.ismount(d)
        written = disks.fill("n0")
        assert written > 3 << 20
        with pytest.raises(OSError):
            (d / "more").write_bytes(b"x" * 4096)
        disks.free("n0")
        (d / "more").write_bytes(b"x" * 4096)
    assert not os.path.ismount(d)
