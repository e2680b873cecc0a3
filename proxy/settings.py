"""ProxySettings: every key of the proxy role (the RocketMQ 5 gRPC API) with its default and unit.

Loaded from the `[proxy]` section of a TOML file, then RAFTMQ_PROXY_<KEY> environment variables,
then flags. Values and validation only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from raftmq.common.auth import check_auth_settings
from raftmq.common.quota_gate import QuotaSettings, check_quota_settings
from raftmq.common.scrape_access import check_metrics_listen
from raftmq.common.settings import address_list, load_settings, setting, settings_class

ENV_PREFIX = "RAFTMQ_PROXY_"
MIB = 1 << 20
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
CONSUME_FROM = ("earliest", "latest")


@settings_class
class ProxySettings(QuotaSettings):
    listen: str = setting(
        default="127.0.0.1:8081",
        unit="host:port",
        doc="gRPC address of apache.rocketmq.v2.MessagingService (RocketMQ's proxy: 8081)",
    )
    advertise: str = setting(
        default="",
        unit="host:port",
        doc='the address QueryRoute gives clients for this proxy; "" = listen',
    )
    proxy_addresses: str = setting(
        default="",
        unit="host:port,...",
        doc="every proxy of the cluster (advertised addresses); each broker group is served by "
        'one of them, so one process plans a consumer group\'s POP receives on it; "" = this one',
    )
    namesrv_addresses: str = setting(
        default="127.0.0.1:9876", unit="host:port,...", doc="NameServers for topic routes"
    )
    max_message_bytes: int = setting(
        default=4 * MIB, unit="bytes", doc="largest message body accepted (Settings.publishing)"
    )
    min_invisible_ms: int = setting(
        default=1_000, unit="ms", doc="shortest invisible duration a receive may ask for"
    )
    max_invisible_ms: int = setting(
        default=12 * 3600 * 1000, unit="ms", doc="longest invisible duration (RocketMQ: 12 h)"
    )
    max_long_polling_ms: int = setting(
        default=30_000, unit="ms", doc="longest long polling of a receive"
    )
    max_receive_batch: int = setting(
        default=32, unit="messages", doc="most messages one receive returns"
    )
    max_inflight_per_queue: int = setting(
        default=2_000,
        unit="messages",
        doc="received and not yet acknowledged messages per consumer group and queue; past it "
        "the queue gives nothing new until acks arrive",
    )
    max_pop_queues: int = setting(
        default=100_000,
        unit="queues",
        doc="(consumer group, queue) POP state mirrors held in memory (the state is the broker "
        "group's; a forgotten mirror is loaded again)",
    )
    offset_commit_interval_ms: int = setting(
        default=500,
        unit="ms",
        doc="how often the proxy's housekeeping runs (idle transaction producers); POP progress "
        "is committed by the broker group's apply",
    )
    consume_from: str = setting(
        default="earliest",
        unit="",
        doc="where a consumer group with no committed offset starts: earliest or latest",
    )
    max_delivery_attempts: int = setting(
        default=16,
        unit="deliveries",
        doc="a received message not acknowledged after this many deliveries goes to the group's "
        "dead-letter topic %DLQ%<group> (RocketMQ's default 16); a consumer's own backoff "
        "policy (client settings) overrides it, and the group's retry limit N (`raftmq group "
        "config G --retry-max N`: N + 1 deliveries) overrides both",
    )
    max_transaction_topics: int = setting(
        default=256,
        unit="topics",
        doc="topics with transactional sends whose check-backs this proxy answers at once (one "
        "transaction producer each, polling every broker group); the least recently used "
        "beyond it is closed",
    )
    client_expiry_ms: int = setting(
        default=120_000, unit="ms", doc="a client not heard from for this long is forgotten"
    )
    blocking_threads: int = setting(
        default=16, unit="threads", doc="threads for route look-ups and offset calls"
    )
    shutdown_grace_ms: int = setting(
        default=2_000, unit="ms", doc="on SIGTERM or SIGINT, in-flight calls get this long"
    )
    log_level: str = setting(default="INFO", unit="", doc="DEBUG, INFO, WARNING or ERROR")
    metrics_listen: str = setting(
        default="",
        unit="host:port",
        doc="Prometheus /metrics, /healthz and /readyz over HTTP(S), with the metrics_tls and "
        'metrics_* credentials the brokers have; "" or "off" = none, port 0 = any free port',
    )
    acl_controller_addresses: str = setting(
        default="",
        unit="host:port,...",
        doc='controllers to fetch the users and policies from (auth_enabled); "" = none',
    )

    def __post_init__(self) -> None:
        check_quota_settings(self)  # issue 27
        check_metrics_listen(self.metrics_listen)
        check_auth_settings(self, self.acl_controller_addresses)  # issue 19
        for key in ("listen", "advertise"):
            value = getattr(self, key)
            if key == "advertise" and not value:
                continue
            host, sep, port = value.rpartition(":")
            if not sep or not host or not port.isdigit() or int(port) > 65535:
                raise ValueError(f"{key} {value!r} is not host:port")
        if self.advertise and self.advertise.rpartition(":")[2] == "0":
            raise ValueError("advertise needs a real port, not 0")
        address_list(self.namesrv_addresses, "namesrv_addresses")
        if self.proxy_addresses.strip():
            peers = address_list(self.proxy_addresses, "proxy_addresses")
            if self.advertised not in peers and not self.listen.endswith(":0"):
                raise ValueError(
                    f"proxy_addresses ({self.proxy_addresses}) does not name this proxy "
                    f"({self.advertised}); list every proxy, this one included"
                )
        positive = {
            "max_message_bytes": self.max_message_bytes,
            "min_invisible_ms": self.min_invisible_ms,
            "max_receive_batch": self.max_receive_batch,
            "max_inflight_per_queue": self.max_inflight_per_queue,
            "max_pop_queues": self.max_pop_queues,
            "offset_commit_interval_ms": self.offset_commit_interval_ms,
            "client_expiry_ms": self.client_expiry_ms,
            "max_delivery_attempts": self.max_delivery_attempts,
            "max_transaction_topics": self.max_transaction_topics,
            "blocking_threads": self.blocking_threads,
        }
        for key, value in positive.items():
            if value <= 0:
                raise ValueError(f"{key} must be > 0, got {value}")
        if self.max_invisible_ms < self.min_invisible_ms:
            raise ValueError("max_invisible_ms must be >= min_invisible_ms")
        if self.max_long_polling_ms < 0 or self.shutdown_grace_ms < 0:
            raise ValueError("max_long_polling_ms and shutdown_grace_ms must be >= 0")
        if self.consume_from not in CONSUME_FROM:
            raise ValueError(f"consume_from must be one of {', '.join(CONSUME_FROM)}")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}")

    @property
    def advertised(self) -> str:
        return self.advertise or self.listen

    @property
    def proxy_list(self) -> tuple[str, ...]:
        """Every proxy, this one included (sorted: each proxy computes the same division)."""
        if not self.proxy_addresses.strip():
            return (self.advertised,)
        return tuple(sorted(address_list(self.proxy_addresses, "proxy_addresses")))


def load(
    file: Path | None = None,
    overrides: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ProxySettings:
    """ProxySettings from file [proxy] < RAFTMQ_PROXY_* < overrides (flags)."""
    return load_settings(ProxySettings, file, ENV_PREFIX, overrides, environ=environ)
