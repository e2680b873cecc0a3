"""Several batches per queue in flight across a SIGKILL of the leader (issue 14): a NameServer and
a three-node group as processes, one idempotent Producer keeping up to 5 batches per queue in
flight over SEND_BATCHES frames while the leader dies mid-stream. Afterwards every queue is read
back: each acknowledged message is stored exactly once, where its result said, nothing is stored
twice, and each queue holds what it holds in send order. A strict batch that overtook an
earlier one being retried on the new leader would break the last two (the dispatcher's sequence
check, tests/broker/test_sequence_window.py, is what prevents it). The same with the batch-first
call of bare bodies, whose calls travel as one buffered item each (issue 24)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.messages import SendResult
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.common.errors import RaftMQError
from raftmq.common.types import QueueRef
from tests.harness.procs import Cluster, start_cluster, wait_until

GROUP = "broker-a"
TOPIC = "inflight"
QUEUES = 4
WINDOW = 256  # sends outstanding at once
TOTAL = 6_000
CALL = 20  # messages per batch-first call


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("inflight")
    c = start_cluster(tmp, (GROUP,), namesrvs=1)
    try:
        with Admin(c.namesrv) as admin:
            wait_until(lambda: any(g.leader_node_id for g in admin.groups()), 60, "a leader")
            admin.create_topic(TOPIC, queues=QUEUES)
            wait_until(
                lambda: len(admin.route(TOPIC).write_queues()) == QUEUES, 30, "the topic's route"
            )
        yield c
    finally:
        c.close()


def leader_node(c: Cluster) -> str:
    with Admin(c.namesrv) as admin:
        (g,) = [g for g in admin.groups() if g.broker_group == GROUP]
        return g.leader_node_id


@pytest.mark.parametrize("api", ["send_async", "send_batch_future"])
def test_each_acknowledged_message_is_stored_once_in_order_across_a_leader_kill(
    cluster: Cluster, api: str
) -> None:
    _, procs = cluster.groups[GROUP]
    by_node = {p.name.rsplit("-", 1)[1]: p for p in procs}
    queues = [QueueRef(TOPIC, GROUP, q) for q in range(QUEUES)]
    results: dict[int, SendResult] = {}
    failed: dict[int, RaftMQError] = {}
    room = threading.Semaphore(WINDOW)
    lock = threading.Lock()

    def done(i: int, fut: Future[SendResult]) -> None:
        exc = fut.exception()
        with lock:
            if exc is None:
                results[i] = fut.result()
            else:
                assert isinstance(exc, RaftMQError), exc
                failed[i] = exc
        room.release()

    def call_done(first: int, fut: Future[Sequence[SendResult]]) -> None:
        exc = fut.exception()
        with lock:
            if exc is None:
                got = fut.result()
                assert len(got) == CALL
                for k, r in enumerate(got):
                    results[first + k * QUEUES] = r
            else:
                assert isinstance(exc, RaftMQError), exc
                for k in range(CALL):
                    failed[first + k * QUEUES] = exc
        room.release()

    killed = ""
    with Producer(cluster.namesrv, send_timeout_ms=30_000, max_inflight_per_queue=5) as producer:
        if api == "send_async":
            for i in range(TOTAL):
                room.acquire()
                fut = producer.send_async(TOPIC, b"%d" % i, queue=queues[i % QUEUES])
                fut.add_done_callback(lambda f, i=i: done(i, f))
                if i == TOTAL // 3:
                    killed = leader_node(cluster)
                    by_node[killed].kill(signal.SIGKILL)
        else:  # each call: CALL messages of one queue, i = first + k * QUEUES
            for block in range(0, TOTAL, CALL * QUEUES):
                for q in range(QUEUES):
                    room.acquire()
                    first = block + q
                    bodies = [b"%d" % (first + k * QUEUES) for k in range(CALL)]
                    calls = producer.send_batch_future(TOPIC, bodies, queue=queues[q])
                    calls.add_done_callback(lambda f, first=first: call_done(first, f))
                if not killed and block >= TOTAL // 3:
                    killed = leader_node(cluster)
                    by_node[killed].kill(signal.SIGKILL)
        assert producer.flush(60)
        frames = producer._sender.frames_sent
    assert killed
    assert len(results) + len(failed) == TOTAL
    # the kill is survived by retries on the new leader: nearly everything is acknowledged
    assert len(results) >= TOTAL * 0.9, f"{len(failed)} failed: {next(iter(failed.values()))}"
    assert frames < TOTAL / 4, "batches travel together, several messages per frame"

    stored: dict[int, list[tuple[int, int]]] = {q: [] for q in range(QUEUES)}  # (offset, i)
    with PullConsumer(cluster.namesrv, "check", start_from=StartFrom.EARLIEST) as consumer:
        consumer.assign(queues)
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 3:
            got = consumer.poll(500)
            if got:
                idle_since = time.monotonic()
            for m in got:
                stored[m.queue_id].append((m.queue_offset, int(m.body)))
    seen: dict[int, tuple[int, int]] = {}
    for q, rows in stored.items():
        rows.sort()
        order = [i for _, i in rows]
        assert order == sorted(order), f"queue {q} out of send order"
        for offset, i in rows:
            assert i % QUEUES == q
            assert i not in seen, f"message {i} stored twice: {seen[i]} and {(q, offset)}"
            seen[i] = (q, offset)
    for i, r in results.items():
        assert i in seen, f"message {i} acknowledged ({r}) and lost"
        if r.queue_offset >= 0:  # -1: a duplicate whose original the broker no longer knew
            assert seen[i] == (r.queue_id, r.queue_offset), f"message {i} is not where it said"
