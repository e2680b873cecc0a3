"""TLS and auth together, as deploy/secure.toml runs them: a NameServer, a controller and a broker
group as processes with [security.tls] (mutual TLS) and [security.auth] both on. The ACL reaches
the NameServer and the brokers over the TLS channels of their AclSync; a user with a policy
sends and consumes over TLS with signed requests (gRPC and the framed data path's signed HELLO
inside TLS); what its policy does not allow is ACCESS_DENIED; a plaintext client holding valid
credentials is refused before any signature is looked at."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.common import tls
from raftmq.common.acl import parse_entries
from raftmq.common.auth import Credentials
from raftmq.common.errors import AccessDeniedError, RaftMQError
from raftmq.common.types import QueueRef
from raftmq.ops.certs import CertRequest, write_certs
from raftmq.ops.cli_cluster import security_warning
from raftmq.ops.cluster_runner import ClusterRunner
from raftmq.ops.cluster_spec import ClusterSpec, local_description, parse
from tests.harness.procs import free_ports, wait_until

ADMIN = Credentials("ops-admin", "ops-admin-secret")
ALICE = Credentials("alice", "alice-secret")  # Pub and Sub on orders*, Sub on group billing
BOB = Credentials("bob", "bob-secret")  # Pub on orders* only: may not consume


SCRAPER = ("prometheus", "scrape-secret")  # the proxy's /metrics asks it (issue 27)


def make_spec(tmp: Path) -> ClusterSpec:
    certs = tmp / "certs"
    [*ports, metrics_port] = free_ports(1 + 3 * 2 + 2 + 1 + 1)
    extra = (
        "[settings.broker]\nheartbeat_interval_ms=1000\n"
        # the proxy's /metrics: server-only TLS (a Prometheus without a client certificate)
        # and basic auth, as the brokers' metrics ports may have them
        f"[settings.proxy]\nmetrics_listen='127.0.0.1:{metrics_port}'\n"
        f"metrics_tls='server-only'\nmetrics_basic_auth_user='{SCRAPER[0]}'\n"
        f"metrics_basic_auth_password='{SCRAPER[1]}'\n"
        f"[security.tls]\nenabled=true\ndir='{certs}'\nrequire_client_cert=true\n"
        # the proxy's port: server-only TLS, for the official RocketMQ 5 clients (issue 27)
        "proxy_require_client_cert=false\n"
        "[security.auth]\nenabled=true\n"
        f"admin_access_key='{ADMIN.access_key}'\nadmin_secret_key='{ADMIN.secret_key}'\n"
        "refresh_ms=300\n"
    )
    # one NameServer, one group of three (gRPC + Raft), one controller (gRPC + Raft), a proxy
    text = local_description(
        ports, tmp / "data", name="Secure", namesrvs=1, controllers=1,
        proxies=1, extra=extra,
    )  # fmt: skip
    spec = parse(text)
    write_certs(certs, [CertRequest(n, ("127.0.0.1",)) for n in spec.tls_names()], days=2)
    return spec


def tls_args(spec: ClusterSpec) -> dict[str, str]:
    assert spec.tls is not None
    return {
        "tls_ca": str(spec.tls.ca),
        "tls_cert": str(spec.tls.cert("client")),
        "tls_key": str(spec.tls.key("client")),
    }


@pytest.fixture(autouse=True)
def no_installed_tls() -> Iterator[None]:
    yield
    tls.uninstall()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSpec]:
    spec = make_spec(tmp_path_factory.mktemp("secure"))
    assert security_warning(spec) is None, "TLS and auth on: the cluster is not announced open"
    spec.check_tls_files()
    runner = ClusterRunner(spec)
    try:
        runner.start_all()
        with Admin(
            spec.namesrv_addresses,
            credentials=ADMIN,
            controllers=spec.controller_addresses,
            **tls_args(spec),
        ) as admin:
            wait_until(lambda: _has_leader(admin), 90, "a leader over TLS, signed")
            for t in ("orders-eu", "payments", "orders-rmq5-python", "orders-rmq5-nodejs"):
                admin.create_topic(t, queues=2)
            admin.acl.create_user("alice", ALICE.secret_key)
            admin.acl.set_policy(
                "alice",
                parse_entries(["Topic:orders*=Pub,Sub", "Group:billing=Sub", "Group:rmq5*=Sub"]),
            )
            admin.acl.create_user("bob", BOB.secret_key)
            admin.acl.set_policy("bob", parse_entries(["Topic:orders*=Pub"]))
        yield spec
    finally:
        runner.stop_all()


def _has_leader(admin: Admin) -> bool:
    try:
        groups = admin.groups()
    except RaftMQError:
        return False
    return bool(groups) and all(g.leader_address for g in groups)


def _send_ok(spec: ClusterSpec, creds: Credentials, topic: str) -> bool:
    """The nodes fetch the ACL over TLS (AclSync) within their refresh interval."""
    try:
        with Producer(
            spec.namesrv_addresses, credentials=creds, send_timeout_ms=5000, **tls_args(spec)
        ) as p:
            p.send(topic, b"probe")
    except AccessDeniedError:
        return False
    return True


def test_allowed_user_sends_and_consumes_over_tls(cluster: ClusterSpec) -> None:
    spec = cluster
    wait_until(lambda: _send_ok(spec, ALICE, "orders-eu"), 60, "alice's policy on every node")
    with Producer(spec.namesrv_addresses, credentials=ALICE, **tls_args(spec)) as p:
        for i in range(20):
            p.send("orders-eu", f"m{i}".encode())
    got: list[bytes] = []
    with PullConsumer(
        spec.namesrv_addresses,
        "billing",
        start_from=StartFrom.EARLIEST,
        credentials=ALICE,
        **tls_args(spec),
    ) as c:
        c.subscribe("orders-eu")
        deadline = time.monotonic() + 60
        while len([b for b in got if b != b"probe"]) < 20 and time.monotonic() < deadline:
            got += [m.body for m in c.poll(timeout_ms=1000)]
    assert sorted(b for b in got if b != b"probe") == sorted(f"m{i}".encode() for i in range(20))


def test_the_proxy_metrics_are_https_with_basic_auth(cluster: ClusterSpec) -> None:
    """The proxy's /metrics with the brokers' access rules: server-only TLS (the CA is enough,
    no client certificate) and HTTP basic auth; plain HTTP gets no answer."""
    import base64
    import ssl
    import urllib.error
    import urllib.request

    assert cluster.tls is not None
    listen = cluster.settings["proxy"]["metrics_listen"]
    ctx = ssl.create_default_context(cafile=str(cluster.tls.ca))

    def get(scheme: str, path: str, user: tuple[str, str] | None) -> int:
        req = urllib.request.Request(f"{scheme}://{listen}{path}")
        if user is not None:
            token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
                assert path != "/metrics" or b"raftmq_proxy_clients" in r.read()
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    assert get("https", "/metrics", SCRAPER) == 200
    assert get("https", "/metrics", None) == 401
    assert get("https", "/metrics", (SCRAPER[0], "wrong")) == 401
    assert get("https", "/healthz", None) == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        get("http", "/healthz", None)


def test_denied_user_gets_access_denied(cluster: ClusterSpec) -> None:
    spec = cluster
    wait_until(lambda: _send_ok(spec, ALICE, "orders-eu"), 60, "alice's policy on every node")
    with (
        pytest.raises(AccessDeniedError) as err,
        Producer(spec.namesrv_addresses, credentials=ALICE, **tls_args(spec)) as p,
    ):
        p.send("payments", b"refused")
    assert err.value.details.get("resource") == "Topic:payments", err.value.details
    wait_until(lambda: _send_ok(spec, BOB, "orders-eu"), 60, "bob's policy on every node")
    with PullConsumer(
        spec.namesrv_addresses,
        "billing",
        start_from=StartFrom.EARLIEST,
        credentials=BOB,
        **tls_args(spec),
    ) as c:
        with pytest.raises(AccessDeniedError) as denied:
            c.assign([QueueRef("orders-eu", "broker-a", 0)])
            c.poll(timeout_ms=3_000)
        assert denied.value.details.get("action") == "Sub", denied.value.details


def test_plaintext_client_with_valid_credentials_is_refused(cluster: ClusterSpec) -> None:
    spec = cluster
    start = time.monotonic()
    with (
        pytest.raises(RaftMQError) as err,
        Producer(
            spec.namesrv_addresses,
            credentials=ADMIN,
            send_timeout_ms=5000,
            tls_ca=None,
            tls_cert=None,
            tls_key=None,
        ) as p,
    ):
        p.send("orders-eu", b"x")
    assert time.monotonic() - start < 30
    assert not isinstance(err.value, AccessDeniedError)
    assert "tls" in err.value.message.lower(), err.value.message


ROOT = Path(__file__).parents[2]
PY_DRIVER = ROOT / "tests" / "proxy" / "official_client.py"
NODE_DIR = ROOT / "tests" / "proxy" / "nodejs"


def _official(
    spec: ClusterSpec, argv: list[str], cwd: Path, creds: Credentials, home: Path
) -> dict[str, Any]:
    """Run an official client's driver against the proxy over server-only TLS, as `creds`."""
    assert spec.tls is not None
    env = {
        **os.environ,
        "HOME": str(home),  # both clients write their logs under $HOME/logs
        "RMQ5_TLS": "1",
        "RMQ5_ACCESS_KEY": creds.access_key,
        "RMQ5_SECRET_KEY": creds.secret_key,
        # both clients' gRPC trust the CA named here (they have no CA setting of their own)
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(spec.tls.ca),
    }
    out = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, f"exit {out.returncode}: {out.stdout[-2000:]} {out.stderr[-3000:]}"
    got: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return got


def _produce_consume(client: str, group: str) -> dict[str, Any]:
    bodies = [f"{client}-{i}" for i in range(5)]
    topic = f"orders-rmq5-{client}"
    produce = {"topic": topic, "messages": [{"body": b} for b in bodies]}
    consume = {"topic": topic, "group": group, "count": 5, "timeout_s": 60}
    return {"steps": [["produce", produce], ["consume", consume]], "_bodies": bodies}


@pytest.mark.parametrize("client", ["python", "nodejs"])
def test_official_clients_produce_and_consume_over_server_only_tls_with_aksk(
    cluster: ClusterSpec, client: str, tmp_path: Path
) -> None:
    """Issue 27: the brokers and NameServers demand client certificates (mutual TLS) while the
    proxy's port is server-only TLS, so the official RocketMQ 5 clients (no certificate)
    connect; they are authenticated by their AK/SK signature instead. Each produces 5 messages
    and consumes them back in a group of its own; with a wrong secret nothing goes through."""
    spec = cluster
    wait_until(lambda: _send_ok(spec, ALICE, "orders-eu"), 60, "alice's policy on every node")
    endpoint = str(spec.proxies[0])
    args = _produce_consume(client, f"rmq5-{client}")
    bodies = args.pop("_bodies")
    if client == "python":
        argv = [sys.executable, str(PY_DRIVER), "steps", endpoint, json.dumps(args)]
        cwd = ROOT
    else:
        node = shutil.which("node")
        # `make deps` installs both (scripts/ensure_node.sh): a missing one is a broken setup
        assert node and (NODE_DIR / "node_modules" / "rocketmq-client-nodejs").is_dir(), (
            "the official Node.js client is missing: run `make deps`"
        )
        argv = [node, str(NODE_DIR / "driver.js"), "steps", endpoint, json.dumps(args)]
        cwd = NODE_DIR
    sent, got = _official(spec, argv, cwd, ALICE, tmp_path)["results"]
    assert len(sent["sent"]) == 5, sent
    assert sorted(m["body"] for m in got["got"]) == bodies, got
    # a wrong secret: the proxy refuses the signature (the client reports the failure)
    bad = Credentials(ALICE.access_key, "not-the-secret")
    one = {"topic": f"orders-rmq5-{client}", "messages": [{"body": "refused"}]}
    argv_bad = [*argv[:2], "produce", endpoint, json.dumps(one)]
    with pytest.raises(AssertionError, match="exit"):
        _official(spec, argv_bad, cwd, bad, tmp_path)
