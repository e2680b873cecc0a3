"""Issue 3's acceptance on a real cluster (tests/acceptance/cluster.py): 100k messages in every
send mode consumed by a clustering group of three push consumers, batches in order, broadcast,
offsets across restarts, reset by time and the tag filter."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from raftmq.client.admin import Admin
from raftmq.client.consumer_push import (
    ConsumeResult,
    MessageModel,
    PushConsumer,
    StuckMessage,
    wait_idle,
)
from raftmq.client.messages import OutgoingMessage, ReceivedMessage, SendResult
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.common.message import decode_msg_id
from raftmq.common.types import QueueRef
from tests.acceptance.cluster import create_topic, drain, now_ms
from tests.harness.procs import Cluster, wait_until


class Seen:
    """What a group's listeners received: every delivery, by message id and by member."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: Counter[str] = Counter()
        self.bodies: Counter[bytes] = Counter()
        self.by_member: dict[str, Counter[str]] = {}
        self.queue_of: dict[str, QueueRef] = {}

    def listener(self, member: str) -> Callable[[ReceivedMessage], ConsumeResult]:
        mine = self.by_member.setdefault(member, Counter())

        def listen(m: ReceivedMessage) -> ConsumeResult:
            with self.lock:
                self.count[m.msg_id] += 1
                self.bodies[m.body] += 1
                mine[m.msg_id] += 1
                self.queue_of[m.msg_id] = QueueRef(m.topic, m.broker_group, m.queue_id)
            return ConsumeResult.SUCCESS

        return listen

    def ids(self) -> set[str]:
        with self.lock:
            return set(self.count)

    def duplicates(self) -> dict[str, int]:
        with self.lock:
            return {i: n - 1 for i, n in self.count.items() if n > 1}


def split_evenly(members: list[PushConsumer], queues: int) -> bool:
    """Every queue owned by exactly one member, no member idle."""
    owned = [q for m in members for q in m.assignment()]
    return len(owned) == queues == len(set(owned)) and all(m.assignment() for m in members)


def test_100k_in_every_send_mode_reach_a_clustering_group_of_three(cluster: Cluster) -> None:
    topic = "modes"
    create_topic(cluster, topic, queues=4)
    seen = Seen()
    members = [
        PushConsumer(
            cluster.namesrv,
            "g-modes",
            topic,
            seen.listener(f"c{i}"),
            client_id=f"c{i}",
            start_from=StartFrom.EARLIEST,
            consume_threads=4,
            rebalance_interval_ms=2_000,
            heartbeat_interval_ms=500,
        )
        for i in range(3)
    ]
    try:
        for m in members:
            m.start()
        wait_until(lambda: split_evenly(members, 8), 30, "8 queues split among 3 members")
        rebalances_before = sum(m.rebalances for m in members)
        acked: list[SendResult] = []
        started = time.monotonic()
        with Producer(cluster.namesrv) as p:
            for i in range(200):
                acked.append(p.send(topic, f"sync-{i}".encode(), keys=[f"k{i}"]))
            futs: list[Future[SendResult]] = [
                p.send_async(topic, f"async-{i}".encode()) for i in range(2_000)
            ]
            for i in range(300):
                p.send_oneway(topic, f"oneway-{i}".encode())
            batches = [
                p.send_batch_async(topic, [f"batch-{b}-{i}".encode() for i in range(500)])
                for b in range(196)
            ]
            for fs in batches:
                acked.extend(f.result(timeout=120) for f in fs)
            acked.extend(f.result(timeout=60) for f in futs)
            assert p.flush(60), "oneway sends still buffered"
        sent_s = time.monotonic() - started
        assert len(acked) == 200 + 2_000 + 98_000  # 100,200 acknowledged, plus 300 oneway
        assert len({r.msg_id for r in acked}) == len(acked), "two sends got one message id"
        assert {r.broker_group for r in acked} == {"broker-a", "broker-b"}
        want = {r.msg_id for r in acked}
        wait_until(lambda: want <= seen.ids(), 180, "every acknowledged message consumed")

        def oneway_seen() -> int:
            with seen.lock:
                return sum(1 for b in seen.bodies if b.startswith(b"oneway-"))

        # Oneway sends are not acknowledged: counted apart. Nothing failed here, so all arrive.
        wait_until(lambda: oneway_seen() == 300, 30, "the 300 oneway messages")
        for m in members:
            assert wait_idle(m, 30)
        consumed_s = time.monotonic() - started
        dups = seen.duplicates()
        rebalances = sum(m.rebalances for m in members) - rebalances_before
        print(
            f"\n100,200 acked + 300 oneway: sent in {sent_s:.1f} s, consumed by 3 members in "
            f"{consumed_s:.1f} s; duplicates {sum(dups.values())}, rebalances {rebalances}"
        )
        assert all(len(c) > 0 for c in seen.by_member.values()), "every member consumed"
        assert len(seen.ids()) == len(want) + 300, "a message nobody sent was consumed"
        if rebalances == 0:
            assert not dups, "duplicates without any rebalance"
    finally:
        for m in members:
            m.close()


def test_batch_keeps_order_in_one_queue_and_is_found_by_key_and_id(cluster: Cluster) -> None:
    topic = "batches"
    create_topic(cluster, topic, queues=2)
    with Producer(cluster.namesrv) as p:
        res = p.send_batch(
            topic, [OutgoingMessage(f"o{i}".encode(), tags="T", keys=(f"k{i}",)) for i in range(50)]
        )
    assert len({(r.broker_group, r.queue_id) for r in res}) == 1
    first = res[0].queue_offset
    assert [r.queue_offset for r in res] == list(range(first, first + 50))
    with Admin(cluster.namesrv) as admin:
        assert [m.body for m in admin.messages_by_key(topic, "k7")] == [b"o7"]
        found = admin.message_by_id(res[3].msg_id)
        assert (found.body, found.tags, found.keys) == (b"o3", "T", ("k3",))
    got = drain(cluster, topic, "g-batches", 50)
    assert [m.body for m in got] == [f"o{i}".encode() for i in range(50)], "stored in order"


def collector(into: set[bytes]) -> Callable[[ReceivedMessage], None]:
    def listen(m: ReceivedMessage) -> None:
        into.add(m.body)

    return listen


def test_broadcast_gives_every_member_everything(cluster: Cluster, tmp_path: Path) -> None:
    topic = "bcast"
    create_topic(cluster, topic, queues=2)
    got: dict[str, set[bytes]] = {"a": set(), "b": set()}

    def member(name: str) -> PushConsumer:
        return PushConsumer(
            cluster.namesrv,
            "g-bcast",
            topic,
            collector(got[name]),
            message_model=MessageModel.BROADCASTING,
            start_from=StartFrom.EARLIEST,
            offset_file=tmp_path / f"{name}.json",
            client_id=name,
        )

    with Producer(cluster.namesrv) as p:
        for i in range(300):
            p.send(topic, f"b{i}".encode())
    want = {f"b{i}".encode() for i in range(300)}
    consumers = [member("a"), member("b")]
    try:
        for c in consumers:
            c.start()
            assert len(c.assignment()) == 4, "a broadcast member reads every queue"
        wait_until(lambda: got["a"] == want and got["b"] == want, 30, "both members to get all")
    finally:
        for c in consumers:
            c.close()
    assert (tmp_path / "a.json").exists(), "broadcast offsets are kept by the member"
    # The offsets survive a restart: a restarted member gets only what is new.
    got["a"].clear()
    with Producer(cluster.namesrv) as p:
        p.send(topic, b"later")
    with member("a"):
        wait_until(lambda: b"later" in got["a"], 30, "the new message")
        time.sleep(0.5)
    assert got["a"] == {b"later"}, "a restarted broadcast member resumed from its file"


def test_offsets_survive_a_consumer_restart_and_reset_by_time(cluster: Cluster) -> None:
    topic = "restart"
    create_topic(cluster, topic, queues=2)
    seen: list[bytes] = []
    lock = threading.Lock()

    def listen(m: ReceivedMessage) -> None:
        with lock:
            seen.append(m.body)

    def consumer(start_from: StartFrom) -> PushConsumer:
        return PushConsumer(cluster.namesrv, "g-restart", topic, listen, start_from=start_from)

    with Producer(cluster.namesrv) as p:
        for i in range(100):
            p.send(topic, f"r{i}".encode())
    with consumer(StartFrom.EARLIEST) as c:
        wait_until(lambda: len(seen) >= 100, 30, "the first 100")
        assert wait_idle(c, 10)
    assert sorted(seen) == sorted(f"r{i}".encode() for i in range(100))
    time.sleep(0.05)
    cut_ms = now_ms()
    time.sleep(0.05)
    with Producer(cluster.namesrv) as p:
        for i in range(50):
            p.send(topic, f"s{i}".encode())
    seen.clear()
    with consumer(StartFrom.EARLIEST):
        wait_until(lambda: len(seen) >= 50, 30, "the 50 sent while it was away")
        time.sleep(0.5)
    assert sorted(seen) == sorted(f"s{i}".encode() for i in range(50)), (
        "a restart resumes at the committed offsets: nothing again, nothing missed"
    )
    # Backtracking: reset the group to cut_ms; the next start redelivers from there.
    with Admin(cluster.namesrv) as admin:
        new = admin.reset_offsets_to_time("g-restart", topic, cut_ms)
        assert len(new) == 4
        lag = admin.group_lag("g-restart", topic)
        assert sum(q.lag for q in lag) == 50, "the lag after the reset is what comes again"
    seen.clear()
    with consumer(StartFrom.LATEST):
        wait_until(lambda: len(seen) >= 50, 30, "redelivery from the reset")
        time.sleep(0.5)
    assert sorted(seen) == sorted(f"s{i}".encode() for i in range(50))


def test_tag_filter(cluster: Cluster) -> None:
    topic = "tags"
    create_topic(cluster, topic, queues=2)
    seen: list[ReceivedMessage] = []
    with Producer(cluster.namesrv) as p:
        for i in range(60):
            p.send(topic, f"t{i}".encode(), tags=("A", "B", "C")[i % 3])
        p.send(topic, b"untagged")
    c = PushConsumer(
        cluster.namesrv,
        "g-tags",
        topic,
        seen.append,
        tag_expression="A || C",
        start_from=StartFrom.EARLIEST,
    )
    with c:
        wait_until(lambda: len(seen) >= 40, 30, "the 40 messages tagged A or C")
        assert wait_idle(c, 10)
        time.sleep(0.5)
    assert len(seen) == 40 and {m.tags for m in seen} == {"A", "C"}
    assert sorted(m.body for m in seen) == sorted(f"t{i}".encode() for i in range(60) if i % 3 != 1)


def test_reconsume_later_sends_back_and_redelivers_with_the_count(cluster: Cluster) -> None:
    """A message whose listener asks to reconsume it comes again, through the group's retry
    topic, with its original topic and a growing reconsume count; the queue's commit moves on
    only as each send-back is acknowledged (the message is never dropped on the way)."""
    topic = "reconsume"
    create_topic(cluster, topic, queues=1)
    with Producer(cluster.namesrv) as p:
        first = p.send(topic, b"r0")
        q = QueueRef(topic, first.broker_group, first.queue_id)
        sent = [first, *(p.send(topic, f"r{i}".encode(), queue=q) for i in range(1, 10))]
    release = threading.Event()
    deliveries: Counter[bytes] = Counter()
    counts: list[tuple[str, int]] = []
    lock = threading.Lock()

    def listen(m: ReceivedMessage) -> ConsumeResult:
        with lock:
            deliveries[m.body] += 1
            if m.body == b"r5":
                counts.append((m.topic, m.reconsume_times))
        if m.body == b"r5" and not release.is_set():
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    def committed() -> int | None:
        with Admin(cluster.namesrv) as admin:
            return next(x.committed for x in admin.group_lag("g-reconsume", topic) if x.queue == q)

    c = PushConsumer(
        cluster.namesrv,
        "g-reconsume",
        topic,
        listen,
        start_from=StartFrom.EARLIEST,
        commit_interval_ms=100,
        retry_delay_level=1,  # 1 s between deliveries (the default back-off starts at 10 s)
    )
    with c:
        wait_until(lambda: deliveries[b"r5"] >= 3, 30, "r5 redelivered twice")
        assert all(deliveries[f"r{i}".encode()] == 1 for i in range(10) if i != 5)
        with lock:
            assert counts[:3] == [(topic, 0), (topic, 1), (topic, 2)], counts
        # r5 lives in %RETRY%g-reconsume now: the original queue is done.
        wait_until(lambda: committed() == sent[-1].queue_offset + 1, 30, "the commit past r9")
        release.set()
        n = deliveries[b"r5"]
        wait_until(lambda: deliveries[b"r5"] >= n + 1, 30, "r5 consumed once more")
    time.sleep(0.5)
    assert sum(deliveries.values()) == 9 + deliveries[b"r5"]


def request_of(r: SendResult) -> tuple[int, int]:
    """The stored batch (one send request) a message came in: its raft index and slot."""
    mid = decode_msg_id(r.msg_id)
    return mid.raft_index, mid.slot


def test_linger_packs_concurrent_sends_into_few_requests_in_order(cluster: Cluster) -> None:
    """Sends for one queue within linger_ms share a request (one stored batch: one raft index
    and slot in their ids), at most batch_max_messages each, stored in send order."""
    topic = "linger"
    create_topic(cluster, topic, queues=2)
    with Producer(cluster.namesrv, linger_ms=500) as p:
        p.send(topic, b"warm-up", sharding_key="one")  # the route is cached from here on
        futs = [p.send_async(topic, f"w{i}".encode(), sharding_key="one") for i in range(50)]
        held = [f.result(timeout=60) for f in futs]
    assert Counter(request_of(r) for r in held)[request_of(held[0])] > 1, (
        "the first send waited for the linger and took later ones along"
    )
    with Producer(cluster.namesrv, linger_ms=200, batch_max_messages=64) as p:
        futs = [p.send_async(topic, f"l{i}".encode(), sharding_key="one") for i in range(200)]
        results = [f.result(timeout=60) for f in futs]
    batches = Counter(request_of(r) for r in results)
    print(f"\n200 lingered sends in {len(batches)} requests: {sorted(batches.values())}")
    assert len({(r.broker_group, r.queue_id) for r in results}) == 1, "one sharding key, one queue"
    first = results[0].queue_offset
    assert [r.queue_offset for r in results] == list(range(first, first + 200)), "in send order"
    assert max(batches.values()) <= 64 and len(batches) <= 8


def test_a_message_past_its_retry_limit_is_dead_lettered_not_skipped(cluster: Cluster) -> None:
    """Issue 15, then 16: a listener that keeps failing one message past max_reconsume_times
    must not lose it. Each failure sends it back (%RETRY%<group>, here at level 1, 1 s); past the
    limit it is in %DLQ%<group> with its original topic and id, and only then does its queue
    move on (a send-back that fails keeps it: client/consumer_push.py)."""
    topic = "retry-limit"
    group = "g-retry-limit"
    create_topic(cluster, topic, queues=1)
    with Producer(cluster.namesrv) as p:
        first = p.send(topic, b"k0")
        q = QueueRef(topic, first.broker_group, first.queue_id)
        sent = [first, *(p.send(topic, f"k{i}".encode(), queue=q) for i in range(1, 6))]
    poison = sent[2]
    deliveries: Counter[bytes] = Counter()
    counts: list[int] = []
    reported: list[StuckMessage] = []
    lock = threading.Lock()

    def listen(m: ReceivedMessage) -> ConsumeResult:
        with lock:
            deliveries[m.body] += 1
        if m.body == b"k2":
            counts.append(m.reconsume_times)
            assert m.topic == topic, "a retried message shows its original topic"
            raise RuntimeError("poison")
        return ConsumeResult.SUCCESS

    def lag() -> int:
        with Admin(cluster.namesrv) as admin:
            return sum(x.lag for x in admin.group_lag(group, topic))

    c = PushConsumer(
        cluster.namesrv,
        group,
        topic,
        listen,
        start_from=StartFrom.EARLIEST,
        commit_interval_ms=100,
        rebalance_interval_ms=1_000,
        max_reconsume_times=2,
        retry_delay_level=1,
        on_stuck=reported.append,
    )
    with c, Admin(cluster.namesrv) as admin:
        wait_until(lambda: len(admin.dead_letters(group)) == 1, 60, "the dead letter")
        [dead] = admin.dead_letters(group)
        assert dead.properties["DLQ_ORIGIN_TOPIC"] == topic
        assert dead.properties["DLQ_ORIGIN_MESSAGE_ID"] == poison.msg_id
        assert counts == [0, 1, 2], "delivered max_reconsume_times + 1 times, counted"
        wait_until(lambda: lag() == 0, 30, "the queue moves on once the DLQ has it")
        assert c.stuck() == [] and reported == []
    assert all(deliveries[f"k{i}".encode()] == 1 for i in range(6) if i != 2)
