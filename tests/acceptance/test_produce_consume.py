"""Issue 3's acceptance on a real cluster (two NameServers, broker-a and broker-b of three nodes
each): the SDK's sends in every mode, clustering and broadcasting consumers, rebalance, offsets
across restarts, tag filters, reset by time, idempotent retries and bad input."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from client.admin import Admin
from client.consumer_pull import PullConsumer
from client.consumer_push import ConsumeResult, MessageModel, PushConsumer, wait_idle
from client.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    InvalidNameError,
    MessageTooLargeError,
    NoRouteError,
)
from client.messages import OutgoingMessage, ReceivedMessage, SendResult
from client.offsets import StartFrom
from client.producer import Producer
from tests.procs import Cluster, start_cluster, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("acceptance"))
    try:
        with Admin(c.namesrv) as admin:
            wait_until(
                lambda: len([g for g in admin.groups() if g.leader_address]) == 2,
                30,
                "both groups to have a leader",
            )
        yield c
    finally:
        c.close()


def create(cluster: Cluster, topic: str, queues: int = 4) -> None:
    with Admin(cluster.namesrv) as admin:
        assert admin.create_topic(topic, queues=queues) == ["broker-a", "broker-b"]
        wait_until(
            lambda: len(admin.route(topic).write_queues()) == 2 * queues,
            15,
            f"the route of {topic} on both groups",
        )


def drain(
    cluster: Cluster, topic: str, group: str, expect: int, timeout_s: float = 60
) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    with PullConsumer(cluster.namesrv, group, start_from=StartFrom.EARLIEST) as c:
        c.subscribe(topic)
        deadline = time.monotonic() + timeout_s
        while len(got) < expect and time.monotonic() < deadline:
            got.extend(c.poll(500))
        got.extend(c.poll(300))  # anything beyond what was expected is a bug
    return got


def test_every_send_mode_and_a_pull_consumer_get_everything(cluster: Cluster) -> None:
    topic = "modes"
    create(cluster, topic)
    acked: list[SendResult] = []
    with Producer(cluster.namesrv) as p:
        for i in range(200):
            acked.append(p.send(topic, f"sync-{i}".encode(), keys=[f"k{i}"]))
        futs: list[Future[SendResult]] = [
            p.send_async(topic, f"async-{i}".encode()) for i in range(2000)
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
        assert p.flush(60)
    assert len(acked) == 200 + 2000 + 98_000  # 100,200 acknowledged, plus 300 oneway
    assert len({r.msg_id for r in acked}) == len(acked)
    assert {r.broker_group for r in acked} == {"broker-a", "broker-b"}
    got = drain(cluster, topic, "g-modes", len(acked) + 300, timeout_s=180)
    bodies = Counter(m.body for m in got)
    assert all(n == 1 for n in bodies.values()), "a message was stored twice"
    ids = {m.msg_id for m in got}
    assert {r.msg_id for r in acked} <= ids, "an acknowledged message is missing"
    assert sum(1 for b in bodies if b.startswith(b"oneway-")) == 300
    # Per queue, offsets come in order and without gaps.
    by_queue: dict[tuple[str, int], list[int]] = {}
    for m in got:
        by_queue.setdefault((m.broker_group, m.queue_id), []).append(m.queue_offset)
    for offs in by_queue.values():
        assert offs == list(range(offs[0], offs[0] + len(offs)))


def split_evenly(members: list[PushConsumer], n: int) -> bool:
    """Every one of the 8 queues owned by exactly one of the n members, none idle."""
    owned = [q for m in members for q in m.assignment()]
    return len(owned) == 8 == len(set(owned)) and sum(1 for m in members if m.assignment()) == n


def test_clustering_group_shares_queues_and_rebalances(cluster: Cluster) -> None:
    topic = "shared"
    create(cluster, topic, queues=4)
    seen: Counter[str] = Counter()
    by_member: dict[str, set[str]] = {}
    lock = threading.Lock()

    def listener_for(name: str):  # type: ignore[no-untyped-def]
        def listen(m: ReceivedMessage) -> ConsumeResult:
            with lock:
                seen[m.msg_id] += 1
                by_member.setdefault(name, set()).add(m.msg_id)
            return ConsumeResult.SUCCESS

        return listen

    kw = dict(start_from=StartFrom.EARLIEST, rebalance_interval_ms=1000, heartbeat_interval_ms=500)
    members = [
        PushConsumer(
            cluster.namesrv, "g-shared", topic, listener_for(f"c{i}"), client_id=f"c{i}", **kw
        )  # type: ignore[arg-type]
        for i in range(3)
    ]
    try:
        for m in members:
            m.start()
        wait_until(
            lambda: split_evenly(members, 3),
            20,
            "the 8 queues to be split among 3 members, each queue once",
        )
        with Producer(cluster.namesrv) as p:
            acked = [p.send_async(topic, f"m{i}".encode()) for i in range(3000)]
            results = [f.result(timeout=60) for f in acked]
        wait_until(lambda: {r.msg_id for r in results} <= set(seen), 60, "every message consumed")
        assert len(by_member) == 3, "every member consumed something"
        # One member leaves: its queues move to the others within one rebalance period.
        leaving = members.pop()
        leaving.close()
        started = time.monotonic()
        wait_until(lambda: sum(len(m.assignment()) for m in members) == 8, 10, "the queues to move")
        moved_in = time.monotonic() - started
        assert moved_in < 1.0 + 3.0, f"queues moved after {moved_in:.1f} s"
        with Producer(cluster.namesrv) as p:
            more = [p.send(topic, f"after-{i}".encode()) for i in range(200)]
        wait_until(lambda: {r.msg_id for r in more} <= set(seen), 30, "messages after the leave")
        dups = sum(n - 1 for n in seen.values())
        print(f"duplicates around rebalance: {dups}")
    finally:
        for m in members:
            m.close()


def collector(into: set[bytes]):  # type: ignore[no-untyped-def]
    def listen(m: ReceivedMessage) -> None:
        into.add(m.body)

    return listen


def test_broadcast_gives_every_member_everything(cluster: Cluster, tmp_path: Path) -> None:
    topic = "bcast"
    create(cluster, topic, queues=2)
    got: dict[str, set[bytes]] = {"a": set(), "b": set()}
    lock = threading.Lock()
    consumers = [
        PushConsumer(
            cluster.namesrv,
            "g-bcast",
            topic,
            collector(got[name]),
            message_model=MessageModel.BROADCASTING,
            start_from=StartFrom.EARLIEST,
            offset_file=tmp_path / f"{name}.json",
            client_id=name,
        )
        for name in ("a", "b")
    ]
    del lock
    try:
        for c in consumers:
            c.start()
        with Producer(cluster.namesrv) as p:
            for i in range(300):
                p.send(topic, f"b{i}".encode())
        want = {f"b{i}".encode() for i in range(300)}
        wait_until(lambda: got["a"] == want and got["b"] == want, 30, "both members to get all")
    finally:
        for c in consumers:
            c.close()
    assert (tmp_path / "a.json").exists(), "broadcast offsets are kept by the member"


def test_offsets_survive_a_consumer_restart_and_reset_by_time(cluster: Cluster) -> None:
    topic = "restart"
    create(cluster, topic, queues=2)
    seen: list[bytes] = []
    lock = threading.Lock()

    def listen(m: ReceivedMessage) -> None:
        with lock:
            seen.append(m.body)

    with Producer(cluster.namesrv) as p:
        for i in range(100):
            p.send(topic, f"r{i}".encode())
    c = PushConsumer(cluster.namesrv, "g-restart", topic, listen, start_from=StartFrom.EARLIEST)
    with c:
        wait_until(lambda: len(seen) >= 100, 30, "the first 100")
        assert wait_idle(c, 10)
    assert sorted(seen) == sorted(f"r{i}".encode() for i in range(100))
    time.sleep(0.05)
    cut_ms = time.time_ns() // 1_000_000
    time.sleep(0.05)
    with Producer(cluster.namesrv) as p:
        for i in range(50):
            p.send(topic, f"s{i}".encode())
    seen.clear()
    with PushConsumer(cluster.namesrv, "g-restart", topic, listen, start_from=StartFrom.EARLIEST):
        wait_until(lambda: len(seen) >= 50, 30, "the 50 sent while it was away")
        time.sleep(0.5)
    assert sorted(seen) == sorted(f"s{i}".encode() for i in range(50)), (
        "restart resumed at the commit"
    )
    # Backtracking: reset the group to cut_ms; the next start redelivers from there.
    with Admin(cluster.namesrv) as admin:
        new = admin.reset_offsets_to_time("g-restart", topic, cut_ms)
        assert len(new) == 4
    seen.clear()
    with PushConsumer(cluster.namesrv, "g-restart", topic, listen, start_from=StartFrom.LATEST):
        wait_until(lambda: len(seen) >= 50, 30, "redelivery from the reset")
        time.sleep(0.5)
    assert sorted(seen) == sorted(f"s{i}".encode() for i in range(50))


def test_tag_filter(cluster: Cluster) -> None:
    topic = "tags"
    create(cluster, topic, queues=2)
    with Producer(cluster.namesrv) as p:
        for i in range(60):
            p.send(topic, f"t{i}".encode(), tags=("A", "B", "C")[i % 3])
    with PullConsumer(
        cluster.namesrv, "g-tags", start_from=StartFrom.EARLIEST, tag_expression="A || C"
    ) as c:
        c.subscribe(topic)
        got: list[ReceivedMessage] = []
        wait_until(lambda: len(got.__iadd__(c.poll(200))) >= 40, 20, "40 tagged messages")
        got.extend(c.poll(300))
    assert len(got) == 40 and {m.tags for m in got} == {"A", "C"}


def test_bad_input_gives_typed_errors_and_loses_nothing(cluster: Cluster) -> None:
    topic = "badinput"
    create(cluster, topic, queues=1)
    with Producer(cluster.namesrv, max_message_bytes=8 * 1024 * 1024) as p:
        with pytest.raises(MessageTooLargeError):
            p.send(topic, b"x" * (4 * 1024 * 1024 + 1))
        with pytest.raises(InvalidNameError):
            p.send("bad topic!", b"x")
        with pytest.raises(InvalidArgumentError):
            p.send(topic, b"x", properties={"bad\nname": "v"})
        ok = p.send(topic, b"fine")
    with pytest.raises(InvalidArgumentError):
        Producer(cluster.namesrv).send(topic, "not bytes")  # type: ignore[arg-type]
    got = drain(cluster, topic, "g-bad", 1)
    assert [m.msg_id for m in got] == [ok.msg_id]


def test_a_dead_namesrv_is_skipped(cluster: Cluster) -> None:
    topic = "nsfail"
    create(cluster, topic, queues=1)
    addrs = cluster.namesrv_addresses
    # The first address is dead (a port nobody listens on); the second serves.
    with Producer(["127.0.0.1:1", addrs[1]]) as p:
        r = p.send(topic, b"through the second NameServer")
    assert r.msg_id
    with (
        Producer("127.0.0.1:1") as p,
        pytest.raises(BrokerUnavailableError, match=r"127\.0\.0\.1:1"),
    ):
        p.send(topic, b"x")
    with Producer(cluster.namesrv) as p, pytest.raises(NoRouteError):
        p.routes.route("never-created-topic")


def test_batch_of_outgoing_messages_keeps_order_in_one_queue(cluster: Cluster) -> None:
    topic = "batches"
    create(cluster, topic, queues=2)
    with Producer(cluster.namesrv) as p:
        res = p.send_batch(
            topic, [OutgoingMessage(f"o{i}".encode(), tags="T", keys=(f"k{i}",)) for i in range(50)]
        )
    assert len({(r.broker_group, r.queue_id) for r in res}) == 1
    assert [r.queue_offset for r in res] == list(
        range(res[0].queue_offset, res[0].queue_offset + 50)
    )
    with Admin(cluster.namesrv) as admin:
        by_key = admin.messages_by_key(topic, "k7")
        assert [m.body for m in by_key] == [b"o7"]
        assert admin.message_by_id(res[3].msg_id).body == b"o3"
