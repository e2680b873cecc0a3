"""`raftmq dashboard`: serve the web dashboard (ops/dashboard) until Ctrl-C. The address comes
from --listen, else from the `[dashboard]` table of the cluster description given with --spec
(whose NameServers it then uses too), else 127.0.0.1:8080. Read-only unless --allow-actions.
With the description's [security.auth] on, every page asks a sign-in (issue 27): the cluster's
users, an admin (super user) may act, others read."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path
from typing import Any

from raftmq.common import tls
from raftmq.common.acl import User
from raftmq.common.auth import ENV_ADMIN_ACCESS_KEY, ENV_ADMIN_SECRET_KEY
from raftmq.common.types import parse_address
from raftmq.ops import cli_data
from raftmq.ops.cluster_spec import ClusterSpec, load

DEFAULT_LISTEN = "127.0.0.1:8080"
METRICS_ENV_PREFIX = "RAFTMQ_DASHBOARD_"  # the /metrics credentials (issue 27)


def dashboard(args: argparse.Namespace) -> int:
    from raftmq.client.admin import Admin
    from raftmq.common.http_shell import HttpLimits
    from raftmq.ops.dashboard.app import Dashboard, Login
    from raftmq.ops.dashboard.server import (
        MAX_CONNECTIONS,
        MAX_CONNECTIONS_PER_ADDRESS,
        DashboardServer,
    )

    namesrv = cli_data._namesrv(args)
    listen = args.listen
    metrics_listen = args.metrics_listen
    served = tls.process_tls()  # --tls-*/RAFTMQ_TLS_*: the client certificate serves too
    controllers = ""
    admin_user = None
    if args.spec:
        spec = load(Path(args.spec))
        namesrv = spec.namesrv_addresses
        listen = listen or (str(spec.dashboard) if spec.dashboard else "")
        metrics_listen = metrics_listen or spec.dashboard_metrics  # [dashboard] metrics_port
        served = _spec_dashboard_tls(spec) or served
        admin_user = _spec_admin(spec)
        controllers = spec.controller_addresses if admin_user is not None else ""
    host, _, port = parse_address(listen or DEFAULT_LISTEN, "--listen").rpartition(":")
    with Admin(namesrv, controllers=controllers) as admin:
        login = None
        if admin_user is not None:
            login = Login(admin.acl.snapshot, admin_user, secure=served is not None)
        server = DashboardServer(
            Dashboard(admin, allow_actions=args.allow_actions, namesrv=namesrv, login=login),
            host.strip("[]"),
            int(port),
            limits=HttpLimits(
                max_connections=args.max_connections or MAX_CONNECTIONS,
                max_connections_per_address=(
                    args.max_connections_per_address or MAX_CONNECTIONS_PER_ADDRESS
                ),
            ),
            ssl=None if served is None else served.server_context(),
        )
        # The metrics port first: once the dashboard answers, its /metrics does too.
        metrics = _start_metrics(metrics_listen, args.metrics_tls, server, served)
        try:
            server.start()
        except BaseException:
            if metrics is not None:
                metrics.stop()
            raise
        mode = "actions allowed (each asks for confirmation)" if args.allow_actions else "read-only"
        if login is not None:
            mode += "; sign in as a user of the cluster (admins act, others read)"
        cli_data.console.print(
            f"dashboard: {tls.scheme(served)}://{server.address}/ ({mode}); "
            f"NameServers {namesrv}; Ctrl-C stops",
            highlight=False,
        )
        if metrics is not None:
            scheme = "http" if args.metrics_tls == "off" else tls.scheme(served)
            cli_data.console.print(
                f"dashboard metrics: {scheme}://{metrics.address}/metrics", highlight=False
            )
        # Installed here, not inherited: a shell starts background jobs with SIGINT ignored,
        # and a supervisor stops with SIGTERM; both end the wait the same way.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _interrupt)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            cli_data.console.print("dashboard stopped", highlight=False)
        finally:
            if metrics is not None:
                metrics.stop()
            server.stop()
    return 0


def _start_metrics(listen: str, metrics_tls: str, server: Any, served: tls.Tls | None) -> Any:
    """The dashboard's /metrics on `listen` (--metrics-listen, else the description's
    [dashboard] metrics_port; None when neither): the brokers' rules, its TLS as the
    dashboard's own certificate (metrics_tls modes), its credentials from
    RAFTMQ_DASHBOARD_METRICS_BASIC_AUTH_USER/_PASSWORD or _BEARER_TOKEN (never flags: secrets
    stay off the command line)."""
    if not listen:
        return None
    from raftmq.common.metrics_http import start_metrics
    from raftmq.common.scrape_access import ScrapeSettings, check_metrics_listen
    from raftmq.common.settings import SettingsError, load_settings
    from raftmq.ops.dashboard.metrics import dashboard_registry

    try:
        check_metrics_listen(listen, "--metrics-listen")
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    settings = load_settings(
        ScrapeSettings, None, METRICS_ENV_PREFIX, {"metrics_tls": metrics_tls or None}
    )
    return start_metrics(
        listen,
        dashboard_registry(server),
        lambda: (bool(server.address), f"dashboard serving {server.address or '(starting)'}"),
        "dashboard",
        settings,
        tls_material=served,
    )


def _spec_dashboard_tls(spec: ClusterSpec) -> tls.Tls | None:
    """With [security.tls]: the dashboard serves its own certificate (dashboard.crt) and calls
    the cluster with the client one (installed for this process)."""
    if spec.tls is None:
        return None
    from raftmq.ops.cli_cluster import use_spec_tls

    use_spec_tls(spec)  # checks every file first
    return tls.load(
        {
            "ca": str(spec.tls.ca),
            "cert": str(spec.tls.cert("dashboard")),
            "key": str(spec.tls.key("dashboard")),
            "require_client_cert": spec.tls.require_client_cert,
        },
        environ={},
    )


def _spec_admin(spec: ClusterSpec) -> User | None:
    """With [security.auth] on: the description's admin (a super user not in the ACL), whose
    keys this process also signs its own calls with; None when auth is off (no sign-in then)."""
    from raftmq.common.acl import UserType
    from raftmq.ops.cli_acl import prepare_cluster_auth

    if prepare_cluster_auth(spec) is not None:  # the open cluster's warning: auth is off
        return None
    ak = str(spec.auth.get("auth_admin_access_key") or os.environ.get(ENV_ADMIN_ACCESS_KEY, ""))
    sk = str(spec.auth.get("auth_admin_secret_key") or os.environ.get(ENV_ADMIN_SECRET_KEY, ""))
    return User(ak, sk, UserType.SUPER) if ak and sk else None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "dashboard", help="serve the web dashboard (cluster, topics, groups, messages)"
    )
    p.add_argument(
        "--listen",
        default="",
        help=f"host:port to serve on (default: the [dashboard] of --spec, else {DEFAULT_LISTEN})",
    )
    p.add_argument(
        "--spec",
        default="",
        help="cluster description (TOML): its NameServers and its [dashboard] host and port",
    )
    p.add_argument(
        "--allow-actions",
        action="store_true",
        help="offer create topic, reset offsets and resend dead letter (each confirmed first)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=0,
        help="connections served at once, over every client (default 512)",
    )
    p.add_argument(
        "--max-connections-per-address",
        type=int,
        default=0,
        help="connections one client host may hold (default 32; one held or slow is closed "
        "after 10 s without a whole request)",
    )
    p.add_argument(
        "--metrics-listen",
        default="",
        help="serve Prometheus /metrics, /healthz and /readyz on this host:port too (port 0 = "
        "any free one; default: the [dashboard] metrics_port of --spec, else none); "
        "credentials from RAFTMQ_DASHBOARD_METRICS_BASIC_AUTH_USER and _PASSWORD, or "
        "_BEARER_TOKEN",
    )
    p.add_argument(
        "--metrics-tls",
        default="",
        choices=("", "off", "server-only", "mutual"),
        help='TLS of the metrics port: "" = as the dashboard (its certificate under '
        "[security.tls]), server-only, mutual or off",
    )
    p.set_defaults(func=dashboard)
