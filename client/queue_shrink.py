"""What shrinking a topic's queues would strand: the messages stored in the queues to drop that a
consumer group has not consumed yet (or, while no group has committed on the topic, every one
stored). Pure: offsets in, a verdict and its sentence out; it never asks a broker (Admin does)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from raftmq.common.types import QueueRef


@dataclass(frozen=True, slots=True)
class StrandedQueue:
    """A queue to drop that still holds messages someone has not read."""

    queue: QueueRef
    unconsumed: int  # by the group furthest behind (all stored when no group has committed)
    groups: tuple[str, ...]  # the groups behind on it; () when no group has committed


def stranded(
    bounds: Mapping[QueueRef, tuple[int, int]],
    committed: Mapping[str, Mapping[QueueRef, int | None]],
) -> list[StrandedQueue]:
    """The queues of `bounds` (min offset, max offset of each queue to drop) holding messages a
    group of `committed` (its committed offset per queue; None: never committed there) has not
    consumed, in queue order. With no group, every stored message counts: a group that starts
    later from the beginning would never see them."""
    out = []
    for q, (low, high) in sorted(bounds.items()):
        if not committed:
            if high > low:
                out.append(StrandedQueue(q, high - low, ()))
            continue
        behind = {}
        for group, offsets in committed.items():
            start = offsets.get(q)
            lag = high - max(low, low if start is None else start)
            if lag > 0:
                behind[group] = lag
        if behind:
            out.append(StrandedQueue(q, max(behind.values()), tuple(sorted(behind))))
    return out


def refusal(topic: str, queues: int, found: Sequence[StrandedQueue]) -> str:
    """Why `topic update --queues N` is refused, naming what would become unreachable."""
    total = sum(s.unconsumed for s in found)
    where = ", ".join(f"{s.queue.broker_group}#{s.queue.queue_id} ({s.unconsumed})" for s in found)
    groups = sorted({g for s in found for g in s.groups})
    whose = (
        f"not yet consumed by {', '.join(groups)}"
        if groups
        else "that no consumer group has read (none has committed on the topic)"
    )
    return (
        f"topic {topic!r}: shrinking to {queues} queues per broker group drops queues holding "
        f"{total} messages {whose}: {where}; consume them first (`raftmq group lag GROUP --topic "
        f"{topic}`), or shrink anyway with --drop-unconsumed (drop_unconsumed=True in the SDK): "
        "those messages become unreachable to every consumer group"
    )
