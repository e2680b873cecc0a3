"""The SDK's framed data path against real brokers: a 3-node group and a NameServer as processes,
each node fronted by tests/client/frame_broker.py (a framed proxy to its gRPC service) until the
broker serves frames itself. Sends, idempotent retries, pulls, commits, heartbeats over frames;
gRPC when no data address is known; a frame server killed mid-send maps to the outcome classes
(maybe stored -> OutcomeUnknownError, never sent -> BrokerUnavailableError)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.client.admin import Admin
from raftmq.client.aio import AsyncProducer, AsyncPullConsumer
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.consumer_push import ConsumeResult, PushConsumer, wait_idle
from raftmq.client.data_pool import DataPool, may_have_stored
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.client.producer.transaction import LocalTransactionState, TransactionProducer
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import (
    BrokerUnavailableError,
    NotLeaderError,
    OutcomeUnknownError,
    RequestTimeoutError,
)
from raftmq.common.pb import broker_pb2
from raftmq.common.types import QueueRef
from tests.client.frame_broker import FrameBrokerProxy
from tests.harness.local_cluster import free_ports
from tests.harness.procs import Cluster, Proc, start_cluster, wait_until

GROUP = "broker-a"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # The brokers' own data servers are off: these tests put a forwarding proxy in front of
    # each node (frames in, gRPC out) to count and kill the frame path at will; the brokers'
    # data server itself is tested in tests/broker/test_data_server.py and by every other suite.
    c = start_cluster(
        tmp_path_factory.mktemp("data-path"),
        (GROUP,),
        namesrvs=1,
        broker_args=["--data-listen", "off"],
    )
    try:
        with Admin(c.namesrv) as admin:
            wait_until(
                lambda: any(g.leader_address for g in admin.groups()), 60, "a leader of broker-a"
            )
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def proxies(cluster: Cluster) -> Iterator[dict[str, FrameBrokerProxy]]:
    layout, _ = cluster.groups[GROUP]
    out = {layout.address(i): FrameBrokerProxy(layout.address(i)) for i in range(3)}
    try:
        yield out
    finally:
        for p in out.values():
            p.close()


def overrides(proxies: dict[str, FrameBrokerProxy]) -> dict[str, str]:
    return {a: p.address for a, p in proxies.items()}


def total(proxies: dict[str, FrameBrokerProxy], method: DataMethod) -> int:
    return sum(p.count(method) for p in proxies.values())


def leader(cluster: Cluster) -> str:
    with Admin(cluster.namesrv) as admin:
        g = next(g for g in admin.groups() if g.broker_group == GROUP)
        return g.leader_address


def topic(cluster: Cluster, name: str, queues: int = 2) -> str:
    with Admin(cluster.namesrv) as admin:
        admin.create_topic(name, queues=queues)
        wait_until(lambda: admin.route(name).write_queues(), 30, f"the route of {name}")
    return name


def drain(
    cluster: Cluster, name: str, group: str, expect: int, data: dict[str, str] | None
) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    with PullConsumer(cluster.namesrv, group, start_from=StartFrom.EARLIEST) as c:
        if data is not None:
            c.routes._override_data_addresses(data)
        c.subscribe(name)
        deadline = time.monotonic() + 30
        while len(got) < expect and time.monotonic() < deadline:
            got.extend(c.poll(300))
        got.extend(c.poll(300))
    return got


def queue_max(cluster: Cluster, q: QueueRef) -> int:
    from raftmq.client.routes import ChannelPool

    pool = ChannelPool()
    try:
        req = broker_pb2.GetQueueBoundsRequest(topic=q.topic, queue_id=q.queue_id)
        return int(pool.broker(leader(cluster)).GetQueueBounds(req, timeout=5).max_offset)
    finally:
        pool.close()


def held_proxy(cluster: Cluster, tmp: Path, target: str) -> tuple[Proc, str]:
    """A frame proxy process that stores sends and never answers them, to be SIGKILLed."""
    proc = Proc(
        "frame-broker-hold",
        ["-m", "tests.client.frame_broker", "--target", target, "--hold-sends"],
        tmp / "frame-broker-hold.log",
    )
    proc.start("frame_broker.started")
    return proc, proc.started_line.split("address=", 1)[1]


# ---- through frames ---------------------------------------------------------------------------


def test_producer_and_pull_consumer_over_frames(
    cluster: Cluster, proxies: dict[str, FrameBrokerProxy]
) -> None:
    name = topic(cluster, "dp-basic")
    sends_before = total(proxies, DataMethod.SEND_MESSAGE)
    with Producer(cluster.namesrv) as p:
        p.routes._override_data_addresses(overrides(proxies))
        sync = [p.send(name, b"s%d" % i, tags="a") for i in range(50)]
        futs = [p.send_async(name, b"a%d" % i, tags="b") for i in range(500)]
        done = threading.Event()
        seen: list[object] = []

        def cb(result: object, error: object) -> None:
            seen.append(result if error is None else error)
            done.set()

        p.send_async(name, b"cb", callback=cb)
        results = [f.result(30) for f in futs]
        assert done.wait(10) and not isinstance(seen[0], Exception)
        assert p._data.loop is not None and len(p._data) >= 1
    assert all(not r.duplicate for r in sync + results)
    assert total(proxies, DataMethod.SEND_MESSAGE) > sends_before

    pulls_before = total(proxies, DataMethod.PULL_MESSAGE)
    with PullConsumer(cluster.namesrv, "g-frames", start_from=StartFrom.EARLIEST) as c:
        c.routes._override_data_addresses(overrides(proxies))
        queues = c.subscribe(name)
        got: list[ReceivedMessage] = []
        deadline = time.monotonic() + 30
        while len(got) < 551 and time.monotonic() < deadline:
            got.extend(c.poll(300))
        assert sorted(m.body for m in got) == sorted(
            [b"s%d" % i for i in range(50)] + [b"a%d" % i for i in range(500)] + [b"cb"]
        )
        c.commit()
        for q in queues:
            assert c.committed(q) == c.position(q)
        c.seek_to_beginning(queues[0])
        assert c.position(queues[0]) == 0
        c.seek_to_timestamp(queues[0], 0)
    assert total(proxies, DataMethod.PULL_MESSAGE) > pulls_before
    for m in (DataMethod.COMMIT_OFFSET, DataMethod.QUERY_OFFSET, DataMethod.GET_QUEUE_BOUNDS):
        assert total(proxies, m) > 0, m
    assert total(proxies, DataMethod.SEARCH_OFFSET_BY_TIMESTAMP) > 0


def test_push_consumer_over_frames(cluster: Cluster, proxies: dict[str, FrameBrokerProxy]) -> None:
    name = topic(cluster, "dp-push")
    with Producer(cluster.namesrv) as p:
        p.routes._override_data_addresses(overrides(proxies))
        for f in [p.send_async(name, b"m%d" % i) for i in range(300)]:
            f.result(30)
    heartbeats_before = total(proxies, DataMethod.HEARTBEAT)
    commits_before = total(proxies, DataMethod.COMMIT_OFFSET)
    lock = threading.Lock()
    bodies: list[bytes] = []

    def listen(m: ReceivedMessage) -> ConsumeResult:
        with lock:
            bodies.append(m.body)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        cluster.namesrv,
        "g-push-frames",
        name,
        listen,
        start_from=StartFrom.EARLIEST,
        commit_interval_ms=200,
        max_inflight_per_queue=16,  # pauses and wakes the fetchers many times
    )
    consumer.routes._override_data_addresses(overrides(proxies))
    with consumer:
        wait_until(lambda: len(bodies) >= 300, 30, "300 messages in the listener")
        assert wait_idle(consumer, 10)
        time.sleep(0.5)  # a commit period
    assert sorted(bodies) == sorted(b"m%d" % i for i in range(300))
    assert total(proxies, DataMethod.HEARTBEAT) > heartbeats_before
    assert total(proxies, DataMethod.COMMIT_OFFSET) > commits_before
    # what was committed over frames holds: a new member of the group starts after it all
    again = drain(cluster, name, "g-push-frames", 0, overrides(proxies))
    assert again == []


def test_idempotent_retry_through_a_killed_frame_server_is_stored_once(
    cluster: Cluster, proxies: dict[str, FrameBrokerProxy], tmp_path: Path
) -> None:
    name = topic(cluster, "dp-retry", queues=1)
    q = QueueRef(name, GROUP, 0)
    lead = leader(cluster)
    hold, hold_address = held_proxy(cluster, tmp_path, lead)
    try:
        with Producer(cluster.namesrv, send_timeout_ms=20_000) as p:
            p.routes._override_data_addresses({**overrides(proxies), lead: hold_address})
            before = queue_max(cluster, q)
            fut = p.send_async(name, b"once", queue=q)
            wait_until(lambda: queue_max(cluster, q) > before, 10, "the held send to be stored")
            # The answer never comes; the retry (same sequence) goes to a live frame server.
            p.routes._override_data_addresses(overrides(proxies))
            hold.kill()
            result = fut.result(20)
        assert result.duplicate and result.queue_offset == before
    finally:
        hold.kill()
    got = drain(cluster, name, "g-retry", 1, overrides(proxies))
    assert [m.body for m in got] == [b"once"]


# ---- outcome classes when the frame server dies ----------------------------------------------


def test_killed_frame_server_mid_send_is_outcome_unknown(
    cluster: Cluster, proxies: dict[str, FrameBrokerProxy], tmp_path: Path
) -> None:
    name = topic(cluster, "dp-unknown", queues=1)
    q = QueueRef(name, GROUP, 0)
    lead = leader(cluster)
    hold, hold_address = held_proxy(cluster, tmp_path, lead)
    try:
        with Producer(cluster.namesrv, retries=0) as p:
            p.routes._override_data_addresses({**overrides(proxies), lead: hold_address})
            before = queue_max(cluster, q)
            fut = p.send_async(name, b"maybe", queue=q)
            wait_until(lambda: queue_max(cluster, q) > before, 10, "the held send to be stored")
            hold.kill()
            err = fut.exception(20)
        assert isinstance(err, OutcomeUnknownError), err
    finally:
        hold.kill()
    # it was in fact stored: exactly why the answer must not say "not stored"
    assert [m.body for m in drain(cluster, name, "g-unknown", 1, overrides(proxies))] == [b"maybe"]


def test_dead_frame_server_before_send_is_broker_unavailable(
    cluster: Cluster, proxies: dict[str, FrameBrokerProxy]
) -> None:
    name = topic(cluster, "dp-unsent", queues=1)
    lead = leader(cluster)
    (nobody,) = free_ports(1)  # nothing listens there: the connection is refused
    with Producer(cluster.namesrv, retries=0) as p:
        p.routes._override_data_addresses({**overrides(proxies), lead: f"127.0.0.1:{nobody}"})
        err = p.send_async(name, b"never", queue=QueueRef(name, GROUP, 0)).exception(20)
    assert type(err) is BrokerUnavailableError, err
    assert drain(cluster, name, "g-unsent", 0, overrides(proxies)) == []


def test_outcome_rule_of_frames() -> None:
    """data_pool.may_have_stored: what a failed frame may have stored."""
    assert not may_have_stored(BrokerUnavailableError("x", details={"not_sent": "1"}))
    assert not may_have_stored(NotLeaderError("x", leader_hint="h:1"))
    assert may_have_stored(BrokerUnavailableError("lost", details={"request_id": "7"}))
    assert may_have_stored(RequestTimeoutError("late", details={"request_id": "7"}))
    assert may_have_stored(BrokerUnavailableError("node n0 is shutting down"))  # the server's


def test_data_pool_is_bounded_and_closes_clients() -> None:
    pool = DataPool(max_connections=2)
    try:
        ports = free_ports(3)
        for port in ports:
            fut = pool.submit(
                f"127.0.0.1:{port}",
                DataMethod.QUERY_OFFSET,
                broker_pb2.QueryOffsetRequest(consumer_group="g", topic="t"),
                1.0,
            )
            err = fut.exception(10)
            assert isinstance(err, BrokerUnavailableError) and not may_have_stored(err)
        assert len(pool) == 2 and pool.evictions == 1
    finally:
        pool.close()
    err = pool.submit(
        "127.0.0.1:1", DataMethod.HEARTBEAT, broker_pb2.HeartbeatRequest(), 1.0
    ).exception(1)
    assert isinstance(err, BrokerUnavailableError) and not may_have_stored(err)


# ---- one data transport: no gRPC fallback -------------------------------------------------------


def test_a_node_without_a_data_address_is_unavailable_not_a_grpc_fallback(
    cluster: Cluster, proxies: dict[str, FrameBrokerProxy]
) -> None:
    """Sends and pulls travel on frames only (issue 24): a leader that advertises no data
    address fails a send with BrokerUnavailableError saying what to do, nothing is sent over
    gRPC (nothing stored), and the frame loop never starts."""
    name = topic(cluster, "dp-grpc")
    q = QueueRef(name, GROUP, 0)
    before = queue_max(cluster, q)
    with Producer(cluster.namesrv, send_timeout_ms=1500, request_timeout_ms=500) as p:
        # the brokers run with --data-listen off: the NameServer advertises no data_address
        route = p.routes.route(name)
        assert all(not d for g in route.groups.values() for d in g.data_addresses)
        with pytest.raises(BrokerUnavailableError, match="--data-listen") as info:
            p.send(name, b"never", queue=q)
        assert type(info.value) is BrokerUnavailableError  # surely not stored
        assert p._data._loop_thread is None  # the frame loop never started
    assert queue_max(cluster, q) == before
    # A consumer's offsets and a transactional half travel on frames too (no gRPC fallback).
    no_data = pytest.raises(BrokerUnavailableError, match="--data-listen")
    with PullConsumer(cluster.namesrv, "g-no-data") as c, no_data:
        c.committed(q)
    commit = lambda _: LocalTransactionState.COMMIT  # noqa: E731
    txn = TransactionProducer(
        cluster.namesrv, "txn-no-data", lambda _: LocalTransactionState.UNKNOWN,
        send_timeout_ms=800, request_timeout_ms=300,
    )  # fmt: skip
    with txn, pytest.raises(BrokerUnavailableError, match="--data-listen"):
        txn.send_in_transaction(name, b"never", commit, queue=q)
    assert queue_max(cluster, q) == before


# ---- the asyncio face ---------------------------------------------------------------------


def test_asyncio_face_over_frames(cluster: Cluster, proxies: dict[str, FrameBrokerProxy]) -> None:
    name = topic(cluster, "dp-aio")

    async def run() -> list[bytes]:
        async with AsyncProducer(cluster.namesrv) as p:
            p.producer.routes._override_data_addresses(overrides(proxies))
            results = await asyncio.gather(*(p.send(name, b"x%d" % i) for i in range(200)))
            assert len({(r.queue_id, r.queue_offset) for r in results}) == 200
            # The producer runs on this loop: no I/O thread of its own, the frames' answers
            # arrive here and complete every future at once, with no wake-up from a thread.
            waker = p._waker
            assert waker is not None and waker.completions == 200
            assert waker.direct == 200 and waker.wakeups == 0, (waker.direct, waker.wakeups)
            assert p.producer._data._loop_thread is None
            assert not [t for t in threading.enumerate() if t.name == "raftmq-producer-data"]
        got: list[bytes] = []
        async with AsyncPullConsumer(cluster.namesrv, "g-aio", start_from=StartFrom.EARLIEST) as c:
            c.consumer.routes._override_data_addresses(overrides(proxies))
            await c.subscribe(name)
            async with asyncio.timeout(30):
                async for m in c:
                    got.append(m.body)
                    if len(got) == 200:
                        break
            await c.commit()
        return got

    sends_before = total(proxies, DataMethod.SEND_MESSAGE)
    got = asyncio.run(run())
    assert sorted(got) == sorted(b"x%d" % i for i in range(200))
    assert total(proxies, DataMethod.SEND_MESSAGE) > sends_before
