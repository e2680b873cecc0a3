"""The SDK's route cache against two real NameServer processes (the test registers a broker
group with them as a broker would): caching with time passed in, refresh after the interval or
at once when invalidated, failover between NameServers, typed errors naming every address, and
the bounded channel pool."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.client.routes import ChannelPool, RouteCache
from raftmq.common.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    NoRouteError,
    NotLeaderError,
)
from raftmq.common.pb import common_pb2, namesrv_pb2
from tests.harness.local_cluster import free_ports
from tests.harness.procs import Proc, namesrv_proc

TOPIC = "routes-topic"


@pytest.fixture
def namesrvs(tmp_path: Path) -> Iterator[list[Proc]]:
    procs = [namesrv_proc(tmp_path, f"ns{i}", port) for i, port in enumerate(free_ports(2))]
    try:
        for p in procs:
            p.start("namesrv.started")
        yield procs
    finally:
        for p in procs:
            p.kill()


def address(p: Proc) -> str:
    return p.started_line.split("listen=", 1)[1]


def register(
    pool: ChannelPool, ns: str, node: str, role: common_pb2.Role, term: int, port: int
) -> None:
    """What a broker node of broker-a does at every heartbeat."""
    pool.namesrv(ns).RegisterBroker(
        namesrv_pb2.RegisterBrokerRequest(
            cluster="C",
            broker_group="broker-a",
            node_id=node,
            address=f"127.0.0.1:{port}",
            raft_address=f"127.0.0.1:{port + 1}",
            role=role,
            term=term,
            topics=[
                common_pb2.TopicConfig(
                    topic=TOPIC,
                    read_queue_nums=2,
                    write_queue_nums=2,
                    perm=common_pb2.PERM_READ_WRITE,
                )
            ],
        ),
        timeout=5,
    )


def register_group(pool: ChannelPool, addrs: list[str], leader: str, term: int) -> None:
    for ns in addrs:
        for i, node in enumerate(("n0", "n1", "n2")):
            role = common_pb2.LEADER if node == leader else common_pb2.FOLLOWER
            register(pool, ns, node, role, term, 50_000 + 10 * i)


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def test_cached_until_the_interval_passes_or_invalidated(namesrvs: list[Proc]) -> None:
    addrs = [address(p) for p in namesrvs]
    pool = ChannelPool()
    clock = Clock()
    cache = RouteCache(addrs, pool, refresh_interval_ms=30_000, clock_ms=clock)
    try:
        register_group(pool, addrs, "n0", term=1)
        route = cache.route(TOPIC)
        g = route.group("broker-a")
        assert g is not None and g.leader_address == "127.0.0.1:50000"
        assert g.addresses[0] == g.leader_address, "leader first"
        assert g.followers == ("127.0.0.1:50010", "127.0.0.1:50020")
        assert len(route.read_queues()) == 2 and len(route.write_queues()) == 2
        # A new leader (n1, term 2): within the interval the cached route still answers.
        register_group(pool, addrs, "n1", term=2)
        clock.now_ms += 29_999
        assert cache.leader(TOPIC, "broker-a") == "127.0.0.1:50000"
        # The interval passed: the next use fetches again.
        clock.now_ms += 1
        assert cache.leader(TOPIC, "broker-a") == "127.0.0.1:50010"
        # NOT_LEADER or an unreachable broker: the caller invalidates and the next use fetches.
        register_group(pool, addrs, "n2", term=3)
        assert cache.leader(TOPIC, "broker-a") == "127.0.0.1:50010"
        cache.invalidate(TOPIC)
        assert cache.leader(TOPIC, "broker-a") == "127.0.0.1:50020"
        assert cache.leader(TOPIC, "broker-a", refresh=True) == "127.0.0.1:50020"
    finally:
        pool.close()


def test_no_leader_known_is_a_typed_error(namesrvs: list[Proc]) -> None:
    addrs = [address(p) for p in namesrvs]
    pool = ChannelPool()
    try:
        for ns in addrs:
            register(pool, ns, "n0", common_pb2.FOLLOWER, 1, 50_000)
        cache = RouteCache(addrs, pool)
        with pytest.raises(NotLeaderError, match="no leader is known"):
            cache.leader(TOPIC, "broker-a")
        assert cache.nodes(TOPIC, "broker-a") == ("127.0.0.1:50000",), "nodes are still listed"
    finally:
        pool.close()


def test_a_group_the_route_lacks_is_named_at_once(namesrvs: list[Proc]) -> None:
    """Issue 26: an unknown broker group was a NotLeaderError ("no leader is known yet"), which
    senders retry until their timeout (10 s) instead of naming the group."""
    addrs = [address(p) for p in namesrvs]
    pool = ChannelPool()
    try:
        register_group(pool, addrs, "n0", term=1)
        cache = RouteCache(addrs, pool)
        started = time.monotonic()
        lacking = r"no queues on broker group 'broker-z'"
        with pytest.raises(InvalidArgumentError, match=lacking) as e:
            cache.leader(TOPIC, "broker-z")
        assert "its broker groups: broker-a" in e.value.message and not e.value.retryable
        assert time.monotonic() - started < 5
    finally:
        pool.close()


def test_a_dead_namesrv_is_skipped_and_all_dead_names_every_address(
    namesrvs: list[Proc],
) -> None:
    addrs = [address(p) for p in namesrvs]
    pool = ChannelPool()
    clock = Clock()
    try:
        register_group(pool, addrs, "n0", term=1)
        cache = RouteCache(addrs, pool, refresh_interval_ms=1_000, clock_ms=clock)
        namesrvs[0].kill()
        assert cache.leader(TOPIC, "broker-a") == "127.0.0.1:50000", "the second one answers"
        with pytest.raises(NoRouteError, match=r"'never-created'.*" + addrs[1].replace(".", r"\.")):
            cache.route("never-created")
        namesrvs[1].kill()
        # Every NameServer away: a cached route, even stale, beats nothing ...
        clock.now_ms += 5_000
        assert cache.leader(TOPIC, "broker-a") == "127.0.0.1:50000"
        # ... also after a send that timed out invalidated it (chaos control-plane-down: every
        # later send failed as BROKER_UNAVAILABLE until a NameServer came back).
        cache.invalidate(TOPIC)
        assert cache.leader(TOPIC, "broker-a") == "127.0.0.1:50000"
        cache.invalidate()
        assert cache.nodes(TOPIC, "broker-a")[0] == "127.0.0.1:50000"
        # ... and without one the error names every address tried.
        fresh = RouteCache(addrs, pool)
        with pytest.raises(BrokerUnavailableError) as info:
            fresh.route(TOPIC)
        for a in addrs:
            assert a in info.value.message
        assert "no NameServer answered" in info.value.message
    finally:
        pool.close()


def test_channel_pool_is_bounded_and_reuses_channels() -> None:
    pool = ChannelPool(max_channels=2)
    try:
        a = pool.channel("127.0.0.1:1")
        assert pool.channel("127.0.0.1:1") is a
        pool.channel("127.0.0.1:2")
        pool.channel("127.0.0.1:1")  # used last: 127.0.0.1:2 is now the least recent
        pool.channel("127.0.0.1:3")
        assert len(pool) == 2
        assert pool.channel("127.0.0.1:1") is a, "the recently used one was kept"
        with pytest.raises(ValueError):
            ChannelPool(max_channels=0)
    finally:
        pool.close()
    assert len(pool) == 0
