"""A clustering group under steady traffic: a member leaving hands its queues to the others within
one rebalance period, no acknowledged message is lost, and duplicates occur only on the queues
that moved (at-least-once around a rebalance, counted and printed)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from raftmq.client.consumer_push import PushConsumer, wait_idle
from raftmq.client.messages import SendResult
from raftmq.client.producer import Producer
from raftmq.common.types import QueueRef
from tests.acceptance.cluster import create_topic
from tests.acceptance.test_produce_consume import Seen, split_evenly
from tests.harness.procs import Cluster, wait_until

REBALANCE_INTERVAL_MS = 5_000


def test_a_leaving_member_hands_its_queues_over_without_loss(cluster: Cluster) -> None:
    topic = "shared"
    create_topic(cluster, topic, queues=4)
    seen = Seen()
    members = [
        PushConsumer(
            cluster.namesrv,
            "g-shared",
            topic,
            seen.listener(f"c{i}"),
            client_id=f"c{i}",
            rebalance_interval_ms=REBALANCE_INTERVAL_MS,
            heartbeat_interval_ms=300,
            commit_interval_ms=200,
        )
        for i in range(3)
    ]
    stop = threading.Event()
    acked: list[Future[SendResult]] = []

    def send_steadily() -> None:
        with Producer(cluster.namesrv) as p:
            i = 0
            while not stop.is_set():
                acked.append(p.send_async(topic, f"m{i}".encode()))
                i += 1
                if i % 50 == 0:
                    time.sleep(0.02)
            p.flush(60)

    sender = threading.Thread(target=send_steadily, name="sender")
    try:
        for m in members:
            m.start()
        wait_until(lambda: split_evenly(members, 8), 30, "8 queues split among 3 members")
        sender.start()
        wait_until(lambda: len(seen.ids()) > 2_000, 60, "traffic flowing to the group")
        owner_before = {q: m.client_id for m in members for q in m.assignment()}
        leaving = members.pop()
        left_at = time.monotonic()
        leaving.close()
        wait_until(lambda: split_evenly(members, 8), 30, "the queues to move to the others")
        moved_in_s = time.monotonic() - left_at
        owner_after = {q: m.client_id for m in members for q in m.assignment()}
        # The leaver's queues, and any that the new split moves between the others.
        moved = {q for q, owner in owner_before.items() if owner_after.get(q) != owner}
        assert moved >= set(q for q, o in owner_before.items() if o == leaving.client_id)
        time.sleep(1.0)  # traffic keeps flowing through the new owners
    finally:
        stop.set()
        sender.join(90)
    try:
        results = [f.result(timeout=60) for f in acked]
        want = {r.msg_id for r in results}
        wait_until(lambda: want <= seen.ids(), 60, "every acknowledged message consumed")
        for m in members:
            assert wait_idle(m, 30)
    finally:
        for m in members:
            m.close()
    dups = seen.duplicates()
    dup_queues: set[QueueRef] = {seen.queue_of[i] for i in dups}
    print(
        f"\n{len(want)} acked during a leave: queues moved in {moved_in_s:.2f} s "
        f"(rebalance period {REBALANCE_INTERVAL_MS / 1000:.0f} s); duplicates "
        f"{sum(dups.values())} on {len(dup_queues)} queue(s)"
    )
    assert moved_in_s < REBALANCE_INTERVAL_MS / 1000, "not within one rebalance period"
    assert dup_queues <= moved, "a duplicate on a queue whose owner did not change"
    assert len(seen.ids()) == len(want), "a message nobody acknowledged was consumed"
