"""The broker's name for LoopWaker, which lives in the floor (common/wakeups.py) since the SDK's
asyncio face uses it too."""

from __future__ import annotations

from raftmq.common.wakeups import LoopWaker

__all__ = ["LoopWaker"]
