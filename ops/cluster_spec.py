"""The cluster description (deploy/cluster.toml) as values: which processes make up a cluster and
the exact argv that starts each one. `make run`, docker-compose.yml and the chaos suite all start
processes from here, so the three never drift apart.

Pure: reading the TOML file is the only I/O; hosts and the data root can be remapped (network
namespaces, containers) without touching the description.
"""

from __future__ import annotations

import difflib
import importlib
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from raftmq.common.auth import ENV_ADMIN_SECRET_KEY
from raftmq.common.settings import secret_keys, settings_table

NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")
DATA_PORT_OFFSET = 1000  # a broker's data port in host-reachable compose: gRPC port + 1000


class SpecError(ValueError):
    """The description is wrong; the message names the key."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class BrokerNodeSpec:
    group: str
    node_id: str
    address: Endpoint
    raft: Endpoint
    # The framed data path's port in `raftmq cluster compose --host-reachable` (None: the gRPC
    # port + DATA_PORT_OFFSET). Elsewhere the broker binds any free port (its data_listen).
    data_port: int | None = None

    @property
    def name(self) -> str:
        return f"{self.group}-{self.node_id}"

    @property
    def compose_data_port(self) -> int:
        return (
            self.data_port if self.data_port is not None else self.address.port + DATA_PORT_OFFSET
        )


@dataclass(frozen=True, slots=True)
class ControllerSpec:
    node_id: str
    address: Endpoint
    raft: Endpoint

    @property
    def name(self) -> str:
        return f"controller-{self.node_id.removeprefix('c')}"


@dataclass(frozen=True, slots=True)
class TlsSpec:
    """[security.tls]: every process serves and calls with TLS. Files by convention in `dir`:
    ca.crt, <process name>.crt/.key (namesrv-0, broker-a-n1, controller-2, proxy-0), client.crt/
    .key (SDK, CLI), dashboard.crt/.key and raft.key; `raftmq cluster certs` makes them."""

    dir: Path
    ca: Path
    require_client_cert: bool = False
    # the proxy's client port (issue 27): None = as require_client_cert; False = server-only
    # TLS, so the official RocketMQ 5 clients (no client certificate) connect with AK/SK
    proxy_require_client_cert: bool | None = None

    def cert(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    @property
    def raft_key(self) -> Path:
        return self.dir / "raft.key"

    def flags(self, name: str, role: str = "") -> tuple[str, ...]:
        """A process's --tls-* flags (common/tls.py's TlsSettings); TLS server-only or mutual
        is chosen per port, and the proxy's one port may differ from the cluster's."""
        out = (
            "--tls-ca", str(self.ca), "--tls-cert", str(self.cert(name)),
            "--tls-key", str(self.key(name)), "--tls-raft-key", str(self.raft_key),
        )  # fmt: skip
        mutual = self.require_client_cert
        if role == "proxy" and self.proxy_require_client_cert is not None:
            mutual = self.proxy_require_client_cert
        return (*out, "--tls-require-client-cert") if mutual else out

    def files(self, names: Sequence[str]) -> list[Path]:
        return [self.ca, self.raft_key, *(f(n) for n in names for f in (self.cert, self.key))]

    def missing(self, names: Sequence[str]) -> list[Path]:
        return [p for p in self.files(names) if not p.is_file()]


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """One process: `python -m <argv...>` prints a line starting with `ready_prefix` once up."""

    name: str
    role: str  # "namesrv", "broker", "controller" or "proxy"
    module: str
    argv: tuple[str, ...]  # after `python`
    ready_prefix: str
    data_dir: Path
    host: str
    ports: tuple[int, ...]
    group: str = ""
    metrics: str = ""  # host:port of its /metrics, /healthz and /readyz; "" = none
    # Secrets the process gets in its environment, never on its command line (visible to every
    # user in `ps`): (variable, value) pairs (issue 27).
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    name: str
    data_dir: Path
    namesrvs: tuple[Endpoint, ...]
    groups: dict[str, tuple[BrokerNodeSpec, ...]]
    controllers: tuple[ControllerSpec, ...] = ()
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    preferred_leaders: Mapping[str, str] = field(default_factory=dict)  # group -> node id
    # The controllers run inside the NameServer processes (controller i in NameServer i, on its
    # gRPC port; its Raft port is the controller's raft endpoint).
    controller_in_namesrv: bool = False
    # Process name -> the HTTP port of its /metrics (with /healthz, /readyz) on its own host;
    # a process not named serves no metrics. From each table's `metrics_port`.
    metrics_ports: Mapping[str, int] = field(default_factory=dict)
    # RocketMQ 5 gRPC API proxies (raftmq-proxy), named proxy-<i>; started after the brokers.
    proxies: tuple[Endpoint, ...] = ()
    # Where `raftmq dashboard --spec` (and the compose service `dashboard`) serves the web UI;
    # from the [dashboard] table (host defaults to 127.0.0.1). None: no table.
    dashboard: Endpoint | None = None
    # The dashboard's /metrics port on its host, from [dashboard] `metrics_port` (the key every
    # process table takes); None: it serves none. Not in metrics_ports: the dashboard is not
    # one of processes() (`cluster up` does not start it).
    dashboard_metrics_port: int | None = None
    # [security.tls]; None: every channel is plaintext (the cluster is open).
    tls: TlsSpec | None = None
    # [security.auth] (issue 19) as role settings: auth_enabled, auth_admin_access_key, ...
    auth: Mapping[str, Any] = field(default_factory=dict)

    @property
    def namesrv_addresses(self) -> str:
        return ",".join(str(e) for e in self.namesrvs)

    @property
    def controller_addresses(self) -> str:
        return ",".join(str(c.address) for c in self.controllers)

    def with_data_dir(self, data_dir: Path) -> ClusterSpec:
        return replace(self, data_dir=data_dir)

    def with_hosts(self, hosts: Mapping[str, str]) -> ClusterSpec:
        """Each process named in `hosts` on that host instead (same ports), e.g. its own
        network namespace IP. Names: "namesrv-0", "broker-a-n1", "controller-2"."""
        namesrvs = tuple(
            Endpoint(hosts.get(f"namesrv-{i}", e.host), e.port) for i, e in enumerate(self.namesrvs)
        )
        groups = {
            g: tuple(
                replace(
                    n,
                    address=Endpoint(hosts.get(n.name, n.address.host), n.address.port),
                    raft=Endpoint(hosts.get(n.name, n.raft.host), n.raft.port),
                )
                for n in nodes
            )
            for g, nodes in self.groups.items()
        }
        controllers = tuple(
            replace(
                c,
                address=Endpoint(hosts.get(c.name, c.address.host), c.address.port),
                raft=Endpoint(hosts.get(c.name, c.raft.host), c.raft.port),
            )
            for c in self.controllers
        )
        if self.controller_in_namesrv:
            controllers = tuple(
                replace(c, address=ns, raft=Endpoint(ns.host, c.raft.port))
                for c, ns in zip(self.controllers, namesrvs, strict=True)
            )
        proxies = tuple(
            Endpoint(hosts.get(f"proxy-{i}", e.host), e.port) for i, e in enumerate(self.proxies)
        )
        return replace(
            self, namesrvs=namesrvs, groups=groups, controllers=controllers, proxies=proxies
        )

    def with_ports(self, ports: list[int]) -> ClusterSpec:
        """Every port replaced, in order, from `ports` (tests: free ports)."""
        it = iter(ports)
        try:
            namesrvs = tuple(Endpoint(e.host, next(it)) for e in self.namesrvs)
            groups = {
                g: tuple(
                    replace(
                        n,
                        address=Endpoint(n.address.host, next(it)),
                        raft=Endpoint(n.raft.host, next(it)),
                    )
                    for n in nodes
                )
                for g, nodes in self.groups.items()
            }
            if self.controller_in_namesrv:
                controllers = tuple(
                    replace(c, address=ns, raft=Endpoint(ns.host, next(it)))
                    for c, ns in zip(self.controllers, namesrvs, strict=True)
                )
            else:
                controllers = tuple(
                    replace(
                        c,
                        address=Endpoint(c.address.host, next(it)),
                        raft=Endpoint(c.raft.host, next(it)),
                    )
                    for c in self.controllers
                )
            proxies = tuple(Endpoint(e.host, next(it)) for e in self.proxies)
            metrics_ports = {name: next(it) for name in self._metrics_names()}
        except StopIteration:
            raise SpecError(f"{self.port_count()} ports are needed, {len(ports)} given") from None
        return replace(
            self,
            namesrvs=namesrvs,
            groups=groups,
            controllers=controllers,
            proxies=proxies,
            metrics_ports=metrics_ports,
        )

    def _metrics_names(self) -> list[str]:
        """Processes with a metrics port, in the order of processes()."""
        return [p.name for p in self.processes() if p.name in self.metrics_ports]

    def port_count(self) -> int:
        return (
            len(self.namesrvs)
            + 2 * sum(len(n) for n in self.groups.values())
            + (1 if self.controller_in_namesrv else 2) * len(self.controllers)
            + len(self.proxies)
            + len(self.metrics_ports)
        )

    def without_controllers(self) -> ClusterSpec:
        return replace(self, controllers=())

    # ---- processes ----------------------------------------------------------------------------

    def _controller_argv(self, c: ControllerSpec, flags: list[str], data: Path) -> list[str]:
        """An embedded controller's settings as the NameServer's --controller-<key> flags."""
        peers = ",".join(
            f"{o.node_id}={o.address}/{o.raft}" for o in self.controllers if o is not c
        )
        own = [
            "--node-id", c.node_id, "--raft-address", str(c.raft), "--data-dir", str(data),
            "--namesrv-addresses", self.namesrv_addresses,
        ]  # fmt: skip
        if peers:
            own += ["--peers", peers]
        return [_embedded_flag(f) for f in own + flags]

    def processes(self) -> list[ProcessSpec]:
        """NameServers first, then controllers, then broker nodes: the order to start them."""
        out: list[ProcessSpec] = []
        ns_flags, ns_env = self._role_flags("namesrv")
        ctl_flags, ctl_env = self._role_flags("controller")
        if self.preferred_leaders:
            ctl_flags += [
                "--preferred-leaders",
                ",".join(f"{g}={n}" for g, n in sorted(self.preferred_leaders.items())),
            ]
        for i, e in enumerate(self.namesrvs):
            name = f"namesrv-{i}"
            argv = ["-m", "raftmq.namesrv.server", "--listen", str(e), *ns_flags]
            ports: tuple[int, ...] = (e.port,)
            if self.controller_in_namesrv:
                c = self.controllers[i]
                argv += [
                    "--enable-controller",
                    *self._controller_argv(c, ctl_flags, self.data_dir / name / "controller"),
                ]
                ports = (e.port, c.raft.port)
            out.append(
                ProcessSpec(
                    name,
                    "namesrv",
                    "raftmq.namesrv.server",
                    tuple(argv),
                    "namesrv.started",
                    self.data_dir / name,
                    e.host,
                    ports,
                    env=ns_env + (ctl_env if self.controller_in_namesrv else ()),
                )
            )
        for c in () if self.controller_in_namesrv else self.controllers:
            peers = ",".join(
                f"{o.node_id}={o.address}/{o.raft}" for o in self.controllers if o is not c
            )
            out.append(
                ProcessSpec(
                    c.name,
                    "controller",
                    "raftmq.controller.server",
                    (
                        "-m",
                        "raftmq.controller.server",
                        "--node-id",
                        c.node_id,
                        "--listen",
                        str(c.address),
                        "--raft-address",
                        str(c.raft),
                        "--peers",
                        peers,
                        "--data-dir",
                        str(self.data_dir / c.name),
                        "--namesrv-addresses",
                        self.namesrv_addresses,
                        *ctl_flags,
                    ),
                    "controller.started",
                    self.data_dir / c.name,
                    c.address.host,
                    (c.address.port, c.raft.port),
                    env=ctl_env,
                )
            )
        br_flags, br_env = self._role_flags("broker")
        for group, nodes in self.groups.items():
            members = ",".join(f"{n.node_id}={n.address}/{n.raft}" for n in nodes)
            for n in nodes:
                argv = [
                    "-m",
                    "raftmq.broker.server",
                    "--cluster",
                    self.name,
                    "--broker-group",
                    group,
                    "--node-id",
                    n.node_id,
                    "--members",
                    members,
                    "--data-dir",
                    str(self.data_dir / n.name),
                    "--namesrv-addresses",
                    self.namesrv_addresses,
                ]
                if self.controllers:
                    argv += ["--controller-addresses", self.controller_addresses]
                out.append(
                    ProcessSpec(
                        n.name,
                        "broker",
                        "raftmq.broker.server",
                        (*argv, *br_flags),
                        "broker.started",
                        self.data_dir / n.name,
                        n.address.host,
                        (n.address.port, n.raft.port),
                        group,
                        env=br_env,
                    )
                )
        px_flags, px_env = self._role_flags("proxy")
        peers = ",".join(str(e) for e in self.proxies)
        for i, e in enumerate(self.proxies):
            name = f"proxy-{i}"
            argv = [
                "-m", "raftmq.proxy.server", "--listen", str(e), "--advertise", str(e),
                "--namesrv-addresses", self.namesrv_addresses,
            ]  # fmt: skip
            if len(self.proxies) > 1:
                argv += ["--proxy-addresses", peers]
            out.append(
                ProcessSpec(
                    name,
                    "proxy",
                    "raftmq.proxy.server",
                    (*argv, *px_flags),
                    "proxy.started",
                    self.data_dir / name,
                    e.host,
                    (e.port,),
                    env=px_env,
                )
            )
        return [self._with_tls(self._with_metrics(p)) for p in out]

    def _with_tls(self, p: ProcessSpec) -> ProcessSpec:
        if self.tls is None:
            return p
        return replace(p, argv=(*p.argv, *self.tls.flags(p.name, p.role)))

    def tls_names(self) -> list[str]:
        """Who gets a certificate: every process, the dashboard and the SDK/CLI's `client`."""
        return [p.name for p in self.processes()] + ["dashboard", "client"]

    def check_tls_files(self) -> None:
        """Before starting anything: every file TLS needs is there, else SpecError naming them."""
        if self.tls is None:
            return
        missing = self.tls.missing(self.tls_names())
        if missing:
            shown = ", ".join(str(p) for p in missing[:4]) + (" ..." if len(missing) > 4 else "")
            raise SpecError(
                f"[security.tls] is enabled but {shown} "
                f"{'is' if len(missing) == 1 else 'are'} missing; run `raftmq cluster certs "
                "--spec <this description>` to make a development CA and certificates"
            )

    def _role_flags(self, role: str) -> tuple[list[str], tuple[tuple[str, str], ...]]:
        """A role's settings from [security.auth] and [settings.<role>]: the plain ones as
        flags, the secret ones (declared `secret=True`) as environment variables. The admin's
        secret goes as RAFTMQ_ADMIN_SECRET_KEY, which every role (an embedded controller too)
        reads when its own key is empty."""
        values = {**self._auth(role), **self.settings.get(role, {})}
        module_name, class_name = ROLE_SETTINGS[role]
        module = importlib.import_module(module_name)
        secrets = secret_keys(getattr(module, class_name))
        env: list[tuple[str, str]] = []
        for key in sorted(secrets & set(values)):
            value = str(values.pop(key))
            if not value:
                continue
            if key == "auth_admin_secret_key":
                env.append((ENV_ADMIN_SECRET_KEY, value))
            else:
                env.append((f"{module.ENV_PREFIX}{key.upper()}", value))
        return _flags(values), tuple(env)

    def _auth(self, role: str) -> dict[str, Any]:
        """[security.auth] as the role's settings; the NameServers and proxies fetch the users
        and policies from the controllers (an embedded controller is the NameServer's own)."""
        if not self.auth.get("auth_enabled"):
            return {}
        out = dict(self.auth)
        if role in ("namesrv", "proxy") and not (role == "namesrv" and self.controller_in_namesrv):
            out["acl_controller_addresses"] = self.controller_addresses
        return out

    def _with_metrics(self, p: ProcessSpec) -> ProcessSpec:
        port = self.metrics_ports.get(p.name)
        if port is None:
            return p
        listen = f"{p.host}:{port}"
        return replace(
            p,
            argv=(*p.argv, "--metrics-listen", listen),
            ports=(*p.ports, port),
            metrics=listen,
        )

    @property
    def dashboard_metrics(self) -> str:
        """host:port of the dashboard's /metrics ("" when the description gives it none)."""
        if self.dashboard is None or self.dashboard_metrics_port is None:
            return ""
        return f"{self.dashboard.host}:{self.dashboard_metrics_port}"

    def metrics_endpoints(self) -> list[tuple[str, str]]:
        """(process name, http(s)://host:port/metrics) of every process that serves metrics,
        and the dashboard's ("dashboard") when it has a metrics_port."""
        scheme = "https" if self.tls is not None else "http"
        out = [(p.name, f"{scheme}://{p.metrics}/metrics") for p in self.processes() if p.metrics]
        if self.dashboard_metrics:
            out.append(("dashboard", f"{scheme}://{self.dashboard_metrics}/metrics"))
        return out


def _embedded_flag(arg: str) -> str:
    """--key -> --controller-key, --no-key -> --no-controller-key; values unchanged."""
    if arg.startswith("--no-"):
        return "--no-controller-" + arg[5:]
    return "--controller-" + arg[2:] if arg.startswith("--") else arg


def _flags(settings: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out


# ---- parsing ------------------------------------------------------------------------------------


def _str(table: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = table.get(key, default)
    if not isinstance(value, str) or not value:
        raise SpecError(f"{where}.{key} must be a non-empty string, got {value!r}")
    return value


def _port(table: Mapping[str, Any], key: str, where: str) -> int:
    value = table.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= 65535:
        raise SpecError(f"{where}.{key} must be a port number 1..65535, got {value!r}")
    return value


def _name(value: str, where: str) -> str:
    if not set(value.lower()) <= NAME_CHARS:
        raise SpecError(f"{where} {value!r} may hold only letters, digits, '-' and '_'")
    return value


# [security.auth] key -> (role settings key, type)
_AUTH_KEYS: dict[str, tuple[str, type]] = {
    "enabled": ("auth_enabled", bool),
    "admin_access_key": ("auth_admin_access_key", str),
    "admin_secret_key": ("auth_admin_secret_key", str),
    "admin_secret_file": ("auth_admin_secret_key", Path),  # read here, mode 600 or stricter
    "window_ms": ("auth_window_ms", int),
    "refresh_ms": ("acl_refresh_ms", int),
}


def _security_auth(security: object, source: str) -> dict[str, Any]:
    """[security.auth] (issue 19) as role settings. The admin's keys may be left out and given
    to every process as RAFTMQ_ADMIN_ACCESS_KEY / RAFTMQ_ADMIN_SECRET_KEY instead, or the secret
    read from admin_secret_file (mode 600); either way it reaches the processes in their
    environment, never on their command lines. Other
    [security.*] tables (tls) are read elsewhere."""
    if not isinstance(security, dict):
        raise SpecError(f"{source}: [security] must be a table")
    table = security.get("auth", {})
    if not isinstance(table, dict):
        raise SpecError(f"{source}: [security.auth] must be a table")
    out: dict[str, Any] = {}
    for key, value in table.items():
        known = _AUTH_KEYS.get(key)
        if known is None:
            raise SpecError(
                f"{source}: [security.auth] has no key {key!r} (known: {', '.join(_AUTH_KEYS)})"
            )
        name, kind = known
        if kind is Path:
            out[name] = read_secret_file(value, f"{source}: security.auth.{key}")
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise SpecError(f"{source}: security.auth.{key} must be a {kind.__name__}")
        out[name] = value
    return out


def read_secret_file(path: object, what: str) -> str:
    """A secret kept in a file only its owner may read (mode 600 or stricter): its first line.
    Refused with the fix when the file is readable by others or missing."""
    if not isinstance(path, str) or not path:
        raise SpecError(f"{what} must be the path of a file holding the secret")
    file = Path(path).expanduser()
    try:
        mode = file.stat().st_mode
        if mode & 0o077:
            raise SpecError(
                f"{what}: {file} may be read by other users (mode {mode & 0o777:o}); "
                f"run: chmod 600 {file}"
            )
        secret = file.read_text().strip()
    except OSError as exc:
        raise SpecError(f"{what}: cannot read {file}: {exc.strerror}") from None
    if not secret:
        raise SpecError(f"{what}: {file} is empty")
    return secret


def _dashboard(table: object, source: str) -> tuple[Endpoint | None, int | None]:
    """[dashboard]: where it serves, and its metrics port (None: none)."""
    if table is None:
        return None, None
    if not isinstance(table, dict):
        raise SpecError(f"{source}: [dashboard] must be a table with host and port")
    unknown = sorted(set(table) - {"host", "port", "metrics_port"})
    if unknown:
        raise SpecError(
            f"{source}: unknown dashboard key(s) {', '.join(unknown)}; known: host, port, "
            "metrics_port"
        )
    where = _str(table, "host", "dashboard", "127.0.0.1"), _port(table, "port", "dashboard")
    metrics = _port(table, "metrics_port", "dashboard") if "metrics_port" in table else None
    if metrics == where[1]:
        raise SpecError(f"{source}: dashboard.metrics_port must differ from dashboard.port")
    return Endpoint(*where), metrics


_TLS_KEYS = ("enabled", "dir", "ca", "require_client_cert", "proxy_require_client_cert")


def _security_tls(security: object, source: str) -> TlsSpec | None:
    """[security.tls]; [security.auth] is _security_auth's."""
    if security is None:
        return None
    if not isinstance(security, dict):
        raise SpecError(f"{source}: [security] must be a table ([security.tls], [security.auth])")
    unknown = sorted(set(security) - {"tls", "auth"})
    if unknown:
        raise SpecError(
            f"{source}: unknown [security] table(s) {', '.join(unknown)}; known: tls, auth"
        )
    t = security.get("tls")
    if t is None:
        return None
    if not isinstance(t, dict):
        raise SpecError(f"{source}: [security.tls] must be a table")
    unknown = sorted(set(t) - set(_TLS_KEYS))
    if unknown:
        raise SpecError(
            f"{source}: unknown [security.tls] key(s) {', '.join(unknown)}; known: "
            + ", ".join(_TLS_KEYS)
        )
    for key in ("enabled", "require_client_cert", "proxy_require_client_cert"):
        if not isinstance(t.get(key, False), bool):
            raise SpecError(f"{source}: security.tls.{key} must be true or false")
    if not t.get("enabled", False):
        return None
    d = Path(_str(t, "dir", "security.tls", "certs"))
    ca = Path(_str(t, "ca", "security.tls", str(d / "ca.crt")))
    proxy = t.get("proxy_require_client_cert")
    return TlsSpec(d, ca, bool(t.get("require_client_cert", False)), proxy)


def parse(text: str, *, source: str = "cluster description") -> ClusterSpec:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{source} is not valid TOML: {exc}") from exc
    known = {
        "cluster", "namesrv", "group", "controller", "proxy", "settings", "dashboard", "security",
    }  # fmt: skip
    metrics_ports: dict[str, int] = {}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SpecError(
            f"{source}: unknown section(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    cluster = raw.get("cluster", {})
    name = _name(_str(cluster, "name", "cluster", "DefaultCluster"), "cluster.name")
    data_dir = Path(_str(cluster, "data_dir", "cluster", "data"))
    namesrvs = tuple(
        Endpoint(_str(t, "host", f"namesrv[{i}]"), _port(t, "port", f"namesrv[{i}]"))
        for i, t in enumerate(raw.get("namesrv", []))
    )
    if not namesrvs:
        raise SpecError(f"{source}: at least one [[namesrv]] is needed")
    for i, t in enumerate(raw.get("namesrv", [])):
        if "metrics_port" in t:
            metrics_ports[f"namesrv-{i}"] = _port(t, "metrics_port", f"namesrv[{i}]")
    groups: dict[str, tuple[BrokerNodeSpec, ...]] = {}
    preferred: dict[str, str] = {}
    for i, g in enumerate(raw.get("group", [])):
        gname = _name(_str(g, "name", f"group[{i}]"), f"group[{i}].name")
        if gname in groups:
            raise SpecError(f"{source}: group {gname!r} appears twice")
        nodes = []
        for j, n in enumerate(g.get("nodes", [])):
            where = f"group[{gname}].nodes[{j}]"
            nodes.append(
                BrokerNodeSpec(
                    gname,
                    _name(_str(n, "id", where), f"{where}.id"),
                    Endpoint(_str(n, "host", where), _port(n, "port", where)),
                    Endpoint(_str(n, "host", where), _port(n, "raft_port", where)),
                    _port(n, "data_port", where) if "data_port" in n else None,
                )
            )
            if "metrics_port" in n:
                metrics_ports[nodes[-1].name] = _port(n, "metrics_port", where)
        if not nodes:
            raise SpecError(f"{source}: group {gname!r} has no nodes")
        if len({n.node_id for n in nodes}) != len(nodes):
            raise SpecError(f"{source}: group {gname!r} repeats a node id")
        if "preferred_leader" in g:
            want = _str(g, "preferred_leader", f"group[{gname}]")
            if want not in {n.node_id for n in nodes}:
                raise SpecError(
                    f"{source}: group {gname!r} prefers leader {want!r}, which is not one of "
                    f"its nodes ({', '.join(n.node_id for n in nodes)})"
                )
            preferred[gname] = want
        groups[gname] = tuple(nodes)
    if not groups:
        raise SpecError(f"{source}: at least one [[group]] is needed")
    embedded = cluster.get("controller_in_namesrv", False)
    if not isinstance(embedded, bool):
        raise SpecError(f"{source}: cluster.controller_in_namesrv must be true or false")
    if embedded and raw.get("controller"):
        raise SpecError(
            f"{source}: with cluster.controller_in_namesrv the NameServers carry the "
            "controllers; remove the [[controller]] tables"
        )
    controllers = tuple(
        ControllerSpec(
            _name(_str(c, "id", f"controller[{i}]"), f"controller[{i}].id"),
            Endpoint(_str(c, "host", f"controller[{i}]"), _port(c, "port", f"controller[{i}]")),
            Endpoint(
                _str(c, "host", f"controller[{i}]"), _port(c, "raft_port", f"controller[{i}]")
            ),
        )
        for i, c in enumerate(raw.get("controller", []))
    )
    for i, c in enumerate(raw.get("controller", [])):
        if "metrics_port" in c and not embedded:
            metrics_ports[controllers[i].name] = _port(c, "metrics_port", f"controller[{i}]")
    if embedded:
        controllers = tuple(
            ControllerSpec(f"c{i}", ns, Endpoint(ns.host, _port(t, "raft_port", f"namesrv[{i}]")))
            for i, (ns, t) in enumerate(zip(namesrvs, raw.get("namesrv", []), strict=True))
        )
    proxies = tuple(
        Endpoint(_str(t, "host", f"proxy[{i}]"), _port(t, "port", f"proxy[{i}]"))
        for i, t in enumerate(raw.get("proxy", []))
    )
    for i, t in enumerate(raw.get("proxy", [])):
        if "metrics_port" in t:
            metrics_ports[f"proxy-{i}"] = _port(t, "metrics_port", f"proxy[{i}]")
    settings = raw.get("settings", {})
    if not isinstance(settings, dict) or not set(settings) <= set(ROLE_SETTINGS):
        raise SpecError(
            f"{source}: [settings] may hold only namesrv, broker, controller and proxy tables"
        )
    for role, table in settings.items():
        _check_settings_keys(role, table, source)
    tls_spec = _security_tls(raw.get("security"), source)  # refuses unknown [security.*] too
    auth = _security_auth(raw.get("security", {}), source)
    if auth.get("auth_enabled") and not controllers:
        raise SpecError(
            f"{source}: [security.auth] enabled needs controllers ([[controller]] or "
            "cluster.controller_in_namesrv): the users and policies live in their replicated state"
        )
    dashboard, dashboard_metrics_port = _dashboard(raw.get("dashboard"), source)
    spec = ClusterSpec(
        name,
        data_dir,
        namesrvs,
        groups,
        controllers,
        settings,
        preferred,
        embedded,
        metrics_ports=metrics_ports,
        proxies=proxies,
        dashboard=dashboard,
        dashboard_metrics_port=dashboard_metrics_port,
        tls=tls_spec,
        auth=auth,
    )
    endpoints = [
        (p.name, h, port) for p in spec.processes() for h, port in ((p.host, x) for x in p.ports)
    ]
    if dashboard is not None:  # it runs beside the processes: its ports clash as theirs do
        endpoints += [
            ("dashboard", dashboard.host, port)
            for port in (dashboard.port, dashboard_metrics_port)
            if port is not None
        ]
    seen: dict[tuple[str, int], str] = {}
    for pname, host, port in endpoints:
        other = seen.get((host, port))
        if other is not None and other != pname:
            raise SpecError(f"{source}: {pname} and {other} both use {host}:{port}")
        seen[(host, port)] = pname
    return spec


# Each [settings.<role>] table's keys are the fields of the role's settings class.
ROLE_SETTINGS = {
    "namesrv": ("raftmq.namesrv.settings", "NameServerSettings"),
    "broker": ("raftmq.broker.settings", "BrokerSettings"),
    "controller": ("raftmq.controller.settings", "ControllerSettings"),
    "proxy": ("raftmq.proxy.settings", "ProxySettings"),
}


def _check_settings_keys(role: str, table: object, source: str) -> None:
    """Refuse a key the role's settings class does not have, when the description is read (not
    after half the cluster has started), with the closest known key as the likely fix."""
    if not isinstance(table, dict):
        raise SpecError(f"{source}: [settings.{role}] must be a table of key = value")
    module_name, class_name = ROLE_SETTINGS[role]
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except ModuleNotFoundError as exc:
        raise SpecError(
            f"{source}: [settings.{role}] cannot be checked: {exc.name} is not installed "
            "(install raftmq[server] to run a cluster)"
        ) from exc
    known = [row.key for row in settings_table(cls)]
    for key in table:
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SpecError(
            f"{source}: [settings.{role}] has no key {key!r}{hint} (the {role} settings are "
            "listed in the README's settings table and by "
            f"`python -m raftmq.{role}.server --help`)"
        )


def local_description(
    ports: Sequence[int],
    data_dir: Path,
    *,
    name: str = "Local",
    namesrvs: int = 2,
    groups: Sequence[str] = ("broker-a",),
    controllers: int = 3,
    nodes_per_group: int = 3,
    proxies: int = 0,
    extra: str = "",
    metrics: bool = False,
) -> str:
    """A cluster description on 127.0.0.1 with the given ports in the order with_ports uses
    (NameServers, then per group each node's gRPC and Raft port, then per controller its gRPC
    and Raft port, then each proxy's port; with `metrics`, then one metrics port per NameServer,
    node and controller in that order): tests and benchmarks start real clusters on free ports
    from it."""
    count = namesrvs + len(groups) * nodes_per_group + controllers
    it = iter(list(ports)[: len(ports) - (count if metrics else 0)])
    m_it = iter(list(ports)[len(ports) - count :]) if metrics else iter(())

    def m() -> str:
        return f",metrics_port={next(m_it)}" if metrics else ""

    def mline() -> str:
        return f"metrics_port={next(m_it)}\n" if metrics else ""

    ns = "".join(
        f"[[namesrv]]\nhost='127.0.0.1'\nport={next(it)}\n{mline()}" for _ in range(namesrvs)
    )
    grp = ""
    for g in groups:
        nodes = ",".join(
            f"{{id='n{i}',host='127.0.0.1',port={next(it)},raft_port={next(it)}{m()}}}"
            for i in range(nodes_per_group)
        )
        grp += f"[[group]]\nname='{g}'\nnodes=[{nodes}]\n"
    ctl = "".join(
        f"[[controller]]\nid='c{i}'\nhost='127.0.0.1'\nport={next(it)}\nraft_port={next(it)}\n"
        f"{mline()}"
        for i in range(controllers)
    )
    px = "".join(f"[[proxy]]\nhost='127.0.0.1'\nport={next(it)}\n" for _ in range(proxies))
    return f"[cluster]\nname='{name}'\ndata_dir='{data_dir}'\n{ns}{grp}{ctl}{px}{extra}"


def load(path: Path) -> ClusterSpec:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read the cluster description {path}: {exc}") from exc
    return parse(text, source=str(path))
