"""Orderly consumption against a real broker group (issue 16 item 0): 4 queues of keyed messages
consumed by 3 OrderlyPushConsumers while one leaves and one joins, with a message in the middle
that fails twice (suspend, retried locally) and one that always fails (dead-lettered to
%DLQ%<group>, then the queue moves on). Per queue: one message at a time across all members, in
queue order, none skipped; the queue locks go through the Raft log (a follower knows them)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import grpc
import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_orderly import DeadLetter, OrderlyPushConsumer
from raftmq.client.consumer_push import ConsumeResult
from raftmq.client.messages import ReceivedMessage, SendResult
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.common.errors import InvalidArgumentError, from_rpc_error
from raftmq.common.message import dlq_topic
from raftmq.common.pb import broker_pb2, broker_pb2_grpc
from raftmq.common.retry import PROPERTY_DLQ_ORIGIN_MESSAGE_ID, PROPERTY_DLQ_ORIGIN_TOPIC
from raftmq.common.types import QueueRef
from tests.harness.procs import Cluster, start_cluster, wait_until

GROUP = "broker-a"
TOPIC = "orderly-topic"
CGROUP = "orderly-group"
QUEUES = 4
PER_QUEUE = 1000
RETRIED = (1, PER_QUEUE // 2)  # fails twice, then succeeds
DEAD = (2, PER_QUEUE // 2 + 7)  # always fails: dead-lettered after max_reconsume_times


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("orderly"), (GROUP,), namesrvs=1)
    try:
        c.wait_leaders()
        with Admin(c.namesrv) as admin:
            admin.create_topic(TOPIC, queues=QUEUES, ordered=True)
        yield c
    finally:
        c.close()


@dataclass(frozen=True)
class Attempt:
    queue_id: int
    offset: int
    client: str
    start: float
    end: float
    ok: bool


class Recorder:
    """The listener of every member: records each call and any overlap within a queue."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.attempts: list[Attempt] = []
        self.busy: dict[int, str] = {}
        self.overlaps: list[str] = []
        self.failures: dict[tuple[int, int], int] = {}
        self.done: set[tuple[int, int]] = set()

    def listener(self, client: str) -> OrderlyListener:
        return OrderlyListener(self, client)


class OrderlyListener:
    def __init__(self, rec: Recorder, client: str) -> None:
        self.rec = rec
        self.client = client

    def __call__(self, m: ReceivedMessage) -> ConsumeResult:
        rec, key = self.rec, (m.queue_id, m.queue_offset)
        with rec.lock:
            other = rec.busy.get(m.queue_id)
            if other is not None:
                rec.overlaps.append(f"queue {m.queue_id}: {other} busy; {self.client} got {key}")
            rec.busy[m.queue_id] = self.client
        start = time.monotonic()
        time.sleep(0.001)  # widen the window in which a second delivery would overlap
        ok = True
        if key == RETRIED:
            with rec.lock:
                rec.failures[key] = rec.failures.get(key, 0) + 1
                ok = rec.failures[key] > 2
        elif key == DEAD:
            ok = False
        end = time.monotonic()
        with rec.lock:
            rec.busy.pop(m.queue_id, None)
            rec.attempts.append(Attempt(m.queue_id, m.queue_offset, self.client, start, end, ok))
            if ok:
                rec.done.add(key)
        if key == DEAD:
            raise RuntimeError("this message always fails")
        return ConsumeResult.SUCCESS if ok else ConsumeResult.RECONSUME_LATER


def consumer(c: Cluster, rec: Recorder, name: str, dead: list[DeadLetter]) -> OrderlyPushConsumer:
    return OrderlyPushConsumer(
        c.namesrv,
        CGROUP,
        TOPIC,
        rec.listener(name),
        client_id=name,
        start_from=StartFrom.EARLIEST,
        consume_threads=4,
        rebalance_interval_ms=1_000,
        heartbeat_interval_ms=300,
        commit_interval_ms=500,
        max_reconsume_times=2,
        suspend_ms=100,
        lock_renew_interval_ms=1_000,
        lock_live_ms=3_000,
        lock_retry_ms=200,
        long_poll_ms=500,
        on_dead_letter=dead.append,
    ).start()


def lock_rpc(address: str, method: str, client: str, queue_ids: list[int]) -> object:
    with grpc.insecure_channel(address) as ch:
        stub = broker_pb2_grpc.BrokerStub(ch)
        req = broker_pb2.LockQueuesRequest(
            consumer_group="lock-probe", client_id=client, topic=TOPIC, queue_ids=queue_ids
        )
        return getattr(stub, method)(req, timeout=10)


def test_orderly_rebalance_failure_and_dead_letter(cluster: Cluster) -> None:
    began = time.monotonic()
    with Producer(cluster.namesrv) as producer:
        futures: list[Future[SendResult]] = []
        for i in range(PER_QUEUE):
            for q in range(QUEUES):
                futures.append(
                    producer.send_async(
                        TOPIC,
                        f"{q}:{i}".encode(),
                        keys=(f"key-{q}-{i % 8}",),
                        queue=QueueRef(TOPIC, GROUP, q),
                    )
                )
        results = [f.result(timeout=60) for f in futures]
    ids = {(r.queue_id, r.queue_offset): r.msg_id for r in results}
    assert len(ids) == QUEUES * PER_QUEUE
    assert all(0 <= o < PER_QUEUE for _, o in ids)

    rec = Recorder()
    dead: list[DeadLetter] = []
    members = {n: consumer(cluster, rec, n, dead) for n in ("c1", "c2", "c3")}
    try:
        wait_until(lambda: len(rec.done) >= QUEUES * PER_QUEUE // 4, 60, "a quarter consumed")
        members.pop("c1").close()  # leaves: its queues go to the others once it let go
        members["c4"] = consumer(cluster, rec, "c4", dead)  # joins
        wait_until(
            lambda: len(rec.done | {DEAD}) == QUEUES * PER_QUEUE, 120, "every message consumed"
        )
        wait_until(lambda: dead, 10, "the dead letter callback")
    finally:
        for m in members.values():
            m.close()

    assert not rec.overlaps, rec.overlaps[:5]
    clients_per_queue: dict[int, set[str]] = {}
    for q in range(QUEUES):
        mine = sorted((a for a in rec.attempts if a.queue_id == q), key=lambda a: a.start)
        clients_per_queue[q] = {a.client for a in mine}
        for before, after in itertools.pairwise(mine):
            # After the one before it has finished, and never backwards (no redelivery of an
            # earlier message, no skipped one).
            assert after.start >= before.end, (before, after)
            assert after.offset in (before.offset, before.offset + 1), (before, after)
            if after.offset == before.offset:
                assert not before.ok, (before, after)  # only a failed one comes again
        assert mine[0].offset == 0 and mine[-1].offset == PER_QUEUE - 1
    # The rebalance moved queues between members.
    assert any(len(c) > 1 for c in clients_per_queue.values()), clients_per_queue
    assert any("c4" in c for c in clients_per_queue.values()), clients_per_queue

    retried = [a for a in rec.attempts if (a.queue_id, a.offset) == RETRIED]
    assert [a.ok for a in retried] == [False, False, True]
    dead_attempts = [a for a in rec.attempts if (a.queue_id, a.offset) == DEAD]
    assert not any(a.ok for a in dead_attempts)
    # 1 + 2 retries by the member that dead-lettered it (a member that gave the queue up in the
    # middle leaves its count behind: the count is local to a process queue, as in RocketMQ).
    assert len(dead_attempts) >= 3
    assert len({a.client for a in dead_attempts[-3:]}) == 1, dead_attempts
    assert len(dead) == 1 and dead[0].attempts == 3
    with Admin(cluster.namesrv) as admin:
        copy = admin.message_by_id(dead[0].dlq_msg_id)
    assert copy.topic == dlq_topic(CGROUP)
    assert copy.body == f"{DEAD[0]}:{DEAD[1]}".encode()
    assert copy.properties[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] == ids[DEAD]
    assert copy.properties[PROPERTY_DLQ_ORIGIN_TOPIC] == TOPIC
    print(f"orderly test took {time.monotonic() - began:.1f} s")


def test_queue_locks_are_replicated(cluster: Cluster) -> None:
    """A lock granted by the leader is known to every node (the apply of a log entry); a second
    client is refused while the lease lives; only the holder can unlock."""
    layout, _ = cluster.groups[GROUP]
    with Admin(cluster.namesrv) as admin:
        leader = next(g.leader_address for g in admin.groups() if g.broker_group == GROUP)
    got = lock_rpc(leader, "LockQueues", "alpha", [0, 1])
    assert isinstance(got, broker_pb2.LockQueuesResponse)
    assert list(got.granted) == [0, 1] and not got.refused and got.lease_ms == 60_000
    other = lock_rpc(leader, "LockQueues", "beta", [1, 2])
    assert isinstance(other, broker_pb2.LockQueuesResponse)
    assert list(other.granted) == [2] and list(other.refused) == [1]
    wrong = lock_rpc(leader, "UnlockQueues", "beta", [0])  # not beta's: left alone
    assert isinstance(wrong, broker_pb2.LockQueuesResponse) and not wrong.granted
    followers = [layout.address(i) for i in range(3) if layout.address(i) != leader]
    for address in followers:
        with pytest.raises(grpc.RpcError) as info:
            lock_rpc(address, "LockQueues", "alpha", [0])
        assert from_rpc_error(info.value).code == "NOT_LEADER"
    # Every replica applied the entries: hand leadership over and the new leader still refuses.
    with Admin(cluster.namesrv) as admin:
        new = admin.elect(GROUP, next(f"n{i}" for i in range(3) if layout.address(i) != leader))
    new_leader = next(layout.address(i) for i in range(3) if f"n{i}" == new)
    assert new_leader != leader

    def refused_on_new_leader() -> bool:
        try:
            out = lock_rpc(new_leader, "LockQueues", "gamma", [0, 1, 2])
        except grpc.RpcError:
            return False
        assert isinstance(out, broker_pb2.LockQueuesResponse)
        assert list(out.refused) == [0, 1, 2] and not out.granted, out
        return True

    wait_until(refused_on_new_leader, 30, "the new leader to answer")
    released = lock_rpc(new_leader, "UnlockQueues", "alpha", [0, 1])
    assert isinstance(released, broker_pb2.LockQueuesResponse)
    assert list(released.granted) == [0, 1]


def test_bad_lock_requests(cluster: Cluster) -> None:
    with Admin(cluster.namesrv) as admin:
        leader = next(g.leader_address for g in admin.groups() if g.broker_group == GROUP)
    for client, queues in (("", [0]), ("x", []), ("x", [-1])):
        with pytest.raises(grpc.RpcError) as info:
            lock_rpc(leader, "LockQueues", client, queues)
        err = from_rpc_error(info.value)
        assert isinstance(err, InvalidArgumentError), err


def test_orderly_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="below lock_live_ms"):
        OrderlyPushConsumer(
            "127.0.0.1:1", "g", "t", lambda m: None, lock_renew_interval_ms=5, lock_live_ms=5
        )


FAILOVER_TOPIC = "orderly-failover"
FAILOVER_GROUP = "orderly-failover-group"
FAILOVER_PER_QUEUE = 400


def test_orderly_survives_a_leader_kill(cluster: Cluster) -> None:
    """The group's leader is SIGKILLed while two orderly members consume: the new leader knows
    the locks (an intruder is refused every queue), and per queue the order holds: one message
    at a time, never backwards, none skipped."""
    layout, procs = cluster.groups[GROUP]
    with Admin(cluster.namesrv) as admin:
        admin.create_topic(FAILOVER_TOPIC, queues=QUEUES)
    with Producer(cluster.namesrv) as producer:
        futures = [
            producer.send_async(
                FAILOVER_TOPIC, f"{q}:{i}".encode(), queue=QueueRef(FAILOVER_TOPIC, GROUP, q)
            )
            for i in range(FAILOVER_PER_QUEUE)
            for q in range(QUEUES)
        ]
        for f in futures:
            f.result(timeout=60)
    rec = Recorder()
    slow = 0.005

    def member(name: str) -> OrderlyPushConsumer:
        listener = rec.listener(name)

        def call(m: ReceivedMessage) -> ConsumeResult:
            time.sleep(slow)
            return listener(m)

        return OrderlyPushConsumer(
            cluster.namesrv,
            FAILOVER_GROUP,
            FAILOVER_TOPIC,
            call,
            client_id=name,
            start_from=StartFrom.EARLIEST,
            heartbeat_interval_ms=300,
            commit_interval_ms=300,
            lock_renew_interval_ms=1_000,
            lock_live_ms=3_000,
            lock_retry_ms=200,
            long_poll_ms=500,
        ).start()

    members = [member("f1"), member("f2")]
    killed = -1
    try:
        wait_until(lambda: len(rec.done) >= QUEUES * FAILOVER_PER_QUEUE // 4, 60, "a quarter")
        with Admin(cluster.namesrv) as admin:
            leader = next(g.leader_address for g in admin.groups() if g.broker_group == GROUP)
        killed = next(i for i in range(3) if layout.address(i) == leader)
        procs[killed].kill()

        def intruder_refused() -> bool:
            for i in range(3):
                if i == killed:
                    continue
                try:
                    with grpc.insecure_channel(layout.address(i)) as ch:
                        out = broker_pb2_grpc.BrokerStub(ch).LockQueues(
                            broker_pb2.LockQueuesRequest(
                                consumer_group=FAILOVER_GROUP,
                                client_id="intruder",
                                topic=FAILOVER_TOPIC,
                                queue_ids=list(range(QUEUES)),
                            ),
                            timeout=5,
                        )
                except grpc.RpcError:
                    continue  # not the leader (yet)
                assert not out.granted, f"the new leader granted {list(out.granted)}"
                return True
            return False

        wait_until(intruder_refused, 30, "a new leader refusing the held queues")
        wait_until(
            lambda: len(rec.done) == QUEUES * FAILOVER_PER_QUEUE, 120, "every message consumed"
        )
    finally:
        for m in members:
            m.close()
        if killed >= 0:
            procs[killed].start("broker.started")
    assert not rec.overlaps, rec.overlaps[:5]
    for q in range(QUEUES):
        mine = sorted((a for a in rec.attempts if a.queue_id == q), key=lambda a: a.start)
        for before, after in itertools.pairwise(mine):
            assert after.start >= before.end, (before, after)
            assert after.offset == before.offset + 1, (before, after)
        assert mine[0].offset == 0 and mine[-1].offset == FAILOVER_PER_QUEUE - 1
