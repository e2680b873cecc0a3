"""The NameServer process: `raftmq-namesrv --listen 127.0.0.1:9876 [--config FILE]` (or
`python -m raftmq.namesrv.server`).

Runs the gRPC service and the expiry scan thread; SIGTERM or SIGINT stops both cleanly (exit 0).
Once serving it prints one line `namesrv.started listen=HOST:PORT` to stdout (the bound port when
port 0 was asked for). Every setting is also a flag and a RAFTMQ_NAMESRV_<KEY> variable.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from raftmq.common import tls
from raftmq.common.acl_sync import NodeSecurity
from raftmq.common.call_shares import CallShares, per_address_cap
from raftmq.common.grpc_options import SERVER_LIVENESS
from raftmq.common.grpc_service import add_servicer
from raftmq.common.metrics_http import MetricsServer, start_metrics
from raftmq.common.pb import controller_pb2, namesrv_pb2
from raftmq.common.process import SettingsSection, parse_role_args, run_role
from raftmq.common.settings import address_list
from raftmq.controller import settings as controller_settings_mod
from raftmq.controller.metrics import ControllerMetrics
from raftmq.controller.metrics import readiness as controller_readiness
from raftmq.controller.node import ControllerNode
from raftmq.controller.server import ControllerService
from raftmq.controller.settings import ControllerSettings
from raftmq.namesrv import settings as settings_mod
from raftmq.namesrv.metrics import NameServerMetrics, readiness
from raftmq.namesrv.route_table import RouteTable
from raftmq.namesrv.service import NameServerService
from raftmq.namesrv.settings import NameServerSettings

_log = logging.getLogger("namesrv")
NAMESRV_SERVICE = namesrv_pb2.DESCRIPTOR.services_by_name["NameServer"]
CONTROLLER_SERVICE = controller_pb2.DESCRIPTOR.services_by_name["Controller"]


class NameServer:
    """One NameServer: gRPC server + expiry scan thread. start() then stop(), once each."""

    def __init__(
        self, settings: NameServerSettings, controller: ControllerNode | None = None
    ) -> None:
        self.settings = settings
        self.controller = controller
        self.service = NameServerService(RouteTable(settings.broker_expiry_ms))
        self.metrics = NameServerMetrics(self.service)
        if controller is not None:  # one endpoint per process: the controller's beside ours
            ControllerMetrics(controller, self.metrics.registry, with_rpc=False)
        self._http: MetricsServer | None = None
        self.metrics_address = ""
        self.failed = threading.Event()  # set if the scan thread died; the process must exit
        self._stop = threading.Event()
        # issue 19: with an embedded controller the users and policies are this process's own
        self.security = NodeSecurity.for_settings(
            settings,
            address_list(settings.acl_controller_addresses, "acl_controller_addresses")
            if settings.acl_controller_addresses.strip()
            else (),
            controller.acl if controller is not None else None,
        )
        services = [NAMESRV_SERVICE] + ([CONTROLLER_SERVICE] if controller is not None else [])
        self._server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=settings.max_workers, thread_name_prefix="namesrv-rpc"
            ),
            options=[
                ("grpc.max_receive_message_length", settings.max_message_bytes),
                ("grpc.max_send_message_length", settings.max_message_bytes),
                ("grpc.so_reuseport", 0),  # two servers must never share a port silently
                *SERVER_LIVENESS,
            ],
            interceptors=[
                self.metrics.rpc.interceptor(),
                CallShares(
                    per_address_cap(settings.rpc_max_calls_per_address, settings.max_workers)
                ),
                *self.security.interceptors(services),
            ],
        )
        add_servicer(self._server, self.service, NAMESRV_SERVICE)
        if controller is not None:
            # Same port: one address per process to configure, as RocketMQ's embedded mode.
            add_servicer(self._server, ControllerService(controller), CONTROLLER_SERVICE)
        self._scanner = threading.Thread(target=self._scan, name="namesrv-expiry", daemon=True)
        self.address = ""

    def start(self) -> str:
        """Bind, serve, start scanning; return the bound "host:port"."""
        host = self.settings.listen.rpartition(":")[0]
        try:
            port = tls.add_port(self._server, self.settings.listen)
        except RuntimeError as exc:  # grpc raises on bind failure in recent versions
            self._server.stop(0)
            raise OSError(f"cannot listen on {self.settings.listen}: {exc}") from exc
        if port == 0:
            self._server.stop(0)
            raise OSError(f"cannot listen on {self.settings.listen} (address in use?)")
        try:
            self._http = start_metrics(
                self.settings.metrics_listen,
                self.metrics.registry,
                self._ready,
                "namesrv",
                self.settings,
            )
        except OSError:
            self._server.stop(0)
            raise
        self.metrics_address = self._http.address if self._http is not None else ""
        if self.controller is not None:
            self.controller.start()
        self.security.start()
        self._server.start()
        self._scanner.start()
        self.address = f"{host}:{port}"
        return self.address

    def _ready(self) -> tuple[bool, str]:
        ok, why = readiness(self.service)
        if self.controller is not None:
            c_ok, c_why = controller_readiness(self.controller)
            return ok and c_ok, f"{why}; {c_why}"
        return ok, why

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()
        self._stop.set()
        self._server.stop(self.settings.shutdown_grace_ms / 1000).wait()
        if self._scanner.is_alive():
            self._scanner.join(timeout=5)
        self.security.close()
        if self.controller is not None:
            self.controller.close()

    def _scan(self) -> None:
        interval_s = self.settings.scan_interval_ms / 1000
        while not self._stop.wait(interval_s):
            try:
                self.service.expire()
            except Exception:
                _log.critical("namesrv.scan_failed", exc_info=True)
                self.failed.set()
                return


CONTROLLER_FLAGS = "controller-"


def parse_args(argv: Sequence[str] | None) -> tuple[Path | None, dict[str, object]]:
    config, overrides, _ = parse_all(argv)
    return config, overrides


SECTIONS = (
    SettingsSection(NameServerSettings, settings_mod.ENV_PREFIX),
    SettingsSection(ControllerSettings, controller_settings_mod.ENV_PREFIX, CONTROLLER_FLAGS),
)


def parse_all(
    argv: Sequence[str] | None,
) -> tuple[Path | None, dict[str, object], dict[str, object]]:
    """(config file, NameServer overrides, embedded controller overrides)."""
    config, (overrides, ctl_overrides) = parse_role_args(
        "raftmq-namesrv",
        "raftmq NameServer: broker routes and liveness, in memory.",
        SECTIONS,
        argv,
    )
    return config, overrides, ctl_overrides


def embedded_controller(
    settings: NameServerSettings,
    config: Path | None,
    overrides: Mapping[str, object],
    environ: Mapping[str, str] | None = None,
) -> ControllerSettings:
    """The embedded controller serves on the NameServer's address; everything else is its own
    ([controller] of the same file, RAFTMQ_CONTROLLER_*, --controller-<key>)."""
    return controller_settings_mod.load(
        config, {**overrides, "listen": settings.listen}, environ=environ
    )


@dataclass(frozen=True, slots=True)
class NameServerConfig:
    """A NameServer's settings and, when it embeds one, its controller's."""

    settings: NameServerSettings
    controller: ControllerSettings | None

    @property
    def log_level(self) -> str:
        return self.settings.log_level


def load_config(argv: Sequence[str] | None) -> NameServerConfig:
    config, overrides, ctl_overrides = parse_all(argv)
    settings = settings_mod.load(config, overrides)
    return NameServerConfig(
        settings,
        embedded_controller(settings, config, ctl_overrides)
        if settings.enable_controller
        else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_role("namesrv", lambda: load_config(argv), serve)


def serve(config: NameServerConfig, stop: threading.Event) -> int:
    settings, ctl_settings = config.settings, config.controller
    server = NameServer(
        settings, ControllerNode(ctl_settings) if ctl_settings is not None else None
    )
    try:
        address = server.start()
    except OSError as exc:
        _log.error("namesrv.listen_failed listen=%s error=%s", settings.listen, exc)
        return 1
    _log.info(
        "namesrv.started listen=%s broker_expiry_ms=%d scan_interval_ms=%d",
        address,
        settings.broker_expiry_ms,
        settings.scan_interval_ms,
    )
    # metrics= only when served: tools split the line after listen= (the address comes last).
    metrics = f" metrics={server.metrics_address}" if server.metrics_address else ""
    print(f"namesrv.started{metrics} listen={address}", flush=True)
    while not stop.wait(0.5) and not server.failed.is_set():
        pass
    server.stop()
    _log.info("namesrv.stopped listen=%s", address)
    return 1 if server.failed.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
