"""Producer queue selection: round robin, fault avoidance with passed-in time, sharding keys."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.client.queue_selector import (
    FaultPolicy,
    FaultTable,
    PublishQueues,
    select_by_key,
    select_queue,
    shard_index,
)
from raftmq.common.types import QueueRef


def route(brokers: str = "abc", per_broker: int = 4, topic: str = "T") -> PublishQueues:
    return PublishQueues.of(
        topic, [QueueRef(topic, f"broker-{b}", i) for b in brokers for i in range(per_broker)]
    )


# ---- PublishQueues ------------------------------------------------------------------------------


def test_publish_queues_sorts_and_refuses_bad_input() -> None:
    a0, b0 = QueueRef("T", "broker-a", 0), QueueRef("T", "broker-b", 0)
    assert PublishQueues.of("T", [b0, a0, b0]).queues == (a0, b0)
    with pytest.raises(ValueError, match="no writable queue"):
        PublishQueues.of("T", [])
    with pytest.raises(ValueError, match="topic"):
        PublishQueues.of("T", [QueueRef("U", "broker-a", 0)])
    with pytest.raises(ValueError, match="sorted"):
        PublishQueues("T", (b0, a0))


# ---- round robin --------------------------------------------------------------------------------


@given(st.integers(-(10**6), 10**6))
def test_round_robin_without_faults_visits_every_queue_once_per_cycle(start: int) -> None:
    queues = route()
    table = FaultTable()
    picked = [select_queue(queues, start + i, table, now_ms=0) for i in range(len(queues.queues))]
    assert sorted(picked) == list(queues.queues)


def test_failed_broker_is_avoided_for_its_duration_then_retried() -> None:
    queues = route()
    policy = FaultPolicy()
    table = FaultTable(policy).record("broker-b", 120, now_ms=1_000, failed=True)
    until = 1_000 + policy.avoid_for_ms(policy.failure_latency_ms)
    assert until == 11_000  # RocketMQ 5: a failure counts as 10 s latency -> 10 s out
    assert not table.is_available("broker-b", until - 1)
    assert table.is_available("broker-b", until)

    during = {select_queue(queues, i, table, now_ms=until - 1).broker_group for i in range(100)}
    assert during == {"broker-a", "broker-c"}
    after = {select_queue(queues, i, table, now_ms=until).broker_group for i in range(100)}
    assert after == {"broker-a", "broker-b", "broker-c"}

    # a fast send on the retried broker clears its entry
    healed = table.record("broker-b", 20, now_ms=until)
    assert healed.item("broker-b") is None
    assert healed.items == ()


def test_latency_steps_follow_rocketmq_5_defaults() -> None:
    policy = FaultPolicy()
    assert [policy.avoid_for_ms(x) for x in (0, 49, 50, 549, 550, 1800, 3000, 5000, 15000)] == [
        0,
        0,
        0,
        0,
        2000,
        5000,
        6000,
        10000,
        30000,
    ]
    table = FaultTable().record("broker-a", 600, now_ms=0)  # slow, not failed
    assert not table.is_available("broker-a", 1_999)
    assert table.is_available("broker-a", 2_000)
    assert FaultTable().record("broker-a", 40, now_ms=0).items == ()  # fast: nothing kept


def test_fault_policy_validates() -> None:
    with pytest.raises(ValueError):
        FaultPolicy(latency_steps_ms=(1, 2), avoid_ms=(1,))
    with pytest.raises(ValueError):
        FaultPolicy(latency_steps_ms=(2, 1), avoid_ms=(1, 1))
    with pytest.raises(ValueError):
        FaultPolicy(max_brokers=0)
    with pytest.raises(ValueError):
        FaultPolicy(avoid_ms=(-1, 0, 0, 0, 0, 0, 0))


def test_retry_avoids_the_broker_that_just_failed_unless_it_is_the_only_one() -> None:
    queues = route()
    table = FaultTable()
    picks = {
        select_queue(queues, i, table, now_ms=0, avoid_broker="broker-a").broker_group
        for i in range(50)
    }
    assert picks == {"broker-b", "broker-c"}
    single = route("a")
    assert select_queue(single, 7, table, 0, avoid_broker="broker-a").broker_group == "broker-a"


def test_when_every_broker_is_avoided_the_soonest_to_recover_is_used() -> None:
    queues = route()
    table = (
        FaultTable()
        .record("broker-a", 20_000, now_ms=0)  # out until 30 000
        .record("broker-b", 600, now_ms=0)  # out until 2 000
        .record("broker-c", 4_000, now_ms=0)  # out until 6 000
    )
    picks = {select_queue(queues, i, table, now_ms=1_000).broker_group for i in range(50)}
    assert picks == {"broker-b"}
    # ... except the one a retry just failed on
    picks = {
        select_queue(queues, i, table, now_ms=1_000, avoid_broker="broker-b").broker_group
        for i in range(50)
    }
    assert picks == {"broker-c"}


events = st.lists(
    st.tuples(
        st.sampled_from([f"broker-{i}" for i in range(12)]),
        st.integers(0, 40_000),
        st.booleans(),
        st.integers(0, 5_000),
    ),
    max_size=60,
)


@given(events, st.integers(1, 6))
def test_fault_table_stays_bounded_and_keeps_the_latest_failure(
    evs: list[tuple[str, int, bool, int]], max_brokers: int
) -> None:
    table = FaultTable(FaultPolicy(max_brokers=max_brokers))
    now = 0
    for broker, latency, failed, step in evs:
        now += step
        table = table.record(broker, latency, now, failed=failed)
        assert len(table.items) <= max_brokers
        assert len({it.broker_group for it in table.items}) == len(table.items)
        avoid = table.policy.avoid_for_ms(max(latency, 10_000) if failed else latency)
        assert table.is_available(broker, now) == (avoid == 0)
        assert table.is_available(broker, now + avoid)
    assert all(it.avoid_until_ms > now for it in table.prune(now).items)


@given(events, st.integers(0, 10_000), st.integers(0, 1_000))
def test_selection_balances_over_available_queues(
    evs: list[tuple[str, int, bool, int]], now: int, start: int
) -> None:
    queues = PublishQueues.of(
        "T", [QueueRef("T", f"broker-{b}", i) for b in range(12) for i in range(2)]
    )
    table = FaultTable()
    for broker, latency, failed, _ in evs:
        table = table.record(broker, latency, 0, failed=failed)
    available = [q for q in queues.queues if table.is_available(q.broker_group, now)]
    n = len(available) * 3 or 6  # none available: it still picks, from one broker
    picks = Counter(select_queue(queues, start + i, table, now) for i in range(n))
    if available:
        assert set(picks) == set(available)
        assert set(picks.values()) == {3}
    else:
        assert len({q.broker_group for q in picks}) == 1


# ---- sharding keys ------------------------------------------------------------------------------


@given(st.text(max_size=30), st.data())
def test_same_key_same_queue_in_every_producer(key: str, data: st.DataObject) -> None:
    queues = route()
    shuffled = PublishQueues.of("T", data.draw(st.permutations(list(queues.queues))))
    assert select_by_key(queues, key) == select_by_key(shuffled, key)
    assert 0 <= shard_index(key, 7) < 7


def test_shard_index_is_pinned_and_spreads() -> None:
    # pinned: a change would reorder every ordered stream across an upgrade
    assert shard_index("order-42", 8) == 3
    assert shard_index("order-42", 1_000_003) == 585_375
    counts = Counter(shard_index(f"order-{i}", 8) for i in range(8_000))
    assert min(counts.values()) > 850
    with pytest.raises(ValueError):
        shard_index("k", 0)


def test_select_by_key_indexes_the_sorted_queues() -> None:
    queues = route()  # 12 queues: an ordered send never skips a queue, even on a failed broker
    assert select_by_key(queues, "order-42") == queues.queues[shard_index("order-42", 12)]
