"""TLS and auth together, as deploy/secure.toml runs them: a NameServer, a controller and a broker
group as processes with [security.tls] (mutual TLS) and [security.auth] both on. The ACL reaches
the NameServer and the brokers over the TLS channels of their AclSync; a user with a policy
sends and consumes over TLS with signed requests (gRPC and the framed data path's signed HELLO
inside TLS); what its policy does not allow is ACCESS_DENIED; a plaintext client holding valid
credentials is refused before any signature is looked at."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

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


def make_spec(tmp: Path) -> ClusterSpec:
    certs = tmp / "certs"
    extra = (
        "[settings.broker]\nheartbeat_interval_ms=1000\n"
        f"[security.tls]\nenabled=true\ndir='{certs}'\nrequire_client_cert=true\n"
        "[security.auth]\nenabled=true\n"
        f"admin_access_key='{ADMIN.access_key}'\nadmin_secret_key='{ADMIN.secret_key}'\n"
        "refresh_ms=300\n"
    )
    # one NameServer, one group of three (gRPC + Raft), one controller (gRPC + Raft)
    text = local_description(
        free_ports(1 + 3 * 2 + 2), tmp / "data", name="Secure", namesrvs=1, controllers=1,
        extra=extra,
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
            for t in ("orders-eu", "payments"):
                admin.create_topic(t, queues=2)
            admin.acl.create_user("alice", ALICE.secret_key)
            admin.acl.set_policy(
                "alice", parse_entries(["Topic:orders*=Pub,Sub", "Group:billing=Sub"])
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
