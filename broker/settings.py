"""BrokerSettings: every key of a broker node with its default and unit.

Loaded by client.settings.load_settings from the `[broker]` section of a TOML file, then
RAFTMQ_BROKER_<KEY> environment variables, then flags. Values, parsing and validation only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from raftmq.broker.batch_version import reads_version
from raftmq.common import tls
from raftmq.common.auth import check_auth_settings
from raftmq.common.delay import DEFAULT_DELAY_LEVELS_TEXT, DEFAULT_MAX_DELAY_MS, DelayPolicy
from raftmq.common.quota_gate import QuotaSettings, check_quota_settings
from raftmq.common.scrape_access import check_metrics_listen
from raftmq.common.settings import address_list, load_settings, setting, settings_class
from raftmq.common.types import Member, check_host_port, parse_members
from raftmq.raftlog.config import FlushPolicy, PeerTls, RaftLogConfig, config_default

ENV_PREFIX = "RAFTMQ_BROKER_"
MIB = 1 << 20
GIB = 1 << 30
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DATA_LISTEN_OFF = "off"
MIN_FRAME_BYTES = 64 * 1024  # an error answer and a small send must fit
MAX_FRAME_BYTES = 1 << 30  # the frame length is a u32; a GiB frame is already a mistake


@settings_class
class BrokerSettings(QuotaSettings):
    # Keys a release dropped: named with what to do instead of "unknown" (common/settings.py).
    REMOVED_SETTINGS: ClassVar[Mapping[str, str]] = {
        "raft_impl": "a broker group always runs raftmq's own Raft core now; delete the key (a "
        "group store pysyncobj wrote opens as it is: docs/operations.md)",
    }
    cluster: str = setting(default="DefaultCluster", unit="", doc="cluster this group belongs to")
    broker_group: str = setting(
        default="broker-a", unit="", doc="the broker group (one Raft group of nodes)"
    )
    node_id: str = setting(default="n0", unit="", doc="this node's id among `members`")
    members: str = setting(
        default="n0=127.0.0.1:10911/127.0.0.1:20911",
        unit="id=host:port/host:port,...",
        doc="every node of the group, this one included: id=gRPC address/Raft address",
    )
    listen: str = setting(
        default="",
        unit="host:port",
        doc='gRPC bind address; "" = this node\'s address in `members`',
    )
    data_listen: str = setting(
        default="",
        unit="host:port",
        doc="framed data path (send, pull, offsets, heartbeats, transactions, POP) bind address; "
        '"" = the host of this node\'s gRPC address, any free port; "off" = gRPC only (the SDK '
        "and the proxy send, pull, commit offsets and end transactions only over this path, so "
        "their clients cannot). The bound address is registered as the node's data_address",
    )
    metrics_listen: str = setting(
        default="",
        unit="host:port",
        doc='Prometheus /metrics, /healthz and /readyz over HTTP; "" or "off" = none, port 0 = '
        "any free port",
    )
    data_max_frame_bytes: int = setting(
        default=16 * MIB, unit="bytes", doc="framed data path: largest request or answer frame"
    )
    data_max_connections: int = setting(
        default=4096, unit="connections", doc="framed data path: connections served at once"
    )
    data_max_connections_per_address: int = setting(
        default=1024,
        unit="connections",
        doc="framed data path: connections one client host may hold (a share of "
        "data_max_connections, so one host cannot fill it); 0 = no cap",
    )
    data_max_connections_per_user: int = setting(
        default=2048,
        unit="connections",
        doc="framed data path, auth on: connections one access key may hold; 0 = no cap",
    )
    data_hello_timeout_ms: int = setting(
        default=5_000, unit="ms", doc="framed data path: a connection that sends no HELLO is closed"
    )
    data_idle_timeout_ms: int = setting(
        default=10_000,
        unit="ms",
        doc="framed data path: a connection silent this long is closed (clients ping every "
        "second; a peer gone without a FIN is noticed here)",
    )
    data_max_inflight_per_conn: int = setting(
        default=256,
        unit="requests",
        doc="framed data path: requests run at once per connection (held pulls included); past "
        "it the broker stops reading that connection",
    )
    data_dir: Path = setting(default=Path("data/broker"), unit="path", doc="journal and indexes")
    namesrv_addresses: str = setting(
        default="127.0.0.1:9876", unit="host:port,...", doc="NameServers to register with"
    )
    controller_addresses: str = setting(
        default="", unit="host:port,...", doc='controllers to report role changes to; "" = none'
    )
    heartbeat_interval_ms: int = setting(
        default=30_000, unit="ms", doc="registration with every NameServer (and on role change)"
    )
    auto_create_topic: bool = setting(
        default=True, unit="", doc="a send to an unknown topic creates it (RocketMQ: true)"
    )
    accept_sends: bool = setting(
        default=True,
        unit="",
        doc="false: this node refuses sends and registers every topic read-only, so producers "
        "use the other broker groups (mqadmin's wipeWritePerm; live: `raftmq broker config "
        "accept_sends=false --groups G`)",
    )
    leader_places_offsets: bool = setting(
        default=True,
        unit="",
        doc="the leader places each produce batch's queue offsets before replication and "
        "answers the send at its commit; false: the dispatcher assigns them and a send is "
        "answered once indexed",
    )
    follower_dispatch_round_ms: int = setting(
        default=20,
        unit="ms",
        doc="a follower nobody reads from indexes committed entries in rounds of at most this "
        "long, sharing each round's fixed CPU; a pull, a held pull or its election ends a "
        "round at once; 0: each entry at once",
    )
    leader_dispatch_round_ms: int = setting(
        default=20,
        unit="ms",
        doc="the leader indexes committed entries in rounds of at most this long while no "
        "reader and no request waits on its index (a send whose offsets it placed is answered "
        "at its commit); a pull, a held pull or a request waiting for its indexed outcome ends "
        "a round at once; 0: each entry at once",
    )
    default_queue_nums: int = setting(
        default=8, unit="queues", doc="read and write queues of an auto-created topic"
    )
    max_message_bytes: int = setting(
        default=4 * MIB, unit="bytes", doc="largest message body accepted"
    )
    max_batch_messages: int = setting(
        default=4096, unit="messages", doc="most messages in one send request"
    )
    send_timeout_ms: int = setting(
        default=config_default("commit_timeout_ms", int),
        unit="ms",
        doc="longest wait for a majority commit before OUTCOME_UNKNOWN",
    )
    long_poll_max_ms: int = setting(
        default=30_000, unit="ms", doc="longest hold of a pull request (the client asks less)"
    )
    pull_max_messages: int = setting(
        default=1024, unit="messages", doc="most messages answered to one pull"
    )
    pull_max_bytes: int = setting(
        default=8 * MIB, unit="bytes", doc="most body bytes answered to one pull"
    )
    max_workers: int = setting(
        default=128, unit="threads", doc="gRPC handler threads (long polls hold one each)"
    )
    quota_max_held_calls_per_user: int = setting(
        default=4,
        unit="calls",
        doc="gRPC sends and pulls of one user held at once for its byte quota (each holds a "
        "handler thread; all users together at most max_workers/4); past it the user's calls "
        "are answered at once: a send THROTTLED with retry_after_ms, a pull empty",
    )
    flush_policy: FlushPolicy = setting(
        default=config_default("flush_policy", FlushPolicy),
        unit="",
        doc="ASYNC_FLUSH or SYNC_FLUSH",
    )
    flush_interval_ms: int = setting(
        default=config_default("flush_interval_ms", int),
        unit="ms",
        doc="ASYNC_FLUSH: group fsync period",
    )
    batch_max_bytes: int = setting(
        default=config_default("batch_max_bytes", int),
        unit="bytes",
        doc="group commit: bytes packed into one Raft entry",
    )
    segment_bytes: int = setting(
        default=config_default("segment_bytes", int), unit="bytes", doc="journal segment size"
    )
    scrub_bytes_per_s: int = setting(
        default=config_default("scrub_bytes_per_s", int),
        unit="bytes/s",
        doc="sealed journal segments re-read and checked in the background at this rate, so "
        "a corrupt record nobody reads is found (storage_error); 0 = off",
    )
    index_scrub_rows_per_s: int = setting(
        default=20_000,
        unit="rows/s",
        doc="index store rows (one per stored batch in the ConsumeQueue) re-read and checked in "
        "the background at this rate, then a rest of 5 s or four times the pass, whichever is "
        "longer, so a corrupt row nobody reads is found, reported and rebuilt from the log; "
        "0 = off",
    )
    election_timeout_min_ms: int = setting(
        default=config_default("election_timeout_min_ms", int),
        unit="ms",
        doc="Raft election timeout, lower bound (4 heartbeats)",
    )
    election_timeout_max_ms: int = setting(
        default=config_default("election_timeout_max_ms", int),
        unit="ms",
        doc="Raft election timeout, upper bound",
    )
    raft_password: str = setting(
        default="",
        unit="",
        doc="seals Raft traffic between the nodes (native core under TLS: each peer proves it, "
        'TLS encrypts); "" = raft.key with TLS on, else plain; never printed',
        secret=True,
    )
    store_map_size_bytes: int = setting(
        default=8 * GIB, unit="bytes", doc="lmdb map size of the indexes (sparse file)"
    )
    retention_ms: int = setting(
        default=72 * 3600 * 1000,
        unit="ms",
        doc="journal segments whose last write is older are deleted on every node (RocketMQ's "
        "fileReservedTime, 72 h); 0 = no time limit",
    )
    retention_bytes: int = setting(
        default=0,
        unit="bytes",
        doc="the oldest journal segments are deleted while the journal is larger; "
        "0 = no size limit",
    )
    retention_check_interval_ms: int = setting(
        default=10_000, unit="ms", doc="how often the leader checks retention and nodes trim"
    )
    stats_retention_ms: int = setting(
        default=7 * 24 * 3600 * 1000,
        unit="ms",
        doc="resource reports: how long this node keeps its per-minute counts of messages "
        "produced and consumed (`raftmq stats`); 0 = reports off",
    )
    stats_flush_interval_ms: int = setting(
        default=5_000, unit="ms", doc="resource reports: how often counts go to their table"
    )
    stats_max_rows: int = setting(
        default=1_000_000,
        unit="rows",
        doc="resource reports: the oldest minutes are deleted while the table holds more",
    )
    max_store_bytes: int = setting(
        default=0,
        unit="bytes",
        doc="sends are refused (DISK_PRESSURE) while this node's journal and indexes hold more; "
        "they resume below 95% of it; 0 = no limit",
    )
    disk_max_used_ratio: float = setting(
        default=0.90,
        unit="ratio",
        doc="past it a leader hands off to a follower with room, and sends are refused "
        "(DISK_PRESSURE) while the data disk is fuller and no follower can take over (RocketMQ's "
        "diskMaxUsedSpaceRatio); they resume below 95% of it; 1.0 = no limit",
    )
    shutdown_grace_ms: int = setting(
        default=3_000, unit="ms", doc="on SIGTERM, in-flight calls get this long to finish"
    )
    delay_levels: str = setting(
        default=DEFAULT_DELAY_LEVELS_TEXT,
        unit="levels",
        doc="RocketMQ's messageDelayLevel: the delay of levels 1, 2, ... (units ms s m h d); "
        "retries back off along them from level 3",
    )
    max_delay_ms: int = setting(
        default=DEFAULT_MAX_DELAY_MS,
        unit="ms",
        doc="horizon of delayed delivery: a later delivery time is refused",
    )
    delay_deliver_batch: int = setting(
        default=256, unit="messages", doc="due messages moved to their queue per Raft entry"
    )
    log_level: str = setting(default="INFO", unit="", doc="DEBUG, INFO, WARNING or ERROR")
    transaction_timeout_ms: int = setting(
        default=6_000,
        unit="ms",
        doc="a half message not ended this long after it was stored is checked back "
        "(RocketMQ transactionTimeOut)",
    )
    transaction_check_interval_ms: int = setting(
        default=60_000,
        unit="ms",
        doc="between check-backs of one half message (RocketMQ transactionCheckInterval)",
    )
    transaction_max_checks: int = setting(
        default=15,
        unit="checks",
        doc="unanswered check-backs before a half message moves to TRANS_CHECK_MAX_TIME_TOPIC",
    )
    transaction_ended_retention_ms: int = setting(
        default=120_000,
        unit="ms",
        doc="an ended transaction is remembered this long, so a repeated end is answered as "
        "before (after it: not found); keep it well above the producers' end retries (15 s). "
        "Memory: ~0.6 KB per transaction ended within this window",
    )
    debug_ack_before_commit: bool = setting(
        default=False,
        unit="",
        doc="DEBUG ONLY, loses acknowledged messages: answer a send once the leader queued it, "
        "before the majority commit (shows that the chaos checker catches such a bug)",
    )

    def __post_init__(self) -> None:
        check_quota_settings(self)  # issue 27
        check_auth_settings(self, self.controller_addresses)  # issue 19
        members = parse_members(self.members)
        if self.node_id not in {m.node_id for m in members}:
            raise ValueError(f"node_id {self.node_id!r} is not one of the members {self.members!r}")
        if self.listen:
            check_host_port(self.listen, "listen")
        check_metrics_listen(self.metrics_listen)
        if self.data_listen not in ("", DATA_LISTEN_OFF):
            _check_bind_address(self.data_listen, "data_listen")
        address_list(self.namesrv_addresses, "namesrv_addresses")  # at least one, each host:port
        if self.controller_addresses.strip():
            address_list(self.controller_addresses, "controller_addresses")
        positive = {
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "max_message_bytes": self.max_message_bytes,
            "max_batch_messages": self.max_batch_messages,
            "send_timeout_ms": self.send_timeout_ms,
            "long_poll_max_ms": self.long_poll_max_ms,
            "pull_max_messages": self.pull_max_messages,
            "pull_max_bytes": self.pull_max_bytes,
            "data_max_connections": self.data_max_connections,
            "data_max_inflight_per_conn": self.data_max_inflight_per_conn,
            "data_hello_timeout_ms": self.data_hello_timeout_ms,
            "data_idle_timeout_ms": self.data_idle_timeout_ms,
            "transaction_timeout_ms": self.transaction_timeout_ms,
            "transaction_check_interval_ms": self.transaction_check_interval_ms,
            "transaction_ended_retention_ms": self.transaction_ended_retention_ms,
            "retention_check_interval_ms": self.retention_check_interval_ms,
            "stats_flush_interval_ms": self.stats_flush_interval_ms,
            "stats_max_rows": self.stats_max_rows,
        }
        if self.data_max_connections_per_address < 0 or self.data_max_connections_per_user < 0:
            raise ValueError(
                "data_max_connections_per_address and data_max_connections_per_user must be >= 0"
                " (0 = no cap)"
            )
        if self.stats_retention_ms < 0:
            raise ValueError("stats_retention_ms must be >= 0 (0 = reports off)")
        if self.follower_dispatch_round_ms < 0 or self.leader_dispatch_round_ms < 0:
            raise ValueError(
                "follower_dispatch_round_ms and leader_dispatch_round_ms must be >= 0 "
                "(0 = each entry at once)"
            )
        if self.retention_ms < 0 or self.retention_bytes < 0 or self.max_store_bytes < 0:
            raise ValueError("retention_ms, retention_bytes and max_store_bytes must be >= 0")
        if not 0.0 < self.disk_max_used_ratio <= 1.0:
            raise ValueError("disk_max_used_ratio must be within (0, 1]")
        for key, value in positive.items():
            if value <= 0:
                raise ValueError(f"{key} must be > 0")
        if not 1 <= self.default_queue_nums <= 1024:
            raise ValueError("default_queue_nums must be within 1..1024")
        if not MIN_FRAME_BYTES <= self.data_max_frame_bytes <= MAX_FRAME_BYTES:
            raise ValueError(
                f"data_max_frame_bytes must be within {MIN_FRAME_BYTES}..{MAX_FRAME_BYTES}"
            )
        if self.transaction_max_checks < 0:
            raise ValueError("transaction_max_checks must be >= 0")
        if not 4 <= self.max_workers <= 4096:
            raise ValueError("max_workers must be within 4..4096")
        if not 1 <= self.quota_max_held_calls_per_user <= self.max_workers:
            raise ValueError("quota_max_held_calls_per_user must be within 1..max_workers")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}")
        self.raft_config()  # the Raft keys are checked by raftlog's own rules
        self.delay_policy()  # levels positive, increasing, within the horizon
        if not 1 <= self.delay_deliver_batch <= 4096:
            raise ValueError("delay_deliver_batch must be within 1..4096")

    def delay_policy(self) -> DelayPolicy:
        return DelayPolicy.from_text(self.delay_levels, max_delay_ms=self.max_delay_ms)

    @property
    def member_list(self) -> tuple[Member, ...]:
        return parse_members(self.members)

    @property
    def me(self) -> Member:
        return next(m for m in self.member_list if m.node_id == self.node_id)

    @property
    def data_bind(self) -> tuple[str, int] | None:
        """Where the framed data path listens: (host, port), port 0 = any; None when off."""
        if self.data_listen == DATA_LISTEN_OFF:
            return None
        address = self.data_listen or f"{self.me.address.rpartition(':')[0]}:0"
        host, _, port = address.rpartition(":")
        return host, int(port)

    @property
    def namesrv_list(self) -> tuple[str, ...]:
        return address_list(self.namesrv_addresses, "namesrv_addresses")

    @property
    def controller_list(self) -> tuple[str, ...]:
        text = self.controller_addresses
        return address_list(text, "controller_addresses") if text.strip() else ()

    def raft_config(self) -> RaftLogConfig:
        me = self.me
        peer_ssl = tls.peer_ssl()  # the native core's Raft port is mutual TLS when TLS is on
        return RaftLogConfig(
            node_id=me.raft_address,
            peers=tuple(m.raft_address for m in self.member_list if m.node_id != self.node_id),
            data_dir=self.data_dir / "raft",
            flush_policy=self.flush_policy,
            flush_interval_ms=self.flush_interval_ms,
            # A send request carries up to max_message_bytes of body plus framing and properties.
            max_entry_bytes=max(config_default("max_entry_bytes", int), 2 * self.max_message_bytes),
            batch_max_bytes=self.batch_max_bytes,
            commit_timeout_ms=self.send_timeout_ms,
            segment_bytes=self.segment_bytes,
            scrub_bytes_per_s=self.scrub_bytes_per_s,
            election_timeout_min_ms=self.election_timeout_min_ms,
            election_timeout_max_ms=self.election_timeout_max_ms,
            connection_timeout_ms=max(
                config_default("connection_timeout_ms", int), self.election_timeout_max_ms
            ),
            password=self.raft_password or tls.raft_password(),
            tls=None if peer_ssl is None else PeerTls(*peer_ssl),
            hello_features=reads_version(),  # broker/batch_version.py
        )


def _check_bind_address(value: str, what: str) -> None:
    """host:port where port 0 (any free port) is allowed, unlike an advertised address."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} {value!r} is not host:port (port 0 = any free port) or 'off'")


def load(
    file: Path | None = None,
    overrides: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
) -> BrokerSettings:
    """BrokerSettings from file [broker] < RAFTMQ_BROKER_* < overrides (flags)."""
    return load_settings(BrokerSettings, file, ENV_PREFIX, overrides, environ=environ)
