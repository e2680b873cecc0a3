"""The dashboard's pages: each a function of the request and the SDK's `Admin` (never a server's
internals) returning an HTML document. `Dashboard.handle` routes a request and turns a typed
raftmq error into a page that says what went wrong (never a traceback).

Read-only unless `allow_actions`: then create or update a topic, reset offsets, resend a dead
letter, change broker settings live and grant or remove ACL entries are offered as forms. Every
action takes two POSTs: the first shows what will happen (for a reset, the plan of
`Admin.plan_offset_reset`, the CLI's --dry-run; for broker settings, every node's dry run) and a
Confirm button; only the second, carrying confirm=yes, changes anything. Each POST must carry a
CSRF token (this process's random token; with a login, one bound to the user's sign-in), so a
page of another site cannot post.

With `login` (issue 27, on when the cluster has authentication): every page but /login and
/healthz asks a signed-in user (ops/dashboard/login.py: the cluster's ACL users; a super user is
an admin, any other user reads only), and only an admin's POST acts.

Other pages plug in with `register_page` (the per-minute reports and the alerts of issue 18 will:
they add a nav entry and a handler, nothing here changes): a module named in PLUGIN_MODULES
registers its pages when imported, and is imported when it exists. `html.bar_chart` draws
per-minute counts as inline SVG (no script)."""

from __future__ import annotations

import contextvars
import hmac
import importlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

import grpc

from raftmq.client.admin import Admin, ConsumerMemberInfo
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offset_reset import ResetTarget, ResetTo
from raftmq.client.rebalance import AllocationStrategy, allocate_all
from raftmq.client.stats_report import parse_duration_ms
from raftmq.common.acl import Acl, User, parse_entries
from raftmq.common.errors import Fault, InvalidArgumentError, RaftMQError, row_for
from raftmq.common.message import is_system_topic
from raftmq.common.pb import common_pb2
from raftmq.common.retry import reconsume_times
from raftmq.common.types import QueueRef
from raftmq.ops.dashboard.html import Cell, Raw, esc, fmt_ms, form, link, page, span, table
from raftmq.ops.dashboard.login import COOKIE, Role, Session, Sessions, authenticate

log = logging.getLogger("raftmq.dashboard")

BODY_PREVIEW_BYTES = 4096  # a body is shown up to this much; the rest is counted, not sent
LIST_BODY_CHARS = 80
MAX_QUERY_MESSAGES = 200  # one lookup by key or time shows at most this many
CHART_REFRESH_S = 5  # the charts fetch their figures again this often (the stats flush every 5 s)
CLUSTER_CHART_REFRESH_S = 10  # the cluster's chart asks every node per topic: less often
MAX_CHART_TOPICS = 8  # topics drawn on the cluster page (a lookup per topic and node each time)
MAX_LAG_LOOKUPS = 64  # (group, topic) lags computed for one groups page; the rest: follow a link
ROLE_NAMES = {common_pb2.LEADER: "leader", common_pb2.FOLLOWER: "follower"}


@dataclass(frozen=True, slots=True)
class Request:
    method: str  # GET or POST
    path: str
    query: Mapping[str, str] = field(default_factory=dict)  # the URL's, or the POSTed form
    cookies: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: str
    content_type: str = "text/html; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()  # Set-Cookie, Location


@dataclass(frozen=True, slots=True)
class Login:
    """Sign-in against the cluster's users: `acl()` fetches them (the controllers' snapshot),
    `admin` is the description's admin user (not in the ACL); `secure` marks the cookie for
    HTTPS only."""

    acl: Callable[[], Acl]
    admin: User | None = None
    sessions: Sessions = field(default_factory=Sessions)
    secure: bool = False


# The CSRF token of the request a worker thread is answering (set by Dashboard.handle): the
# forms the pages build carry it without every page passing the request down.
_csrf: contextvars.ContextVar[str] = contextvars.ContextVar("dashboard_csrf", default="")
_role: contextvars.ContextVar[Role | None] = contextvars.ContextVar("dashboard_role", default=None)


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


Handler = Callable[["Dashboard", Request], list[Cell]]


@dataclass(frozen=True, slots=True)
class PageSpec:
    path: str
    title: str
    handler: Handler
    in_nav: bool = True


_PAGES: dict[str, PageSpec] = {}
# Modules that add pages (each calls register_page on import); a missing one is skipped.
PLUGIN_MODULES = ("raftmq.ops.dashboard.reports", "raftmq.ops.dashboard.alerts")


def load_plugins() -> list[str]:
    """Import the plugin modules that exist; the ones loaded. A plugin that exists but fails
    to import (a missing dependency of its own) raises: that is a bug, not an absent page."""
    loaded = []
    for name in PLUGIN_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        loaded.append(name)
    return loaded


def register_page(path: str, title: str, handler: Handler, *, in_nav: bool = True) -> None:
    """Add a page: `handler(dashboard, request)` returns the body parts (escaped strings or
    Raw markup); a typed raftmq error it raises becomes an error page."""
    _PAGES[path] = PageSpec(path, title, handler, in_nav)


def _arg(req: Request, name: str, *, required: bool = True) -> str:
    value = req.query.get(name, "").strip()
    if required and not value:
        raise InvalidArgumentError(f"{name} is required: fill it in the form")
    return value


def _int_arg(req: Request, name: str) -> int:
    text = _arg(req, name)
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(f"{name} must be a whole number, got {text!r}") from None


def http_status(exc: RaftMQError) -> int:
    """404 for what does not exist, 503 for the cluster's side (unavailable, no leader: try
    again), 400 for what the request got wrong."""
    if row_for(type(exc)).status is grpc.StatusCode.NOT_FOUND:
        return 404
    return 503 if exc.fault is Fault.SYSTEM else 400


class Dashboard:
    """Routes requests to pages; thread-safe (Admin is)."""

    def __init__(
        self,
        admin: Admin,
        *,
        allow_actions: bool = False,
        namesrv: str = "",
        token: str | None = None,
        login: Login | None = None,
    ) -> None:
        self.admin = admin
        self.allow_actions = allow_actions
        self.namesrv = namesrv
        self.token = token or secrets.token_urlsafe(24)
        self.login = login
        self.plugins = load_plugins()

    def nav(self) -> list[tuple[str, str]]:
        return [(p.path, p.title) for p in _PAGES.values() if p.in_nav]

    def handle(self, req: Request) -> Response:
        if req.path in ("/login", "/logout") and self.login is not None:
            return self._sign_in(req) if req.path == "/login" else self._sign_out()
        session = None
        if self.login is not None:
            session = self.login.sessions.check(req.cookies.get(COOKIE), _now_ms())
            if session is None:
                if req.method == "GET":
                    return _redirect(f"/login?next={quote(req.path)}")
                return self._error_page(401, "Sign in", "sign in first: your session ended", "")
            _csrf.set(self.login.sessions.csrf(session))
            _role.set(session.role)
        else:
            _csrf.set(self.token)
            _role.set(None)
        if req.path == "/api/tps" and req.method == "GET":
            return self._tps_json(req)
        spec = _PAGES.get(req.path)
        if spec is None:
            return self._error_page(404, "Not found", f"no page {req.path}", req.path)
        try:
            if req.method == "POST":
                self._check_post(req, session)
            elif req.method != "GET":
                raise HttpError(405, f"{req.method} is not served; use GET")
            body = spec.handler(self, req)
        except HttpError as exc:
            return self._error_page(exc.status, spec.title, exc.message, req.path)
        except RaftMQError as exc:
            status = http_status(exc)
            return self._error_page(status, spec.title, f"{exc.code}: {exc.message}", req.path)
        except Exception as exc:  # a bug of ours: one line on the page, the traceback logged
            log.exception("dashboard.internal_error path=%s", req.path)
            return self._error_page(
                500, spec.title, f"internal error: {type(exc).__name__}: {exc}", req.path
            )
        return Response(200, page(spec.title, self.nav(), req.path, body, _who(session)))

    @property
    def can_act(self) -> bool:
        """Offer the action forms on the page being built: actions allowed, and (with a
        login) the user is an admin."""
        if not self.allow_actions:
            return False
        return self.login is None or _role.get() is Role.ADMIN

    def _check_post(self, req: Request, session: Session | None) -> None:
        if not self.allow_actions:
            raise HttpError(
                403, "this dashboard is read-only; start it with --allow-actions to change things"
            )
        if session is not None and session.role is not Role.ADMIN:
            raise HttpError(
                403,
                f"{session.user} may only read here: actions are for admins (super users; "
                f"`raftmq acl user update {session.user} --type Super` makes one)",
            )
        if not hmac.compare_digest(req.query.get("token", "").encode(), _csrf.get().encode()):
            raise HttpError(403, "the form is stale or from elsewhere: reload the page")

    def _error_page(self, status: int, title: str, message: str, path: str) -> Response:
        body = [Raw(f'<div class="error" id="error">{esc(message)}</div>')]
        return Response(status, page(title, self.nav(), path, body))

    # -- the charts' data (issue 27): what static/charts.js draws and refreshes

    def _tps_json(self, req: Request) -> Response:
        """Messages per second produced to `topic`, per minute of the last `since` (15m): the
        figures of `raftmq stats topic`, as {labels, series: [{label, data}], unit}."""
        try:
            since = parse_duration_ms(req.query.get("since", "") or "15m")
            if req.query.get("topic"):
                topics = [_arg(req, "topic")]
            else:  # the cluster page: the first topics by name (each asks every node)
                topics = [t for t in self.admin.list_topics() if not is_system_topic(t)]
                topics = sorted(topics)[:MAX_CHART_TOPICS]
            reports = [self.admin.topic_stats(t, since) for t in topics]
        except RaftMQError as exc:
            body = json.dumps({"error": f"{exc.code}: {exc.message}"})
            return Response(http_status(exc), body, "application/json")
        starts = reports[0].minute_starts() if reports else []
        labels = [fmt_ms(m)[11:16] for m in starts]  # HH:MM
        series = [
            {"label": f"{t} (produced)", "data": [sum(c) / 60 for c in zip(*counts, strict=True)]}
            for t, r in zip(topics, reports, strict=True)
            if (counts := [s.counts for s in r.series])
        ]
        body = json.dumps({"labels": labels, "series": series, "unit": "messages/s"})
        return Response(200, body, "application/json")

    # -- sign-in (issue 27)

    def _sign_in(self, req: Request) -> Response:
        login = self.login
        assert login is not None
        target = req.query.get("next", "/")
        if not target.startswith("/") or target.startswith("//"):
            target = "/"  # only our own pages: never a redirect to another site
        message = ""
        if req.method == "POST":
            key, secret = req.query.get("access_key", ""), req.query.get("secret_key", "")
            try:
                role = authenticate(login.acl(), login.admin, key, secret)
            except RaftMQError as exc:
                return self._login_page(503, target, f"cannot read the users: {exc.message}")
            if role is not None:
                cookie = login.sessions.issue(key, role, _now_ms())
                attrs = (
                    f"Path=/; HttpOnly; SameSite=Strict; Max-Age={login.sessions.ttl_ms // 1000}"
                )
                if login.secure:
                    attrs += "; Secure"
                log.info("dashboard.sign_in user=%s role=%s", key, role.value)
                return _redirect(target, (("Set-Cookie", f"{COOKIE}={cookie}; {attrs}"),))
            log.info("dashboard.sign_in_refused user=%s", key[:64])
            message = "the access key or the secret key is wrong"
        return self._login_page(401 if message else 200, target, message)

    def _login_page(self, status: int, target: str, message: str) -> Response:
        body: list[Cell] = []
        if message:
            body.append(Raw(f'<div class="error" id="error">{esc(message)}</div>'))
        body.append(
            Raw(
                '<form class="box" method="post" action="/login" id="login">'
                f'<input type="hidden" name="next" value="{esc(target)}">'
                '<label>access key <input name="access_key" autocomplete="username"></label>'
                '<label>secret key <input name="secret_key" type="password" '
                'autocomplete="current-password"></label>'
                '<button type="submit">Sign in</button></form>'
                '<p class="muted">A user of the cluster (`raftmq acl user create`): a super user '
                "may act, any other user may read.</p>"
            )
        )
        return Response(status, page("Sign in", [], "/login", body))

    def _sign_out(self) -> Response:
        gone = f"{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
        return _redirect("/login", (("Set-Cookie", gone),))

    def action_form(
        self,
        action: str,
        fields: list[tuple[str, str, str]],
        button: str,
        hidden: Mapping[str, str] | None = None,
        form_id: str = "",
    ) -> Raw:
        return form(
            action,
            fields,
            method="post",
            button=button,
            hidden={"token": _csrf.get(), **(hidden or {})},
            form_id=form_id,
        )

    def confirm_form(self, action: str, values: Mapping[str, str], what: str) -> Raw:
        """The second step of an action: what will happen, and a Confirm button re-posting the
        same values with confirm=yes."""
        hidden = {"token": _csrf.get(), **values, "confirm": "yes"}
        return Raw(
            f'<div class="notice" id="confirm-box">{esc(what)}'
            + str(
                form(
                    action,
                    [],
                    method="post",
                    button="Confirm",
                    hidden=hidden,
                    form_id="confirm",
                    danger=True,
                )
            )
            + f'<a href="{esc(action)}">cancel</a></div>'
        )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _redirect(location: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(303, "", "text/plain; charset=utf-8", (("Location", location), *headers))


def _who(session: Session | None) -> str:
    return "" if session is None else f"{session.user} ({session.role.value})"


# ---- cluster -----------------------------------------------------------------------------------


def cluster_page(d: Dashboard, req: Request) -> list[Cell]:
    groups = d.admin.groups()
    out: list[Cell] = [Raw("<h2>Broker groups</h2>")]
    out.append(
        table(
            ("cluster", "broker group", "leader", "leader address", "term", "nodes"),
            (
                (
                    g.cluster,
                    g.broker_group,
                    span("leader", g.leader_node_id) if g.leader_node_id else span("bad", "none"),
                    g.leader_address,
                    g.term,
                    ", ".join(f"{n.node_id}={n.address}" for n in g.nodes),
                )
                for g in groups
            ),
            numeric=(4,),
            table_id="broker-groups",
        )
    )
    out.append(Raw("<h2>Broker nodes</h2>"))
    rows: list[tuple[Cell, ...]] = []
    for n in d.admin.broker_statuses():
        st = n.status
        if st is None:
            rows.append(
                (n.broker_group, n.node_id, n.address, span("bad", n.error), "", "", "", "")
            )
            continue
        role = ROLE_NAMES.get(st.role, "candidate")
        rows.append(
            (
                n.broker_group,
                n.node_id,
                n.address,
                span("leader", role) if role == "leader" else role,
                st.term,
                st.commit_index,
                st.applied_index,
                span("bad", st.storage_error) if st.storage_error else "ok",
            )
        )
    out.append(
        table(
            ("group", "node", "address", "role", "term", "commit", "applied", "storage"),
            rows,
            numeric=(4, 5, 6),
            table_id="broker-nodes",
        )
    )
    out.append(
        Raw(f"<h2>Messages per second, last 15 minutes (first {MAX_CHART_TOPICS} topics)</h2>")
    )
    out.append(tps_chart("/api/tps?since=15m", CLUSTER_CHART_REFRESH_S))
    if d.namesrv:
        out.append(Raw(f'<p class="muted">NameServers: {esc(d.namesrv)}</p>'))
    return out


# ---- broker settings (issue 27: mqadmin updateBrokerConfig from the console) -------------------


def broker_config_page(d: Dashboard, req: Request) -> list[Cell]:
    """Every node's settings as it runs with them (secrets redacted by the node), and for an
    admin the form that changes those that take effect without a restart."""
    statuses = d.admin.broker_statuses()
    nodes = [n for n in statuses if n.status is not None]
    out: list[Cell] = []
    if d.can_act:
        out += [
            Raw("<h2>Change settings live</h2>"),
            d.action_form(
                "/actions/broker-config",
                [
                    ("settings", "KEY=VALUE, several separated by spaces", ""),
                    ("groups", "broker groups, comma-separated (blank: all)", ""),
                ],
                "Check…",
                form_id="broker-config",
            ),
            span(
                "muted",
                "Only settings that take effect without a restart change (`raftmq broker "
                "config`); any other is refused with the reason, and then nothing changes. A "
                "node keeps a change until it restarts: set it in the cluster description too.",
            ),
        ]
    for n in statuses:
        if n.status is None:
            out.append(span("bad", f"{n.broker_group}/{n.node_id} did not answer: {n.error}"))
    keys = sorted({k for n in nodes if n.status is not None for k in n.status.config})
    out.append(Raw(f"<h2>Settings of {len(nodes)} nodes</h2>"))
    out.append(
        table(
            ("setting", *(f"{n.broker_group}/{n.node_id}" for n in nodes)),
            (
                (k, *(n.status.config.get(k, "") if n.status is not None else "" for n in nodes))
                for k in keys
            ),
            table_id="broker-settings",
        )
    )
    return out


def broker_config_action(d: Dashboard, req: Request) -> list[Cell]:
    """`raftmq broker config KEY=VALUE` from the console: the first POST asks every node with
    dry_run (what would change, or why a key is refused: then no Confirm is offered), the
    second changes it."""
    from raftmq.ops.cli_admin import parse_settings  # the CLI's reading of KEY=VALUE

    _needs_post(d, req)
    text, groups_text = _arg(req, "settings"), req.query.get("groups", "").strip()
    changes = parse_settings(text.split())
    groups = [g.strip() for g in groups_text.split(",") if g.strip()] or None
    confirmed = _confirmed(req)
    nodes = d.admin.update_broker_config(changes, groups, dry_run=not confirmed)
    rows: list[tuple[Cell, ...]] = []
    for n in nodes:
        node = f"{n.broker_group}/{n.node_id}"
        if n.error:
            rows.append((node, "", "", span("bad", n.error)))
        rows += [(node, k, v, "") for k, v in sorted(n.applied.items())]
        rows += [(node, k, changes.get(k, ""), span("bad", why)) for k, why in n.refused.items()]
    result = table(("node", "setting", "value", "refused because"), rows, table_id="config-plan")
    where = groups_text or "every broker group"
    if any(n.refused or n.error for n in nodes):
        head: Cell = Raw(
            '<div class="error" id="refused">Refused: nothing changes on a node that refuses a '
            "setting. Settings read only at start need the cluster description and a restart."
            "</div>"
        )
    elif confirmed:
        log.warning("dashboard.broker_config settings=%s groups=%s", text, where)
        head = Raw(
            f'<div class="notice" id="done">{esc(text)} set on {esc(where)} until each node '
            "restarts (set it in the cluster description to keep it)</div>"
        )
    else:
        head = d.confirm_form(
            "/actions/broker-config",
            {"settings": text, "groups": groups_text},
            f"Set {text} on {where}? Each node below checked it:",
        )
    return [head, result, link("/broker-config", "broker settings")]


# ---- topics ------------------------------------------------------------------------------------


def topics_page(d: Dashboard, req: Request) -> list[Cell]:
    topics = d.admin.list_topics()
    out: list[Cell] = []
    if d.can_act:
        out.append(
            d.action_form(
                "/actions/create-topic",
                [("topic", "new topic", ""), ("queues", "queues per group", "8")],
                "Create topic…",
                form_id="create-topic",
            )
        )
    rows = []
    for name, per_group in topics.items():
        rows.append(
            (
                link("/topic", name, name=name),
                ", ".join(g for g, _ in per_group),
                ", ".join(str(c.read_queue_nums) for _, c in per_group),
                "yes" if any(c.ordered for _, c in per_group) else "",
            )
        )
    out.append(table(("topic", "broker groups", "queues", "ordered"), rows, table_id="topics"))
    return out


def topic_page(d: Dashboard, req: Request) -> list[Cell]:
    name = _arg(req, "name")
    queues = d.admin.topic_status(name)
    total = sum(q.max_offset - q.min_offset for q in queues)
    return [
        Raw(f"<h2>Topic {esc(name)}</h2>"),
        table(
            ("broker group", "queue", "min offset", "max offset", "messages", "last stored"),
            (
                (
                    q.queue.broker_group,
                    q.queue.queue_id,
                    q.min_offset,
                    q.max_offset,
                    q.max_offset - q.min_offset,
                    fmt_ms(q.last_store_timestamp_ms),
                )
                for q in queues
            ),
            numeric=(1, 2, 3, 4),
            total=("total", "", "", "", total, ""),
            table_id="queues",
        ),
        link("/messages", "find messages of this topic by time", topic=name, since="-1h"),
        Raw("<h2>Messages per second, last 15 minutes</h2>"),
        tps_chart(f"/api/tps?topic={quote(name)}&since=15m"),
        *_topic_config_form(d, name),
    ]


def _topic_config_form(d: Dashboard, name: str) -> list[Cell]:
    """The topic's configuration, editable by an admin (`raftmq topic update`)."""
    from raftmq.ops.cli_data import PERMS  # the CLI's names of the permissions

    per_group = d.admin.list_topics().get(name, [])
    if not per_group or not d.can_act:
        return []
    _, cfg = per_group[0]
    perm = next((k for k, v in PERMS.items() if v == cfg.perm), "rw")
    return [
        Raw("<h2>Configuration</h2>"),
        d.action_form(
            "/actions/update-topic",
            [
                ("queues", "queues per group", str(cfg.read_queue_nums)),
                ("perm", "permission: rw, r, w or none", perm),
                ("ordered", "ordered: yes or no", "yes" if cfg.ordered else "no"),
            ],
            "Update topic…",
            hidden={"topic": name},
            form_id="update-topic",
        ),
    ]


def update_topic_action(d: Dashboard, req: Request) -> list[Cell]:
    """`raftmq topic update` from the topic page: queues, permission, ordered; fewer queues
    than now is refused while they hold unconsumed messages (Admin.update_topic says which)."""
    from raftmq.ops.cli_data import PERMS

    _needs_post(d, req)
    topic, queues, perm = _arg(req, "topic"), _int_arg(req, "queues"), _arg(req, "perm")
    ordered = _arg(req, "ordered").lower()
    if perm not in PERMS:
        raise InvalidArgumentError(f"permission {perm!r}: give one of {', '.join(PERMS)}")
    if ordered not in ("yes", "no"):
        raise InvalidArgumentError(f"ordered {ordered!r}: give yes or no")
    values = {"topic": topic, "queues": str(queues), "perm": perm, "ordered": ordered}
    what = f"{queues} queues, permission {perm}, {'ordered' if ordered == 'yes' else 'not ordered'}"
    if not _confirmed(req):
        return [d.confirm_form("/actions/update-topic", values, f"Set {topic} to {what}?")]
    done = d.admin.update_topic(topic, queues=queues, perm=PERMS[perm], ordered=ordered == "yes")
    return [
        Raw(
            f'<div class="notice" id="done">{esc(topic)}: {esc(what)} on '
            f"{esc(', '.join(done))}</div>"
        ),
        link("/topic", f"topic {topic}", name=topic),
    ]


def tps_chart(src: str, refresh_s: int = CHART_REFRESH_S) -> Raw:
    """A chart drawn by the vendored Chart.js (static/) from `src`'s JSON, fetched again every
    `refresh_s`: the pages allow no inline script, so the drawing is static/charts.js's."""
    return Raw(
        f'<canvas id="tps" width="900" height="260" data-chart-src="{esc(src)}" '
        f'data-refresh-s="{refresh_s}"></canvas>'
        '<script src="/static/chart.umd.min.js"></script>'
        '<script src="/static/charts.js"></script>'
    )


# ---- consumer groups ---------------------------------------------------------------------------


def groups_page(d: Dashboard, req: Request) -> list[Cell]:
    rows = []
    lookups = 0
    for g in d.admin.consumer_groups():
        for t in g.topics or ("",):
            lag: Cell = ""
            if t and not t.startswith("%"):  # %RETRY% / %DLQ%: the group's own system topics
                if lookups < MAX_LAG_LOOKUPS:
                    lag = sum(q.lag for q in d.admin.group_lag(g.group, t))
                else:
                    lag = span("muted", "open the group")
                lookups += 1
            rows.append(
                (
                    g.group,
                    link("/group", t, name=g.group, topic=t) if t else "",
                    lag,
                    len(g.members),
                    ", ".join(m.client_id for m in g.members) or span("muted", "none online"),
                    link("/dlq", "dead letters", group=g.group),
                )
            )
    return [
        table(
            ("group", "topic", "lag", "members", "clients", ""),
            rows,
            numeric=(2, 3),
            table_id="groups",
        )
    ]


def queue_holders(queues: list[QueueRef], members: list[str]) -> dict[QueueRef, str]:
    """Which member consumes each queue under the SDK's default allocation (AVERAGELY, as
    RocketMQ's): the rebalance is the clients' own computation, so the dashboard repeats it
    from the members the brokers know (a group configured otherwise is told so on the page)."""
    owners = allocate_all(AllocationStrategy.AVERAGELY, queues, members)
    return {q: member for member, qs in owners.items() for q in qs}


def group_page(d: Dashboard, req: Request) -> list[Cell]:
    group, topic = _arg(req, "name"), _arg(req, "topic")
    lags = d.admin.group_lag(group, topic)
    total = sum(q.lag for q in lags)
    info = next((g for g in d.admin.consumer_groups() if g.group == group), None)
    members = info.members if info is not None else ()
    online = [m.client_id for m in members if topic in m.topics]
    holders = queue_holders([q.queue for q in lags], online)
    config = esc(info.config_text() if info is not None else "default")
    out: list[Cell] = [
        Raw(f"<h2>Group {esc(group)} on {esc(topic)}</h2>"),
        Raw(f'<p>config (`raftmq group config`): <span id="group-config">{config}</span></p>'),
        table(
            ("queue", "broker offset", "consumer offset", "min offset", "lag", "held by"),
            (
                (
                    str(q.queue),
                    q.max_offset,
                    "-" if q.committed is None else q.committed,
                    q.min_offset,
                    q.lag,
                    holders.get(q.queue) or span("muted", "nobody online"),
                )
                for q in lags
            ),
            numeric=(1, 2, 3, 4),
            total=("total", "", "", "", Raw(f'<span id="total-lag">{total}</span>'), ""),
            table_id="lag",
        ),
        Raw(
            '<p class="muted">held by: the allocation of the default strategy (AVERAGELY) over '
            "the members online; a group set to another strategy splits the queues its way.</p>"
        ),
        Raw("<h2>Members</h2>"),
        _members_table(group, members, "members"),
    ]
    if d.can_act:
        out.append(Raw("<h2>Reset offsets</h2>"))
        out.append(
            d.action_form(
                "/actions/reset-offsets",
                [("to", "to: earliest, latest, offset:N, shift:N or time:T", "latest")],
                "Plan reset…",
                hidden={"group": group, "topic": topic},
                form_id="reset-offsets",
            )
        )
    return out


def _members_table(group: str, members: Sequence[ConsumerMemberInfo], table_id: str) -> Raw:
    return table(
        ("group", "client", "subscriptions", "connected to broker groups"),
        (
            (
                link("/group", group, name=group, topic=shown[0]) if shown else group,
                m.client_id,
                ", ".join(m.topics),
                ", ".join(m.broker_groups),
            )
            for m in members
            for shown in ([t for t in m.topics if not t.startswith("%")],)  # not %RETRY%
        ),
        table_id=table_id,
    )


def connections_page(d: Dashboard, req: Request) -> list[Cell]:
    """Every consumer client the brokers hear from now (heartbeats): its group, what it
    subscribes to and which broker groups it is connected to."""
    groups = d.admin.consumer_groups()
    clients = [(g.group, m) for g in groups for m in g.members]
    out: list[Cell] = [Raw(f"<h2>{len(clients)} consumer clients online</h2>")]
    rows = [(g, m.client_id, ", ".join(m.topics), ", ".join(m.broker_groups)) for g, m in clients]
    out.append(
        table(("group", "client", "subscriptions", "broker groups"), rows, table_id="connections")
    )
    subs: dict[tuple[str, str], int] = {}
    for g, m in clients:
        for t in m.topics:
            subs[(t, g)] = subs.get((t, g), 0) + 1
    out.append(Raw("<h2>Subscriptions</h2>"))
    out.append(
        table(
            ("topic", "group", "clients"),
            ((link("/group", t, name=g, topic=t), g, n) for (t, g), n in sorted(subs.items())),
            numeric=(2,),
            table_id="subscriptions",
        )
    )
    return out


# ---- messages ----------------------------------------------------------------------------------


def _body_text(body: bytes, limit: int) -> str:
    text = body[:limit].decode("utf-8", "replace")
    return text + (f" … ({len(body)} bytes)" if len(body) > limit else "")


def _message_rows(msgs: list[ReceivedMessage]) -> Raw:
    return table(
        ("msg id", "topic", "queue", "offset", "tags", "keys", "stored", "body"),
        (
            (
                link("/message", m.msg_id, id=m.msg_id),
                m.topic,
                f"{m.broker_group}#{m.queue_id}",
                m.queue_offset,
                m.tags,
                ", ".join(m.keys),
                fmt_ms(m.store_timestamp_ms),
                _body_text(m.body, LIST_BODY_CHARS),
            )
            for m in msgs
        ),
        numeric=(3,),
        table_id="messages",
    )


def messages_page(d: Dashboard, req: Request) -> list[Cell]:
    from raftmq.ops.cli_data import parse_time_ms  # ms, ISO or -10m, as the CLI takes them

    q = req.query
    out: list[Cell] = [
        Raw("<h2>By id</h2>"),
        form("/message", [("id", "message id", q.get("id", ""))], button="Find", form_id="by-id"),
        Raw("<h2>By key</h2>"),
        form(
            "/messages",
            [("topic", "topic", q.get("topic", "")), ("key", "key", q.get("key", ""))],
            button="Find",
            form_id="by-key",
        ),
        Raw("<h2>By store time</h2>"),
        form(
            "/messages",
            [
                ("topic", "topic", q.get("topic", "")),
                ("since", "from (ms, ISO time or -10m)", q.get("since", "")),
                ("until", "to (empty: now)", q.get("until", "")),
            ],
            button="Find",
            form_id="by-time",
        ),
    ]
    topic = q.get("topic", "").strip()
    if topic and q.get("key", "").strip():
        found = d.admin.messages_by_key(topic, q["key"].strip(), max_count=MAX_QUERY_MESSAGES)
        out += [
            Raw(f"<h2>{len(found)} with key {esc(q['key'].strip())}</h2>"),
            _message_rows(found),
        ]
    elif topic and q.get("since", "").strip():
        begin = parse_time_ms(q["since"])
        until = q.get("until", "").strip()
        end = parse_time_ms(until) if until else _now_ms()
        page_ = d.admin.messages_by_time(
            topic, begin, end, page_size=64, page_token=q.get("page", "")
        )
        out += [Raw(f"<h2>Stored {esc(fmt_ms(begin))} to {esc(fmt_ms(end))}</h2>")]
        out.append(_message_rows(page_.messages))
        if page_.next_page_token:
            out.append(
                link(
                    "/messages",
                    "next page",
                    topic=topic,
                    since=str(begin),
                    until=str(end),
                    page=page_.next_page_token,
                )
            )
    return out


def message_page(d: Dashboard, req: Request) -> list[Cell]:
    m = d.admin.message_by_id(_arg(req, "id"))
    fields: list[tuple[str, Cell]] = [
        ("msg id", m.msg_id),
        ("topic", link("/topic", m.topic, name=m.topic)),
        ("queue", f"{m.broker_group}#{m.queue_id}"),
        ("offset", m.queue_offset),
        ("tags", m.tags),
        ("keys", ", ".join(m.keys)),
        ("stored", fmt_ms(m.store_timestamp_ms)),
        ("born", f"{fmt_ms(m.born_timestamp_ms)} at {m.born_host}"),
        ("reconsume times", m.reconsume_times),
        ("body size", f"{len(m.body)} bytes"),
    ]
    fields += [(f"property {k}", v) for k, v in sorted(m.properties.items())]
    return [
        table(("field", "value"), fields, table_id="message"),
        Raw("<h2>Body</h2>"),
        Raw(f'<pre id="body">{esc(_body_text(m.body, BODY_PREVIEW_BYTES))}</pre>'),
        link("/trace", "trace of this message", id=m.msg_id),
    ]


def trace_page(d: Dashboard, req: Request) -> list[Cell]:
    msg_id = _arg(req, "id")
    steps = d.admin.message_trace(msg_id).steps()
    return [
        Raw(f"<h2>Path of {esc(msg_id)}</h2>"),
        table(
            ("time", "step", "msg id", "where", "who", "status", "cost ms", "detail"),
            (
                (
                    fmt_ms(s.timestamp_ms),
                    s.step,
                    link("/message", s.msg_id, id=s.msg_id),
                    s.where,
                    s.who,
                    s.status,
                    s.cost_ms,
                    s.detail,
                )
                for s in steps
            ),
            numeric=(6,),
            table_id="trace",
        ),
    ]


# ---- dead letters ------------------------------------------------------------------------------


def dlq_page(d: Dashboard, req: Request) -> list[Cell]:
    group = req.query.get("group", "").strip()
    out: list[Cell] = [form("/dlq", [("group", "consumer group", group)], form_id="dlq-group")]
    if not group:
        return out
    letters = d.admin.dead_letters(group, max_count=MAX_QUERY_MESSAGES, timeout_ms=5_000)
    rows = []
    for m in letters:
        resend: Cell = ""
        if d.can_act:
            resend = d.action_form("/actions/resend", [], "Resend…", hidden={"id": m.msg_id})
        rows.append(
            (
                link("/message", m.msg_id, id=m.msg_id),
                m.properties.get("DLQ_ORIGIN_TOPIC", ""),
                m.properties.get("DLQ_ORIGIN_MESSAGE_ID", ""),
                # the failures the dead letter carries (its RECONSUME_TIME), as `raftmq dlq list`
                # shows them; the stored field counts this copy's deliveries: 0 (issue 27)
                reconsume_times(m.properties),
                fmt_ms(m.store_timestamp_ms),
                _body_text(m.body, LIST_BODY_CHARS),
                resend,
            )
        )
    out.append(Raw(f"<h2>{len(letters)} dead letters of {esc(group)}</h2>"))
    out.append(
        table(
            ("msg id", "origin topic", "origin msg id", "reconsumed", "stored", "body", ""),
            rows,
            numeric=(3,),
            table_id="dead-letters",
        )
    )
    return out


# ---- actions (only with allow_actions; two POSTs each) -----------------------------------------


def _confirmed(req: Request) -> bool:
    return req.method == "POST" and req.query.get("confirm") == "yes"


def _needs_post(d: Dashboard, req: Request) -> None:
    if not d.allow_actions:
        raise HttpError(
            403, "this dashboard is read-only; start it with --allow-actions to change things"
        )
    if req.method != "POST":
        raise HttpError(405, "actions are started from their forms (POST)")


def create_topic_action(d: Dashboard, req: Request) -> list[Cell]:
    _needs_post(d, req)
    topic, queues = _arg(req, "topic"), _int_arg(req, "queues")
    if not _confirmed(req):
        return [
            d.confirm_form(
                "/actions/create-topic",
                {"topic": topic, "queues": str(queues)},
                f"Create topic {topic} with {queues} queues on every broker group?",
            )
        ]
    done = d.admin.create_topic(topic, queues=queues)
    return [
        Raw(f'<div class="notice" id="done">created {esc(topic)} on {esc(", ".join(done))}</div>'),
        link("/topic", f"topic {topic}", name=topic),
    ]


# ---- users and policies (issue 27): the ACL the sign-in is checked against -------------------


def acl_page(d: Dashboard, req: Request) -> list[Cell]:
    if d.login is None:
        return [
            span(
                "muted",
                "authentication is off: the cluster has no users or policies "
                "([security.auth] in the cluster description turns it on)",
            )
        ]
    acl = d.login.acl()
    rows = []
    for name, user in sorted(acl.users.items()):
        entries = acl.policies.get(name, ())
        rows.append(
            (
                name,
                "admin (super user)" if user.type.value == "Super" else "read-only",
                "; ".join(f"{e.decision.value} {e.spec}" for e in entries)
                or span("muted", "no policy: every request denied"),
            )
        )
    out: list[Cell] = [
        Raw(f"<h2>{len(rows)} users (ACL version {acl.version})</h2>"),
        table(("user", "dashboard role", "policy"), rows, table_id="acl-users"),
    ]
    if d.can_act:
        out.append(Raw("<h2>Entries</h2>"))
        out.append(
            table(
                ("user", "decision", "entry", ""),
                (
                    (
                        name,
                        e.decision.value,
                        e.spec,
                        d.action_form(
                            "/actions/acl-remove",
                            [],
                            "Remove…",
                            hidden={"user": name, "entry": e.spec, "decision": e.decision.value},
                        ),
                    )
                    for name, entries in sorted(acl.policies.items())
                    for e in entries
                ),
                table_id="acl-entries",
            )
        )
        out.append(Raw("<h2>Delete a user</h2>"))
        out.append(
            d.action_form(
                "/actions/acl-delete-user", [("user", "user", "")], "Delete…", form_id="acl-delete"
            )
        )
        out.append(Raw("<h2>Grant</h2>"))
        out.append(
            d.action_form(
                "/actions/acl-grant",
                [("user", "user", ""), ("entry", "RESOURCE=ACTIONS, e.g. Topic:orders*=Pub", "")],
                "Grant…",
                form_id="acl-grant",
            )
        )
    return out


def acl_grant_action(d: Dashboard, req: Request) -> list[Cell]:
    """`raftmq acl policy add USER ENTRY` from the dashboard: an Allow added to the user's policy,
    the rest kept (a read, then a write: see AclAdmin.add_to_policy)."""
    _needs_post(d, req)
    user, entry = _arg(req, "user"), _arg(req, "entry")
    entries = parse_entries([entry])
    if not _confirmed(req):
        return [
            d.confirm_form(
                "/actions/acl-grant",
                {"user": user, "entry": entry},
                f"Allow {entries[0].spec} to {user} (its other entries are kept)?",
            )
        ]
    version, written = d.admin.acl.add_to_policy(user, add=entries)
    policy = "; ".join(f"{e.decision.value} {e.spec}" for e in written)
    return [
        Raw(
            f'<div class="notice" id="done">{esc(user)}: {esc(policy)} '
            f"(ACL version {version}; every node has it within its refresh interval)</div>"
        ),
        link("/acl", "users and policies"),
    ]


def acl_remove_action(d: Dashboard, req: Request) -> list[Cell]:
    """`raftmq acl policy remove USER ENTRY` from the dashboard: one entry taken out of the
    user's policy, the others kept (AclAdmin.add_to_policy with remove)."""
    _needs_post(d, req)
    user, entry, decision = _arg(req, "user"), _arg(req, "entry"), _arg(req, "decision")
    entries = parse_entries([entry], decision)
    if not _confirmed(req):
        return [
            d.confirm_form(
                "/actions/acl-remove",
                {"user": user, "entry": entry, "decision": decision},
                f"Remove {decision} {entries[0].spec} from {user}'s policy (its other entries "
                "are kept)?",
            )
        ]
    before = {e for e in d.admin.acl.policies().get(user, ())}
    if entries[0] not in before:
        raise InvalidArgumentError(
            f"{user}'s policy has no entry {decision} {entries[0].spec} (any more): reload /acl"
        )
    version, written = d.admin.acl.add_to_policy(user, remove=entries)
    policy = "; ".join(f"{e.decision.value} {e.spec}" for e in written) or "no entry left"
    log.warning("dashboard.acl_remove user=%s entry=%s", user, entries[0].spec)
    return [
        Raw(
            f'<div class="notice" id="done">{esc(user)}: {esc(policy)} (ACL version '
            f"{version}; every node has it within its refresh interval)</div>"
        ),
        link("/acl", "users and policies"),
    ]


def acl_delete_user_action(d: Dashboard, req: Request) -> list[Cell]:
    """`raftmq acl user delete USER`: the user and its policy go."""
    _needs_post(d, req)
    user = _arg(req, "user")
    if d.login is not None and user not in d.login.acl().users:
        raise InvalidArgumentError(f"no user {user!r} (the users are listed on /acl)")
    if not _confirmed(req):
        return [
            d.confirm_form(
                "/actions/acl-delete-user",
                {"user": user},
                f"Delete user {user} and its policy? Its clients are refused from then on.",
            )
        ]
    version = d.admin.acl.delete_user(user)
    log.warning("dashboard.acl_delete_user user=%s", user)
    return [
        Raw(
            f'<div class="notice" id="done">user {esc(user)} deleted with its policy (ACL '
            f"version {version})</div>"
        ),
        link("/acl", "users and policies"),
    ]


def parse_reset_target(text: str) -> ResetTarget:
    """The form's `to`: earliest, latest, offset:N, shift:N or time:T (T as the CLI takes it)."""
    from raftmq.ops.cli_data import parse_time_ms

    kind, _, value = text.strip().partition(":")
    kind = kind.lower()
    if kind in ("earliest", "latest") and not value:
        return ResetTarget(ResetTo.EARLIEST if kind == "earliest" else ResetTo.LATEST)
    try:
        if kind == "offset":
            return ResetTarget(ResetTo.OFFSET, int(value))
        if kind == "shift":
            return ResetTarget(ResetTo.SHIFT, int(value))
    except ValueError:
        pass
    else:
        if kind == "time" and value:
            return ResetTarget(ResetTo.TIME, parse_time_ms(value))
    raise InvalidArgumentError(
        f"reset target {text!r}: give earliest, latest, offset:N, shift:N or time:T "
        "(T in ms, an ISO time or -10m)"
    )


def reset_offsets_action(d: Dashboard, req: Request) -> list[Cell]:
    _needs_post(d, req)
    group, topic, to = _arg(req, "group"), _arg(req, "topic"), _arg(req, "to")
    target = parse_reset_target(to)
    if _confirmed(req):
        rows = d.admin.reset_offsets(group, topic, target)
        head = Raw(f'<div class="notice" id="done">group {esc(group)} reset on {esc(topic)}</div>')
    else:
        rows = d.admin.plan_offset_reset(group, topic, target)
        head = d.confirm_form(
            "/actions/reset-offsets",
            {"group": group, "topic": topic, "to": to},
            f"Reset group {group} on {topic} to {target.describe()}? The plan:",
        )
    return [
        head,
        table(
            ("queue", "min", "max", "current", "new", "change"),
            (
                (
                    str(r.queue),
                    r.min_offset,
                    r.max_offset,
                    "-" if r.current is None else r.current,
                    r.new,
                    "-" if r.change is None else f"{r.change:+d}",
                )
                for r in rows
            ),
            numeric=(1, 2, 3, 4, 5),
            table_id="reset-plan",
        ),
        link("/group", "back to the group", name=group, topic=topic),
    ]


def resend_action(d: Dashboard, req: Request) -> list[Cell]:
    _needs_post(d, req)
    msg_id = _arg(req, "id")
    if not _confirmed(req):
        return [
            d.confirm_form(
                "/actions/resend",
                {"id": msg_id},
                f"Resend dead letter {msg_id} to its original topic as a fresh message?",
            )
        ]
    sent = d.admin.resend_dead_letter(msg_id)
    return [
        Raw(
            f'<div class="notice" id="done">resent to {esc(sent.topic)} as '
            f"{esc(link('/message', sent.msg_id, id=sent.msg_id))}</div>"
        )
    ]


register_page("/", "Cluster", cluster_page)
register_page("/topics", "Topics", topics_page)
register_page("/topic", "Topic", topic_page, in_nav=False)
register_page("/groups", "Consumer groups", groups_page)
register_page("/group", "Consumer group", group_page, in_nav=False)
register_page("/connections", "Connections", connections_page)
register_page("/messages", "Messages", messages_page)
register_page("/message", "Message", message_page, in_nav=False)
register_page("/trace", "Trace", trace_page, in_nav=False)
register_page("/dlq", "Dead letters", dlq_page)
register_page("/actions/create-topic", "Create topic", create_topic_action, in_nav=False)
register_page("/actions/reset-offsets", "Reset offsets", reset_offsets_action, in_nav=False)
register_page("/actions/resend", "Resend dead letter", resend_action, in_nav=False)
register_page("/actions/update-topic", "Update topic", update_topic_action, in_nav=False)
register_page("/acl", "Users", acl_page)
register_page("/actions/acl-grant", "Grant", acl_grant_action, in_nav=False)
register_page("/actions/acl-remove", "Remove", acl_remove_action, in_nav=False)
register_page("/actions/acl-delete-user", "Delete user", acl_delete_user_action, in_nav=False)
register_page("/broker-config", "Broker settings", broker_config_page)
register_page("/actions/broker-config", "Broker settings", broker_config_action, in_nav=False)
