"""The proxy process: `raftmq-proxy --listen 127.0.0.1:8081 --namesrv-addresses ...` (or
`python -m raftmq.proxy.server`), RocketMQ's proxy in "cluster" mode: a stateless front of the
broker groups that serves apache.rocketmq.v2.MessagingService to the official RocketMQ 5 clients.

One asyncio loop runs the gRPC server (grpc.aio) and every handler; SIGTERM or SIGINT stops it
cleanly (exit 0). Once serving it prints `proxy.started listen=HOST:PORT` to stdout.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from raftmq.common import tls
from raftmq.common.acl_sync import NodeSecurity
from raftmq.common.call_shares import AioCallShares, per_address_cap
from raftmq.common.grpc_options import SERVER_LIVENESS
from raftmq.common.process import SettingsSection, parse_one_section, run_role
from raftmq.common.scrape_access import metrics_bind
from raftmq.common.settings import SettingsError, address_list
from raftmq.proxy import settings as settings_mod
from raftmq.proxy.handlers import add_to_server
from raftmq.proxy.service import MessagingService
from raftmq.proxy.settings import ProxySettings

log = logging.getLogger("proxy")
PROXY_CALLS = 2048  # the calls the proxy runs at once (coroutines), of which a host gets its share
MAX_GRPC_MESSAGE_EXTRA = 1 << 20  # headers, properties and batch framing beside the bodies
# A request up to this many times max_message_bytes is read, so a body over the limit is answered
# MESSAGE_BODY_TOO_LARGE by the send's own check; a larger request is cut by gRPC itself
# (RESOURCE_EXHAUSTED), which bounds what one request may make the proxy hold.
OVERSIZE_READ_FACTOR = 4


def parse_args(argv: Sequence[str] | None) -> tuple[Path | None, dict[str, object]]:
    return parse_one_section(
        "raftmq-proxy",
        "raftmq proxy: the RocketMQ 5 gRPC API (apache.rocketmq.v2.MessagingService).",
        SettingsSection(ProxySettings, settings_mod.ENV_PREFIX),
        argv,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_role("proxy", lambda: settings_mod.load(*parse_args(argv)), serve)


async def _serve(settings: ProxySettings, stop: threading.Event) -> int:
    limit = settings.max_message_bytes + MAX_GRPC_MESSAGE_EXTRA
    server = grpc.aio.server(
        interceptors=[
            AioCallShares(per_address_cap(settings.rpc_max_calls_per_address, PROXY_CALLS))
        ],
        options=[
            ("grpc.max_receive_message_length", OVERSIZE_READ_FACTOR * limit),
            ("grpc.max_send_message_length", 32 * limit),  # a receive of a whole batch
            ("grpc.so_reuseport", 0),
            *SERVER_LIVENESS,
        ],
    )
    # issue 19: users and policies from the controllers; checks in proxy/handlers.py
    security = NodeSecurity.for_settings(
        settings,
        address_list(settings.acl_controller_addresses, "acl_controller_addresses")
        if settings.acl_controller_addresses.strip()
        else (),
    )
    security.start()
    service = MessagingService(settings)
    add_to_server(server, service, security.guard)
    try:
        port = tls.add_port(server, settings.listen)
    except RuntimeError as exc:
        log.error("proxy.listen_failed listen=%s error=%s", settings.listen, exc)
        await service.close()
        security.close()
        return 1
    if port == 0:
        log.error("proxy.listen_failed listen=%s (address in use?)", settings.listen)
        await service.close()
        security.close()
        return 1
    try:  # issue 27: /metrics with the brokers' TLS and scrape credentials
        http = _start_metrics(settings, service)
    except (OSError, SettingsError) as exc:
        log.error("proxy.metrics_failed %s", exc)
        await server.stop(0)
        await service.close()
        security.close()
        return 1
    await server.start()
    service.start()
    address = f"{settings.listen.rpartition(':')[0]}:{port}"
    metrics = http.address if http is not None else ""
    log.info(
        "proxy.started listen=%s advertise=%s proxies=%s namesrv=%s metrics=%s",
        address,
        service.me,
        ",".join(service.proxies),
        settings.namesrv_addresses,
        metrics or "off",
    )
    print(
        f"proxy.started listen={address}" + (f" metrics={metrics}" if metrics else ""), flush=True
    )
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, stop.wait)
    await server.stop(settings.shutdown_grace_ms / 1000)
    if http is not None:
        http.stop()
    await service.close()
    security.close()
    log.info("proxy.stopped listen=%s", address)
    return 0


def _start_metrics(settings: ProxySettings, service: MessagingService) -> Any:
    """The proxy's /metrics (None when metrics_listen is off). Imported only then: the proxy
    runs on the base install, and /metrics needs the server extra (prometheus_client)."""
    if metrics_bind(settings.metrics_listen) is None:
        return None
    try:
        from raftmq.common.metrics_http import start_metrics
        from raftmq.proxy.metrics import ProxyMetrics
    except ImportError as exc:
        raise SettingsError(
            f"metrics_listen needs {exc.name}: pip install 'raftmq[server]'"
        ) from None
    return start_metrics(
        settings.metrics_listen,
        ProxyMetrics(service).registry,
        lambda: (True, f"proxy serving {settings.advertised}"),
        "proxy",
        settings,
    )


def serve(settings: ProxySettings, stop: threading.Event) -> int:
    return asyncio.run(_serve(settings, stop))


if __name__ == "__main__":
    sys.exit(main())
