"""Queue allocation for clustering consumers (RocketMQ's strategies) and the rebalance diff.

Pure functions over values: every member of a group computes the same assignment from the same
membership because inputs are deduplicated and sorted here. Never does I/O or reads a clock.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from raftmq.common.types import QueueRef

DEFAULT_VIRTUAL_NODES = 10
MAX_VIRTUAL_NODES = 1024  # bounds the ring: members x virtual nodes hashes per rebalance


class AllocationStrategy(enum.Enum):
    AVERAGELY = "averagely"  # contiguous blocks; RocketMQ's default
    AVERAGELY_BY_CIRCLE = "averagely_by_circle"  # round robin
    CONSISTENT_HASH = "consistent_hash"  # few queues move when membership changes


def _sorted_inputs(
    queues: Iterable[QueueRef], members: Iterable[str]
) -> tuple[list[QueueRef], list[str]]:
    return sorted(set(queues)), sorted(set(members))


def allocate_averagely(
    queues: Iterable[QueueRef], members: Iterable[str], me: str
) -> list[QueueRef]:
    """RocketMQ's AllocateMessageQueueAveragely: member i of n gets a contiguous block of the
    sorted queues; the first `len(queues) % n` members get one more. Empty if `me` is absent."""
    mq_all, cid_all = _sorted_inputs(queues, members)
    if me not in cid_all or not mq_all:
        return []
    index, n, q = cid_all.index(me), len(cid_all), len(mq_all)
    base, extra = divmod(q, n)
    size = base + (1 if index < extra else 0)
    start = index * base + min(index, extra)
    return mq_all[start : start + size]


def allocate_averagely_by_circle(
    queues: Iterable[QueueRef], members: Iterable[str], me: str
) -> list[QueueRef]:
    """RocketMQ's AllocateMessageQueueAveragelyByCircle: queue j goes to member j mod n."""
    mq_all, cid_all = _sorted_inputs(queues, members)
    if me not in cid_all:
        return []
    return mq_all[cid_all.index(me) :: len(cid_all)]


def _stable_hash(key: str) -> int:
    # Python's hash() is randomized per process; members must agree, so use a real digest.
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _ring(members: list[str], virtual_nodes: int) -> tuple[list[int], list[str]]:
    # Ties between equal hashes are broken by member name, so the ring is the same everywhere.
    points = sorted(
        (_stable_hash(f"{member}-{i}"), member) for member in members for i in range(virtual_nodes)
    )
    return [h for h, _ in points], [m for _, m in points]


def _ring_owner(hashes: list[int], owners: list[str], queue: QueueRef) -> str:
    # The first ring point at or after the queue's hash, wrapping around: RocketMQ's router.
    pos = bisect.bisect_left(hashes, _stable_hash(str(queue)))
    return owners[pos % len(owners)]


def _check_virtual_nodes(virtual_nodes: int) -> None:
    if not 1 <= virtual_nodes <= MAX_VIRTUAL_NODES:
        raise ValueError(f"virtual_nodes must be in 1..{MAX_VIRTUAL_NODES}, got {virtual_nodes}")


def allocate_consistent_hash(
    queues: Iterable[QueueRef],
    members: Iterable[str],
    me: str,
    virtual_nodes: int = DEFAULT_VIRTUAL_NODES,
) -> list[QueueRef]:
    """RocketMQ's AllocateMessageQueueConsistentHash: members own `virtual_nodes` points each on
    a hash ring and a queue goes to the owner of the next point. When a member leaves, only its
    own queues move. The split is uneven for small groups; that is the price of stability."""
    _check_virtual_nodes(virtual_nodes)
    mq_all, cid_all = _sorted_inputs(queues, members)
    if me not in cid_all:
        return []
    hashes, owners = _ring(cid_all, virtual_nodes)
    return [q for q in mq_all if _ring_owner(hashes, owners, q) == me]


_Allocator = Callable[[Iterable[QueueRef], Iterable[str], str], list[QueueRef]]

_ALLOCATORS: dict[AllocationStrategy, _Allocator] = {
    AllocationStrategy.AVERAGELY: allocate_averagely,
    AllocationStrategy.AVERAGELY_BY_CIRCLE: allocate_averagely_by_circle,
}


def allocate(
    strategy: AllocationStrategy,
    queues: Iterable[QueueRef],
    members: Iterable[str],
    me: str,
    *,
    virtual_nodes: int = DEFAULT_VIRTUAL_NODES,
) -> list[QueueRef]:
    """The queues `me` consumes under `strategy`, sorted. `virtual_nodes` is for CONSISTENT_HASH."""
    if strategy is AllocationStrategy.CONSISTENT_HASH:
        return allocate_consistent_hash(queues, members, me, virtual_nodes)
    return _ALLOCATORS[strategy](queues, members, me)


def allocate_all(
    strategy: AllocationStrategy,
    queues: Iterable[QueueRef],
    members: Iterable[str],
    *,
    virtual_nodes: int = DEFAULT_VIRTUAL_NODES,
) -> dict[str, list[QueueRef]]:
    """The whole group's assignment, member -> queues (for admin views and tests)."""
    mq_all, cid_all = _sorted_inputs(queues, members)
    if strategy is AllocationStrategy.CONSISTENT_HASH:
        _check_virtual_nodes(virtual_nodes)
        result: dict[str, list[QueueRef]] = {m: [] for m in cid_all}
        if cid_all:
            hashes, owners = _ring(cid_all, virtual_nodes)
            for q in mq_all:
                result[_ring_owner(hashes, owners, q)].append(q)
        return result
    return {m: allocate(strategy, mq_all, cid_all, m) for m in cid_all}


# ---- rebalance diff ----------------------------------------------------------------------------


class StepKind(enum.Enum):
    COMMIT_OFFSET = "commit_offset"  # persist the consumed offset of a queue being given up
    RELEASE = "release"  # stop pulling, drop the process queue, unlock it (orderly)
    START = "start"  # read the committed offset and begin pulling


@dataclass(frozen=True, slots=True)
class RebalanceStep:
    kind: StepKind
    queue: QueueRef


@dataclass(frozen=True, slots=True)
class RebalancePlan:
    """What a member does when its assignment changes from `previous` to the new one.

    The rule: a queue being given up has its offset committed first and only then is released,
    so the member that takes it over starts from where this one stopped (at worst it re-reads
    messages in flight: at-least-once, never a gap). Stops come before starts.
    """

    start: tuple[QueueRef, ...]
    stop: tuple[QueueRef, ...]
    keep: tuple[QueueRef, ...]

    @property
    def changed(self) -> bool:
        return bool(self.start or self.stop)

    def steps(self) -> tuple[RebalanceStep, ...]:
        out: list[RebalanceStep] = []
        for q in self.stop:
            out.append(RebalanceStep(StepKind.COMMIT_OFFSET, q))
            out.append(RebalanceStep(StepKind.RELEASE, q))
        out.extend(RebalanceStep(StepKind.START, q) for q in self.start)
        return tuple(out)


def plan_rebalance(previous: Iterable[QueueRef], current: Iterable[QueueRef]) -> RebalancePlan:
    """The diff between two assignments of one member, each part sorted."""
    prev, cur = set(previous), set(current)
    return RebalancePlan(
        start=tuple(sorted(cur - prev)),
        stop=tuple(sorted(prev - cur)),
        keep=tuple(sorted(prev & cur)),
    )
