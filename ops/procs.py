"""Child processes of raftmq's tooling: the environment a role process is started with, so it
imports the same raftmq as its parent whether raftmq runs from a checkout or is installed."""

from __future__ import annotations

import os
from pathlib import Path

import raftmq

# The directory that holds the `raftmq` package: the checkout (raftmq/ links its role folders)
# or site-packages. A child gets it first on PYTHONPATH.
CODE_ROOT = Path(raftmq.__file__).resolve().parents[1]


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment without RAFTMQ_* settings (a child takes its settings from its
    flags only), with CODE_ROOT first on PYTHONPATH and unbuffered output for its log."""
    env = {
        k: v
        for k, v in (base if base is not None else os.environ).items()
        if not k.startswith("RAFTMQ_")
    }
    env["PYTHONPATH"] = str(CODE_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env
