"""Queue allocation strategies and the rebalance diff: RocketMQ's examples and their properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.client.rebalance import (
    AllocationStrategy,
    StepKind,
    allocate,
    allocate_all,
    allocate_averagely,
    allocate_averagely_by_circle,
    allocate_consistent_hash,
    plan_rebalance,
)
from raftmq.common.types import QueueRef


def qs(n: int, topic: str = "T", broker: str = "broker-a") -> list[QueueRef]:
    return [QueueRef(topic, broker, i) for i in range(n)]


queue_refs = st.builds(
    QueueRef,
    st.sampled_from(["T", "U"]),
    st.sampled_from(["broker-a", "broker-b", "broker-c"]),
    st.integers(0, 15),
)
queue_lists = st.lists(queue_refs, max_size=40)
member_ids = st.text(alphabet="abcdefgh0123456789@.-", min_size=1, max_size=8)
member_lists = st.lists(member_ids, min_size=1, max_size=12, unique=True)
strategies = st.sampled_from(list(AllocationStrategy))


# ---- RocketMQ's examples ------------------------------------------------------------------------


def test_averagely_gives_contiguous_blocks_with_the_remainder_first() -> None:
    queues = qs(8)
    members = ["c1", "c2", "c3"]
    assert allocate_averagely(queues, members, "c1") == queues[0:3]
    assert allocate_averagely(queues, members, "c2") == queues[3:6]
    assert allocate_averagely(queues, members, "c3") == queues[6:8]


def test_averagely_with_more_members_than_queues_leaves_the_last_idle() -> None:
    queues = qs(2)
    members = ["c1", "c2", "c3"]
    assert allocate_averagely(queues, members, "c1") == [queues[0]]
    assert allocate_averagely(queues, members, "c2") == [queues[1]]
    assert allocate_averagely(queues, members, "c3") == []


def test_by_circle_deals_queues_round_robin() -> None:
    queues = qs(8)
    members = ["c1", "c2", "c3"]
    assert allocate_averagely_by_circle(queues, members, "c1") == [queues[i] for i in (0, 3, 6)]
    assert allocate_averagely_by_circle(queues, members, "c2") == [queues[i] for i in (1, 4, 7)]
    assert allocate_averagely_by_circle(queues, members, "c3") == [queues[i] for i in (2, 5)]


def test_queues_sort_by_topic_then_broker_then_id() -> None:
    a = QueueRef("T", "broker-b", 0)
    b = QueueRef("T", "broker-a", 10)
    c = QueueRef("T", "broker-a", 2)
    assert sorted([a, b, c]) == [c, b, a]
    assert str(c) == "T@broker-a#2"


@pytest.mark.parametrize("strategy", list(AllocationStrategy))
def test_absent_member_empty_queues_or_no_members_get_nothing(
    strategy: AllocationStrategy,
) -> None:
    assert allocate(strategy, qs(4), ["c1", "c2"], "c9") == []
    assert allocate(strategy, [], ["c1", "c2"], "c1") == []
    assert allocate(strategy, qs(4), [], "c1") == []
    assert allocate_all(strategy, qs(4), []) == {}


def test_consistent_hash_checks_virtual_nodes() -> None:
    with pytest.raises(ValueError):
        allocate_consistent_hash(qs(4), ["c1"], "c1", virtual_nodes=0)
    with pytest.raises(ValueError):
        allocate_all(AllocationStrategy.CONSISTENT_HASH, qs(4), ["c1"], virtual_nodes=0)


def test_consistent_hash_is_pinned() -> None:
    # A different answer after an upgrade would make old and new members disagree mid-rollout.
    got = allocate_all(AllocationStrategy.CONSISTENT_HASH, qs(8), ["c1", "c2", "c3"])
    assert {m: [q.queue_id for q in v] for m, v in got.items()} == PINNED_CONSISTENT_HASH


PINNED_CONSISTENT_HASH = {"c1": [0, 1, 4, 5, 6], "c2": [7], "c3": [2, 3]}


# ---- properties ---------------------------------------------------------------------------------


@given(strategies, queue_lists, member_lists)
def test_every_queue_goes_to_exactly_one_member(
    strategy: AllocationStrategy, queues: list[QueueRef], members: list[str]
) -> None:
    per_member = [allocate(strategy, queues, members, m) for m in members]
    flat = [q for assigned in per_member for q in assigned]
    assert sorted(flat) == sorted(set(queues))  # the union is all queues, none twice
    for assigned in per_member:
        assert assigned == sorted(assigned)


@given(
    st.sampled_from([AllocationStrategy.AVERAGELY, AllocationStrategy.AVERAGELY_BY_CIRCLE]),
    queue_lists,
    member_lists,
)
def test_averagely_and_circle_balance_within_one(
    strategy: AllocationStrategy, queues: list[QueueRef], members: list[str]
) -> None:
    sizes = [len(allocate(strategy, queues, members, m)) for m in members]
    assert max(sizes) - min(sizes) <= 1


@given(strategies, queue_lists, member_lists, st.data())
def test_allocation_ignores_input_order_and_duplicates(
    strategy: AllocationStrategy, queues: list[QueueRef], members: list[str], data: st.DataObject
) -> None:
    shuffled_queues = data.draw(st.permutations(queues + queues[:3]))
    shuffled_members = data.draw(st.permutations(members + members[:1]))
    for m in members:
        assert allocate(strategy, queues, members, m) == allocate(
            strategy, shuffled_queues, shuffled_members, m
        )


@given(strategies, queue_lists, member_lists)
def test_allocate_all_agrees_with_each_member(
    strategy: AllocationStrategy, queues: list[QueueRef], members: list[str]
) -> None:
    whole = allocate_all(strategy, queues, members)
    assert set(whole) == set(members)
    for m in members:
        assert whole[m] == allocate(strategy, queues, members, m)


@given(queue_lists, member_lists, st.data(), st.integers(1, 20))
def test_consistent_hash_moves_only_the_leavers_queues(
    queues: list[QueueRef], members: list[str], data: st.DataObject, virtual_nodes: int
) -> None:
    leaver = data.draw(st.sampled_from(members))
    before = allocate_all(
        AllocationStrategy.CONSISTENT_HASH, queues, members, virtual_nodes=virtual_nodes
    )
    rest = [m for m in members if m != leaver]
    after = allocate_all(
        AllocationStrategy.CONSISTENT_HASH, queues, rest, virtual_nodes=virtual_nodes
    )
    for m in rest:
        # A staying member keeps everything it had and gains only what the leaver had.
        assert set(before[m]) <= set(after[m])
        assert set(after[m]) - set(before[m]) <= set(before[leaver])


@given(queue_lists, member_lists, member_ids)
def test_consistent_hash_joiner_takes_queues_only_for_itself(
    queues: list[QueueRef], members: list[str], joiner: str
) -> None:
    if joiner in members:
        return
    before = allocate_all(AllocationStrategy.CONSISTENT_HASH, queues, members)
    after = allocate_all(AllocationStrategy.CONSISTENT_HASH, queues, [*members, joiner])
    for m in members:
        assert set(after[m]) <= set(before[m])


def test_consistent_hash_moves_few_queues_compared_with_averagely() -> None:
    queues = [QueueRef("T", f"broker-{b}", i) for b in "abcd" for i in range(16)]
    members = [f"consumer-{i}" for i in range(8)]

    def moved(strategy: AllocationStrategy) -> int:
        before = allocate_all(strategy, queues, members)
        after = allocate_all(strategy, queues, members[:3] + members[4:])
        owner_before = {q: m for m, qq in before.items() for q in qq}
        owner_after = {q: m for m, qq in after.items() for q in qq}
        return sum(owner_before[q] != owner_after[q] for q in queues)

    hashed = moved(AllocationStrategy.CONSISTENT_HASH)
    assert hashed == len(
        allocate_all(AllocationStrategy.CONSISTENT_HASH, queues, members)["consumer-3"]
    )
    assert hashed < moved(AllocationStrategy.AVERAGELY)


# ---- rebalance plan -----------------------------------------------------------------------------


@given(st.lists(queue_refs, max_size=20), st.lists(queue_refs, max_size=20))
def test_plan_partitions_old_and_new(previous: list[QueueRef], current: list[QueueRef]) -> None:
    plan = plan_rebalance(previous, current)
    assert set(plan.start) | set(plan.keep) == set(current)
    assert set(plan.stop) | set(plan.keep) == set(previous)
    assert not set(plan.start) & set(plan.keep)
    assert not set(plan.stop) & set(plan.keep)
    assert not set(plan.start) & set(plan.stop)
    assert plan.changed == (set(previous) != set(current))
    steps = plan.steps()
    kinds = [s.kind for s in steps]
    # stops (commit, then release) come before any start
    assert kinds == [StepKind.COMMIT_OFFSET, StepKind.RELEASE] * len(plan.stop) + [
        StepKind.START
    ] * len(plan.start)
    for i, q in enumerate(plan.stop):
        assert steps[2 * i].queue == steps[2 * i + 1].queue == q


def test_plan_after_a_member_joins() -> None:
    queues = qs(6)
    before = allocate_averagely(queues, ["c1", "c2"], "c1")
    after = allocate_averagely(queues, ["c1", "c2", "c3"], "c1")
    plan = plan_rebalance(before, after)
    assert plan.keep == tuple(queues[0:2])
    assert plan.stop == (queues[2],)
    assert plan.start == ()
    assert [(s.kind, s.queue.queue_id) for s in plan.steps()] == [
        (StepKind.COMMIT_OFFSET, 2),
        (StepKind.RELEASE, 2),
    ]
    assert not plan_rebalance(after, after).changed
