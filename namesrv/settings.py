"""NameServerSettings: every key of the NameServer role with its default and unit.

Loaded by client.settings.load_settings from the `[namesrv]` section of a TOML file, then
RAFTMQ_NAMESRV_<KEY> environment variables, then flags. Values and validation only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from raftmq.common.auth import check_auth_settings
from raftmq.common.scrape_access import ScrapeSettings, check_metrics_listen, check_scrape_settings
from raftmq.common.settings import load_settings, setting, settings_class

ENV_PREFIX = "RAFTMQ_NAMESRV_"
MIB = 1 << 20
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@settings_class
class NameServerSettings(ScrapeSettings):
    listen: str = setting(
        default="127.0.0.1:9876",
        unit="host:port",
        doc="gRPC listen address; port 0 picks a free port",
    )
    broker_expiry_ms: int = setting(
        default=120_000,
        unit="ms",
        doc="a broker node not heard from for this long is dropped (RocketMQ: 120 s)",
    )
    scan_interval_ms: int = setting(
        default=5_000,
        unit="ms",
        doc="how often expired broker nodes are looked for (RocketMQ: 5 s)",
    )
    metrics_listen: str = setting(
        default="",
        unit="host:port",
        doc='Prometheus /metrics, /healthz and /readyz over HTTP; "" or "off" = none, port 0 = '
        "any free port",
    )
    max_workers: int = setting(default=16, unit="threads", doc="gRPC handler threads")
    max_message_bytes: int = setting(
        default=4 * MIB, unit="bytes", doc="largest request or response accepted on the wire"
    )
    shutdown_grace_ms: int = setting(
        default=2_000,
        unit="ms",
        doc="on SIGTERM or SIGINT, in-flight calls get this long to finish",
    )
    log_level: str = setting(default="INFO", unit="", doc="DEBUG, INFO, WARNING or ERROR")
    enable_controller: bool = setting(
        default=False,
        unit="",
        doc="also run a controller in this process, on this gRPC port (RocketMQ's "
        "enableControllerInNamesrv); its settings are the --controller-<key> flags",
    )
    acl_controller_addresses: str = setting(
        default="",
        unit="host:port,...",
        doc='controllers to fetch the users and policies from (auth_enabled); "" = none',
    )

    def __post_init__(self) -> None:
        # issue 19: an embedded controller holds the users and policies itself
        check_scrape_settings(self)  # issue 27
        check_auth_settings(
            self, "self" if self.enable_controller else self.acl_controller_addresses
        )
        check_metrics_listen(self.metrics_listen)
        host, sep, port = self.listen.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"listen {self.listen!r} is not host:port")
        if self.broker_expiry_ms <= 0 or self.scan_interval_ms <= 0:
            raise ValueError("broker_expiry_ms and scan_interval_ms must be > 0")
        if self.scan_interval_ms > self.broker_expiry_ms:
            raise ValueError(
                f"scan_interval_ms ({self.scan_interval_ms}) must not exceed "
                f"broker_expiry_ms ({self.broker_expiry_ms})"
            )
        if not 1 <= self.max_workers <= 1024:
            raise ValueError("max_workers must be within 1..1024")
        if self.max_message_bytes < 64 * 1024:
            raise ValueError("max_message_bytes must be at least 65536")
        if self.shutdown_grace_ms < 0:
            raise ValueError("shutdown_grace_ms must be >= 0")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}")


def load(
    file: Path | None = None,
    overrides: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
) -> NameServerSettings:
    """NameServerSettings from file [namesrv] < RAFTMQ_NAMESRV_* < overrides (flags)."""
    return load_settings(NameServerSettings, file, ENV_PREFIX, overrides, environ=environ)
