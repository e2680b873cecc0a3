"""Routes for the SDK: a bounded gRPC channel pool and a route cache over several NameServers.

The cache asks the NameServers in turn (each is independent and any may be down), keeps a topic's
route for refresh_interval_ms, and drops it at once when a broker says NOT_LEADER or cannot be
reached. It never guesses a leader: without one a group is reported as having none. Each node's
framed data address (`BrokerNode.data_address`, "" = gRPC only) is kept beside its gRPC address.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc

from raftmq.client.queue_selector import PublishQueues
from raftmq.common import tls
from raftmq.common.auth import Credentials
from raftmq.common.auth_client import client_signer, signed
from raftmq.common.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    NoRouteError,
    NotLeaderError,
    RaftMQError,
    UnsupportedError,
    from_rpc_error,
)
from raftmq.common.grpc_options import CHANNEL_LIVENESS
from raftmq.common.pb import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    namesrv_pb2,
    namesrv_pb2_grpc,
)
from raftmq.common.types import QueueRef, parse_address_list

MIB = 1 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * MIB),
    ("grpc.max_send_message_length", 64 * MIB),
    ("grpc.enable_retries", 0),  # the SDK retries itself, idempotently
    *CHANNEL_LIVENESS,
]
NAMESRV_TIMEOUT_S = 3.0
PROBE_TIMEOUT_S = 1.0  # asking a wrong-role address what it is (only after UNIMPLEMENTED)
MAX_KNOWN_NODES = 4096  # gRPC -> data address entries kept (least recently seen dropped)
_STALE_MS = -(1 << 62)  # an invalidated route's fetch time: due for a refresh at its next use


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(slots=True)
class _PoolEntry:
    channel: grpc.Channel
    broker: broker_pb2_grpc.BrokerStub | None = None
    namesrv: namesrv_pb2_grpc.NameServerStub | None = None


class ChannelPool:
    """One channel per address, at most `max_channels` (least recently used closed first).
    The one place the SDK creates channels, all with CHANNEL_OPTIONS. Thread-safe."""

    def __init__(
        self,
        max_channels: int = 256,
        tls_config: tls.Tls | Any | None = tls.PROCESS,
        *,
        credentials: Credentials | None = None,
    ) -> None:
        if max_channels < 1:
            raise ValueError("max_channels must be >= 1")
        self._tls = tls.resolve(tls_config)  # read once: every channel of the pool alike
        self._max = max_channels
        # issue 19: every call signed with these (else RAFTMQ_ACCESS_KEY/... or the file)
        self.signer = client_signer(credentials)
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[str, _PoolEntry] = collections.OrderedDict()

    def _entry_locked(self, address: str) -> _PoolEntry:
        entry = self._entries.get(address)
        if entry is not None:
            self._entries.move_to_end(address)
            return entry
        # TLS (or plaintext) per the pool's material, every call signed when credentials exist
        entry = _PoolEntry(signed(tls.channel(address, CHANNEL_OPTIONS, self._tls), self.signer))
        self._entries[address] = entry
        while len(self._entries) > self._max:
            _, old = self._entries.popitem(last=False)
            old.channel.close()
        return entry

    def channel(self, address: str) -> grpc.Channel:
        with self._lock:
            return self._entry_locked(address).channel

    def broker(self, address: str) -> broker_pb2_grpc.BrokerStub:
        with self._lock:
            entry = self._entry_locked(address)
            if entry.broker is None:
                entry.broker = broker_pb2_grpc.BrokerStub(entry.channel)
            return entry.broker

    def namesrv(self, address: str) -> namesrv_pb2_grpc.NameServerStub:
        with self._lock:
            entry = self._entry_locked(address)
            if entry.namesrv is None:
                entry.namesrv = namesrv_pb2_grpc.NameServerStub(entry.channel)
            return entry.namesrv

    def __len__(self) -> int:
        return len(self._entries)

    def close(self) -> None:
        with self._lock:
            for entry in self._entries.values():
                entry.channel.close()
            self._entries.clear()


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """Where one node serves: gRPC always, the framed data path when it offers one."""

    address: str  # gRPC "host:port": admin, control plane, and the data path's fallback
    data_address: str  # framed data path "host:port"; "" = gRPC only


@dataclass(frozen=True, slots=True)
class GroupRoute:
    """One broker group as a route names it: its leader and every node, leader first."""

    broker_group: str
    leader_address: str  # "" = no leader known
    addresses: tuple[str, ...]
    term: int
    data_addresses: tuple[str, ...] = ()  # beside `addresses`, "" where a node has none

    @property
    def followers(self) -> tuple[str, ...]:
        """The nodes that may serve reads of committed data when the leader is away."""
        return tuple(a for a in self.addresses if a != self.leader_address)


@dataclass(frozen=True, slots=True)
class QueueData:
    broker_group: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int  # common_pb2.Permission
    ordered: bool

    @property
    def writable(self) -> bool:
        return self.perm in (
            common_pb2.PERM_UNSPECIFIED,
            common_pb2.PERM_READ_WRITE,
            common_pb2.PERM_WRITE_ONLY,
        )

    @property
    def readable(self) -> bool:
        return self.perm in (
            common_pb2.PERM_UNSPECIFIED,
            common_pb2.PERM_READ_WRITE,
            common_pb2.PERM_READ_ONLY,
        )


@dataclass(frozen=True, slots=True)
class TopicRoute:
    topic: str
    queues: tuple[QueueData, ...]
    groups: dict[str, GroupRoute]
    fetched_ms: int
    _publish: list[PublishQueues] = field(default_factory=list, compare=False, repr=False)

    def write_queues(self) -> list[QueueRef]:
        return [
            QueueRef(self.topic, q.broker_group, i)
            for q in self.queues
            if q.writable
            for i in range(q.write_queue_nums)
        ]

    def read_queues(self) -> list[QueueRef]:
        return sorted(
            QueueRef(self.topic, q.broker_group, i)
            for q in self.queues
            if q.readable
            for i in range(q.read_queue_nums)
        )

    def publish_queues(self) -> PublishQueues:
        """The writable queues, sorted once per route (a send asks for them every time)."""
        if self._publish:
            return self._publish[0]
        queues = self.write_queues()
        if not queues:
            raise NoRouteError(
                f"topic {self.topic!r} has no writable queue on any broker group",
                details={"topic": self.topic},
            )
        self._publish.append(PublishQueues.of(self.topic, queues))
        return self._publish[0]

    def group(self, broker_group: str) -> GroupRoute | None:
        return self.groups.get(broker_group)


def _route_from_pb(r: namesrv_pb2.TopicRouteData, now_ms: int) -> TopicRoute:
    groups: dict[str, GroupRoute] = {}
    for g in r.groups:
        nodes = sorted(g.nodes, key=lambda n: (not n.is_leader, n.node_id))
        groups[g.broker_group] = GroupRoute(
            g.broker_group,
            g.leader_address,
            tuple(n.address for n in nodes if n.address),
            g.term,
            tuple(n.data_address for n in nodes if n.address),
        )
    queues = tuple(
        QueueData(q.broker_group, q.read_queue_nums, q.write_queue_nums, q.perm, q.ordered)
        for q in r.queues
    )
    return TopicRoute(r.topic, queues, groups, now_ms)


class RouteCache:
    """Topic routes from the NameServers, cached for refresh_interval_ms. Thread-safe."""

    def __init__(
        self,
        namesrv_addresses: str | Sequence[str],
        pool: ChannelPool,
        *,
        refresh_interval_ms: int = 30_000,
        max_topics: int = 10_000,
        clock_ms: Callable[[], int] = monotonic_ms,
    ) -> None:
        self.namesrv_addresses = parse_address_list(namesrv_addresses, "namesrv_addresses")
        self._pool = pool
        self._refresh_ms = refresh_interval_ms
        self._max_topics = max_topics
        self._clock = clock_ms
        self._lock = threading.Lock()
        self._routes: collections.OrderedDict[str, TopicRoute] = collections.OrderedDict()
        self._preferred = 0  # the NameServer that answered last
        # gRPC address -> framed data address of every node seen in a route or cluster info, so
        # a leader hint (a gRPC address) finds its data address too. Bounded like the routes.
        self._data: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._data_overrides: dict[str, str] = {}

    def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The topic's route; fetched when absent, stale, or `refresh`. Raises NoRouteError when
        no NameServer knows the topic, BrokerUnavailableError when none answers."""
        now = self._clock()
        # No lock to read (asked once per message): one get of the C OrderedDict is atomic
        # under the GIL; the lock orders the writers (insert, move, evict) below.
        cached = self._routes.get(topic)
        if cached is not None and not refresh and now - cached.fetched_ms < self._refresh_ms:
            return cached
        try:
            fresh = self._fetch(topic)
        except BrokerUnavailableError:
            if cached is not None:
                return cached  # stale beats nothing while every NameServer is away
            raise
        with self._lock:
            self._routes[topic] = fresh
            self._routes.move_to_end(topic)
            while len(self._routes) > self._max_topics:
                self._routes.popitem(last=False)
            for g in fresh.groups.values():
                self._learn_locked(zip(g.addresses, g.data_addresses, strict=False))
        return fresh

    def _learn_locked(self, pairs: Iterable[tuple[str, str]]) -> None:
        for address, data_address in pairs:
            self._data[address] = data_address
            self._data.move_to_end(address)
        while len(self._data) > MAX_KNOWN_NODES:
            self._data.popitem(last=False)

    def data_address(self, address: str) -> str:
        """The framed data address of the node serving gRPC at `address`; "" when it offers
        none (or is not known yet): the caller uses gRPC then."""
        with self._lock:
            override = self._data_overrides.get(address)
            if override is not None:
                return override
            return self._data.get(address, "")

    def node(self, address: str) -> NodeAddress:
        return NodeAddress(address, self.data_address(address))

    def _override_data_addresses(self, overrides: Mapping[str, str]) -> None:
        """Test and benchmark hook, not API: gRPC address -> data address to use instead of
        what the routes advertise ("" forces gRPC). tests/client/frame_broker.py uses it to
        point the SDK at a framed proxy in front of a broker that offers no data path yet."""
        with self._lock:
            self._data_overrides = dict(overrides)

    def leader(self, topic: str, broker_group: str, *, refresh: bool = False) -> str:
        """The gRPC address of the group's leader as the NameServers last said. A group the
        topic's route does not hold (also after one refresh) is the caller's mistake, named at
        once (InvalidArgumentError), not waited out as a missing leader."""
        route = self.route(topic, refresh=refresh)
        g = route.group(broker_group)
        if g is None and not refresh:
            route = self.route(topic, refresh=True)  # the topic may be new on that group
            g = route.group(broker_group)
        if g is None:
            known = sorted({q.broker_group for q in route.queues})
            raise InvalidArgumentError(
                f"topic {topic!r} has no queues on broker group {broker_group!r} (its broker "
                f"groups: {', '.join(known) or 'none'}); check the name (`raftmq topic route "
                f"{topic}`)",
                details={"topic": topic, "broker_group": broker_group},
            )
        if not g.leader_address:
            raise NotLeaderError.for_node("-", broker_group, "")
        return g.leader_address

    def leader_node(self, topic: str, broker_group: str, *, refresh: bool = False) -> NodeAddress:
        """The group's leader as the NameServers last said: its gRPC and data addresses."""
        return self.node(self.leader(topic, broker_group, refresh=refresh))

    def nodes(self, topic: str, broker_group: str) -> tuple[str, ...]:
        """Every node of the group, leader first."""
        g = self.route(topic).group(broker_group)
        return g.addresses if g is not None else ()

    def invalidate(self, topic: str | None = None) -> None:
        """Mark a topic's route (or every route) stale so the next use fetches it again. It is
        kept, not forgotten: while no NameServer answers, route() still returns it (a send that
        timed out during a NameServer outage used to leave every later send of the topic failing
        with BROKER_UNAVAILABLE until the NameServer came back, the group being fine)."""
        with self._lock:
            names = list(self._routes) if topic is None else [topic]
            for name in names:
                cached = self._routes.get(name)
                if cached is not None:
                    self._routes[name] = replace(cached, fetched_ms=_STALE_MS)

    def call_namesrv(self, fn: Callable[[namesrv_pb2_grpc.NameServerStub], object]) -> object:
        """`fn(stub)` on the NameServers in turn until one answers. A typed error that is the
        caller's fault (unknown topic, bad name) is raised at once; unreachable ones are skipped."""
        n = len(self.namesrv_addresses)
        failures: list[str] = []
        wrong_role: list[str] = []
        no_route: NoRouteError | None = None
        start = self._preferred
        for k in range(n):
            i = (start + k) % n
            addr = self.namesrv_addresses[i]
            try:
                out = fn(self._pool.namesrv(addr))
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                if isinstance(err, NoRouteError):
                    no_route = err  # another NameServer may have heard from the brokers
                    continue
                # A bare UNIMPLEMENTED ("Method not found!"): another kind of server answered.
                if isinstance(err, UnsupportedError) and "grpc_status" in err.details:
                    wrong_role.append(f"{addr} is {self._role_of(addr)}, not a NameServer")
                    continue
                if err.retryable or isinstance(err, BrokerUnavailableError):
                    failures.append(f"{addr}: {err.message}")
                    continue
                self._preferred = i
                raise err from None
            self._preferred = i
            return out
        if no_route is not None:
            raise no_route
        if wrong_role:
            raise InvalidArgumentError(
                "; ".join(wrong_role) + " (it answered UNIMPLEMENTED to a NameServer call); "
                "pass the NameServer's address (port 9876 in RocketMQ's and raftmq's defaults), "
                "not a broker's or a controller's"
                + (f"; the others failed: {'; '.join(failures)}" if failures else ""),
                details={"namesrv_addresses": ",".join(self.namesrv_addresses)},
            )
        raise BrokerUnavailableError(
            "no NameServer answered (" + "; ".join(failures) + "); check that at least one of "
            f"{', '.join(self.namesrv_addresses)} is running",
            details={"namesrv_addresses": ",".join(self.namesrv_addresses)},
        )

    def _role_of(self, address: str) -> str:
        """What a server that is not a NameServer is, by asking it as a broker and a controller."""
        channel = self._pool.channel(address)
        try:
            st = broker_pb2_grpc.BrokerStub(channel).GetBrokerStatus(
                broker_pb2.GetBrokerStatusRequest(), timeout=PROBE_TIMEOUT_S
            )
            return f"a broker (node {st.node_id} of {st.broker_group})"
        except grpc.RpcError:
            pass  # not a broker, or it did not answer in time: try a controller
        try:
            ctl = controller_pb2_grpc.ControllerStub(channel).GetControllerStatus(
                controller_pb2.GetControllerStatusRequest(), timeout=PROBE_TIMEOUT_S
            )
            return f"a controller (node {ctl.node_id})"
        except grpc.RpcError:
            return "a gRPC server of another kind (probably a broker or a controller)"

    def _fetch(self, topic: str) -> TopicRoute:
        req = namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic)
        try:
            out = self.call_namesrv(lambda s: s.GetRouteInfoByTopic(req, timeout=NAMESRV_TIMEOUT_S))
        except NoRouteError:
            raise NoRouteError.for_topic(topic, self.namesrv_addresses) from None
        except RaftMQError:
            raise
        assert isinstance(out, namesrv_pb2.TopicRouteData)
        return _route_from_pb(out, self._clock())

    def cluster_info(self) -> namesrv_pb2.ClusterInfo:
        req = namesrv_pb2.GetClusterInfoRequest()
        out = self.call_namesrv(lambda s: s.GetClusterInfo(req, timeout=NAMESRV_TIMEOUT_S))
        assert isinstance(out, namesrv_pb2.ClusterInfo)
        with self._lock:
            self._learn_locked(
                (n.address, n.data_address)
                for c in out.clusters
                for g in c.groups
                for n in g.nodes
                if n.address
            )
        return out

    def all_topics(self) -> list[str]:
        req = namesrv_pb2.GetAllTopicsRequest()
        out = self.call_namesrv(lambda s: s.GetAllTopics(req, timeout=NAMESRV_TIMEOUT_S))
        assert isinstance(out, namesrv_pb2.GetAllTopicsResponse)
        return list(out.topics)
