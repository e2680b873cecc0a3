"""ControllerSettings: every key of a controller node with its default and unit (`[controller]`
section, RAFTMQ_CONTROLLER_<KEY> variables, flags). Values and validation only."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from raftmq.common import tls
from raftmq.common.auth import check_auth_settings
from raftmq.common.errors import InvalidArgumentError
from raftmq.common.scrape_access import ScrapeSettings, check_metrics_listen, check_scrape_settings
from raftmq.common.settings import load_settings, setting, settings_class
from raftmq.common.types import Member, parse_address_list, parse_members
from raftmq.controller.alarms import RuleError, parse_rules
from raftmq.controller.balance import BalancePolicy, parse_preferred
from raftmq.raftlog.config import RaftLogConfig

ENV_PREFIX = "RAFTMQ_CONTROLLER_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@settings_class
class ControllerSettings(ScrapeSettings):
    node_id: str = setting(default="c0", unit="", doc="this controller's id")
    listen: str = setting(default="127.0.0.1:9881", unit="host:port", doc="gRPC address")
    raft_address: str = setting(
        default="127.0.0.1:9981", unit="host:port", doc="Raft address among the controllers"
    )
    peers: str = setting(
        default="",
        unit="id=host:port/host:port,...",
        doc="the other controllers: id=gRPC address/Raft address",
    )
    data_dir: Path = setting(default=Path("data/controller"), unit="path", doc="Raft journal")
    metrics_listen: str = setting(
        default="",
        unit="host:port",
        doc='Prometheus /metrics, /healthz and /readyz over HTTP; "" or "off" = none, port 0 = '
        "any free port",
    )
    namesrv_addresses: str = setting(
        default="127.0.0.1:9876", unit="host:port,...", doc="NameServers to push leaders to"
    )
    push_timeout_ms: int = setting(default=1_000, unit="ms", doc="one push to one NameServer")
    push_retries: int = setting(default=3, unit="", doc="attempts per NameServer and change")
    log_level: str = setting(default="INFO", unit="", doc="DEBUG, INFO, WARNING or ERROR")
    balance_leaders: bool = setting(
        default=True, unit="", doc="hand each group's leadership to its preferred node"
    )
    preferred_leaders: str = setting(
        default="",
        unit="group=node_id,...",
        doc="preferred leader per group; unset groups: the i-th group prefers its i-th node",
    )
    balance_interval_ms: int = setting(
        default=10_000, unit="ms", doc="at most one hand-off attempt per group in this time"
    )
    balance_hold_ms: int = setting(
        default=5_000,
        unit="ms",
        doc="no hand-off while a group's leader changed, or its preferred node came back, "
        "this recently",
    )
    balance_alive_ms: int = setting(
        default=65_000,
        unit="ms",
        doc="a broker node silent this long is never handed leadership (keep it above the "
        "brokers' heartbeat_interval_ms)",
    )
    alarm_rules: str = setting(
        default="",
        unit="rule;rule;...",
        doc="alarms the controller leader evaluates, e.g. 'group_lag > 1000 for 1m; "
        "dlq_growth > 0 within 5m; no_leader for 30s; disk_used > 0.9 for 1m; "
        "follower_behind > 10000 for 30s; storage_error for 10s' (controller/alarms.py); "
        '"" = none',
    )
    alarm_interval_ms: int = setting(
        default=5_000, unit="ms", doc="how often the controller leader evaluates the alarms"
    )
    alarm_webhook_url: str = setting(
        default="",
        unit="URL",
        doc='each firing and resolved alarm event is POSTed here as JSON; "" = none',
    )

    def __post_init__(self) -> None:
        check_scrape_settings(self)  # issue 27
        check_auth_settings(self, "self")  # issue 19: its own replicated state
        check_metrics_listen(self.metrics_listen)
        peers = self.peer_list
        if self.node_id in {p.node_id for p in peers}:
            raise ValueError(f"peers must not contain this controller ({self.node_id})")
        self.namesrv_list  # noqa: B018 (at least one NameServer, each host:port)
        if self.push_timeout_ms <= 0 or not 1 <= self.push_retries <= 100:
            raise ValueError("push_timeout_ms must be > 0 and push_retries within 1..100")
        parse_preferred(self.preferred_leaders)
        if self.balance_interval_ms <= 0 or self.balance_hold_ms < 0 or self.balance_alive_ms <= 0:
            raise ValueError(
                "balance_interval_ms and balance_alive_ms must be > 0, balance_hold_ms >= 0"
            )
        try:
            parse_rules(self.alarm_rules)
        except RuleError as exc:
            raise ValueError(str(exc)) from None
        if self.alarm_interval_ms <= 0:
            raise ValueError("alarm_interval_ms must be > 0")
        if self.alarm_webhook_url and not self.alarm_webhook_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError("alarm_webhook_url must be an http:// or https:// URL")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}")
        self.raft_config()

    @property
    def peer_list(self) -> tuple[Member, ...]:
        return parse_members(self.peers) if self.peers.strip() else ()

    @property
    def balance_policy(self) -> BalancePolicy:
        return BalancePolicy(
            self.balance_leaders,
            self.balance_interval_ms,
            self.balance_hold_ms,
            self.balance_alive_ms,
        )

    @property
    def namesrv_list(self) -> tuple[str, ...]:
        try:
            return parse_address_list(self.namesrv_addresses, "namesrv_addresses")
        except InvalidArgumentError as exc:
            raise ValueError(exc.message) from None

    def raft_config(self) -> RaftLogConfig:
        return RaftLogConfig(
            node_id=self.raft_address,
            peers=tuple(p.raft_address for p in self.peer_list),
            data_dir=self.data_dir / "raft",
            max_entry_bytes=1 << 20,
            batch_max_bytes=1 << 20,
            segment_bytes=16 << 20,
            password=tls.raft_password(),
        )


def load(
    file: Path | None = None,
    overrides: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ControllerSettings:
    return load_settings(ControllerSettings, file, ENV_PREFIX, overrides, environ=environ)
