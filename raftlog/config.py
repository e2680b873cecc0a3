"""Settings of one replicated-log node: every key with its default and unit, in one place.

Values only; validation here, no I/O. The broker's settings embed this object.
"""

from __future__ import annotations

import dataclasses
import enum
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

MIB = 1 << 20
T = TypeVar("T")


class FlushPolicy(enum.Enum):
    """When journal bytes reach the disk (RocketMQ's flushDiskType)."""

    ASYNC_FLUSH = "ASYNC_FLUSH"  # group fsync at most every flush_interval_ms (tick thread)
    SYNC_FLUSH = "SYNC_FLUSH"  # an entry is fsynced on a node before that node counts toward commit


@dataclass(frozen=True, slots=True)
class PeerTls:
    """The Raft port's TLS (native core): mutual, both ends present a certificate of the cluster's
    CA. Made by the embedding role from its TLS settings; raftlog only uses the contexts."""

    server: ssl.SSLContext  # must ask for a client certificate (CERT_REQUIRED)
    client: ssl.SSLContext  # checks the peer's certificate and host name

    def __post_init__(self) -> None:
        if self.server.verify_mode != ssl.CERT_REQUIRED:
            raise ValueError(
                "the Raft port's TLS is mutual: its server context needs CERT_REQUIRED"
            )
        if self.client.verify_mode != ssl.CERT_REQUIRED or not self.client.check_hostname:
            raise ValueError("the Raft port's client context must check the peer's certificate")


@dataclass(frozen=True, slots=True)
class RaftLogConfig:
    node_id: str  # this node's raft address, "host:port"; also the bind address
    peers: tuple[str, ...]  # the other members' raft addresses
    data_dir: Path
    flush_policy: FlushPolicy = FlushPolicy.ASYNC_FLUSH
    flush_interval_ms: int = 5
    max_entry_bytes: int = 8 * MIB  # one submission (a broker record batch) at most
    batch_max_bytes: int = 1 * MIB  # group commit: bytes packed into one raft entry
    batch_linger_ms: float = 0.0  # extra wait for more submissions; 0 = pack what is queued
    max_pending_bytes: int = 64 * MIB  # submitted but not yet committed, before QueueFullError
    max_chunks_per_entry: int = 4096
    commit_timeout_ms: int = 10_000  # a submission not committed by then fails as outcome-unknown
    segment_bytes: int = 256 * MIB  # journal segment file size
    cache_bytes: int = 32 * MIB  # recently written/read records kept in memory
    # Sealed segments re-read and checked in the background (0 = off): a rotten byte is found
    # within a pass; 4 MiB/s reads a 256 MiB segment in about a minute.
    scrub_bytes_per_s: int = 4 * MIB
    # 200-400 ms (4-8 heartbeats): the failover bench's median gap after a leader SIGKILL was
    # 0.96 s with it and 1.23 s with 300-600 ms (docs/benchmarks.md, failover).
    election_timeout_min_ms: int = 200
    election_timeout_max_ms: int = 400
    heartbeat_ms: int = 50
    leader_fallback_ms: int = 1500  # a leader without a majority of answers steps down after this
    reconnect_ms: int = 500
    connection_timeout_ms: int = 3500
    max_inflight_bytes_per_peer: int = 16 * MIB  # replication bytes queued to one slow follower
    password: str | None = None  # encrypts raft traffic (needs `cryptography`)
    # Native core only: TLS between the nodes (None = plain TCP, sealed by `password` if set),
    # and the address it listens on when that differs from node_id (a NAT, a relay in a test).
    tls: PeerTls | None = None
    listen: str = ""
    # A byte this node tells its peers in each connection's hello (raft_node.hello_nonce), and
    # they keep (NativeLog.peer_features): the broker's newest stored batch version it reads,
    # so a leader writes a format only once every member reads it. 0 = says nothing.
    hello_features: int = 0

    def __post_init__(self) -> None:
        if self.node_id in self.peers:
            raise ValueError(f"peers must not contain this node ({self.node_id})")
        if len(set(self.peers)) != len(self.peers):
            raise ValueError(f"duplicate peers in {self.peers}")
        for addr in (self.node_id, *self.peers, *((self.listen,) if self.listen else ())):
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"raft address {addr!r} is not host:port")
        if self.batch_max_bytes > self.max_entry_bytes:
            raise ValueError("batch_max_bytes must not exceed max_entry_bytes")
        if not 0 < self.heartbeat_ms * 3 < self.election_timeout_min_ms:
            raise ValueError("election_timeout_min_ms must exceed 3 x heartbeat_ms")
        if self.election_timeout_max_ms <= self.election_timeout_min_ms:
            raise ValueError("election_timeout_max_ms must exceed election_timeout_min_ms")
        if self.connection_timeout_ms < self.election_timeout_max_ms:
            raise ValueError("connection_timeout_ms must be >= election_timeout_max_ms")
        if self.scrub_bytes_per_s < 0:
            raise ValueError("scrub_bytes_per_s must be >= 0 (0 = no scrubbing)")
        if self.flush_interval_ms <= 0 or self.segment_bytes < MIB:
            raise ValueError("flush_interval_ms must be > 0 and segment_bytes >= 1 MiB")

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(sorted((self.node_id, *self.peers)))


def config_default(key: str, kind: type[T]) -> T:
    """RaftLogConfig's own default for `key`: the roles that embed a RaftLogConfig (the broker's
    settings, the controller's) take their Raft defaults from here instead of repeating numbers."""
    for f in dataclasses.fields(RaftLogConfig):
        if f.name == key:
            if f.default is dataclasses.MISSING or not isinstance(f.default, kind):
                raise TypeError(f"RaftLogConfig.{key} has no default of type {kind.__name__}")
            return f.default
    raise KeyError(f"RaftLogConfig has no key {key!r}")
