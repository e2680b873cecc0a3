"""Authentication and authorization (issue 19) on a real cluster with [security.auth] on: a
NameServer, a controller and a broker group as processes. Users and policies go through the
controller's log and reach the broker and NameServer; a user allowed Pub on `orders*` sends to
`orders-eu` and is refused `payments` with ACCESS_DENIED naming the action and the resource; a
user without Sub on a group can neither pull nor commit; unsigned, badly signed and replayed
requests are refused on gRPC and on the framed data path; `raftmq acl` drives the same."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.consumer_push import ConsumeResult, PushConsumer
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.client.producer.transaction import (
    LocalTransactionState,
    TransactionProducer,
    TransactionSendResult,
)
from raftmq.common import stored_batch, stored_send
from raftmq.common.acl import parse_entries
from raftmq.common.auth import Credentials, Signer
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import (
    AccessDeniedError,
    PermissionDeniedError,
    RaftMQError,
    UnauthenticatedError,
    from_rpc_error,
)
from raftmq.common.frame import error_from_detail
from raftmq.common.message import Message
from raftmq.common.pb import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    namesrv_pb2,
    namesrv_pb2_grpc,
)
from raftmq.common.pb.apache.rocketmq.v2 import definition_pb2 as v2
from raftmq.common.pb.apache.rocketmq.v2 import service_pb2 as svc
from raftmq.common.pb.apache.rocketmq.v2 import service_pb2_grpc
from raftmq.common.quota_gate import THROTTLE_KEY
from raftmq.common.transport import FrameClient
from raftmq.common.types import QueueRef
from raftmq.ops.cli_acl import prepare_cluster_auth
from raftmq.ops.cluster_runner import ClusterRunner
from raftmq.ops.cluster_spec import SpecError, load, parse
from raftmq.ops.compose import compose_yaml
from tests.harness.local_cluster import free_ports
from tests.harness.procs import wait_until
from tests.harness.readme import readme_blocks, substitute
from tests.ops import test_dashboard

ADMIN = Credentials("ops-admin", "ops-admin-secret")
# the dashboard tests' fixtures, reused: headless chromium and where its screenshots go
browser = test_dashboard.browser
shots = test_dashboard.shots
ALICE = Credentials("alice", "alice-secret")
BOB = Credentials("bob", "bob-secret")
DAVE = Credentials("dave", "dave-secret")  # the official RocketMQ 5 client's user
QUINN = Credentials("quinn", "quinn-secret")  # a consumer with a consume quota
SCRAPE_TOKEN = "scrape-token-0123"  # the proxy's /metrics asks it (issue 27)
QUOTA = 200_000  # bytes per second: alice's produce quota and quinn's consume quota (issue 27)
DRIVER = Path(__file__).parents[1] / "proxy" / "official_client.py"
ROOT = Path(__file__).parents[2]


def secure_spec(ports: list[int], data: Path) -> str:
    it = iter(ports)
    nodes = ",".join(
        f"{{id='n{i}',host='127.0.0.1',port={next(it)},raft_port={next(it)}}}" for i in range(3)
    )
    return (
        f"[cluster]\nname='S'\ndata_dir='{data}'\n"
        f"[[namesrv]]\nhost='127.0.0.1'\nport={next(it)}\n"
        f"[[controller]]\nid='c0'\nhost='127.0.0.1'\nport={next(it)}\nraft_port={next(it)}\n"
        f"[[group]]\nname='broker-a'\nnodes=[{nodes}]\n"
        f"[[proxy]]\nhost='127.0.0.1'\nport={next(it)}\nmetrics_port={next(it)}\n"
        "[settings.broker]\nheartbeat_interval_ms=1000\n"
        f"quota_produce_by_user='alice={QUOTA}'\nquota_consume_by_user='quinn={QUOTA}'\n"
        f"[settings.proxy]\nmetrics_bearer_token='{SCRAPE_TOKEN}'\n"
        f"quota_produce_by_user='alice={QUOTA}'\nquota_consume_by_user='quinn={QUOTA}'\n"
        "[settings.namesrv]\nbroker_expiry_ms=10000\nscan_interval_ms=500\n"
        "[security.auth]\nenabled=true\n"
        f"admin_access_key='{ADMIN.access_key}'\nadmin_secret_key='{ADMIN.secret_key}'\n"
        "refresh_ms=300\n"
    )


class Env:
    def __init__(self, runner: ClusterRunner) -> None:
        self.runner = runner
        spec = runner.spec
        self.namesrv = spec.namesrv_addresses
        self.controllers = spec.controller_addresses
        self.brokers = [f"{n.address}" for n in spec.groups["broker-a"]]

    def data_port(self, address: str) -> int:
        """The framed port a broker node printed when it started (`data=HOST:PORT`)."""
        for p in self.runner.processes():
            if p.role == "broker" and f"{p.host}:{p.ports[0]}" == address:
                text = (p.data_dir / "process.log").read_text()
                line = next(x for x in text.splitlines() if x.startswith("broker.started"))
                data = next(w for w in line.split() if w.startswith("data="))
                return int(data.rpartition(":")[2])
        raise AssertionError(f"no broker at {address}")

    def admin(self, creds: Credentials | None = ADMIN) -> Admin:
        return Admin(self.namesrv, credentials=creds, controllers=self.controllers)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("secure")
    spec = parse(secure_spec(free_ports(11), tmp / "data"))
    runner = ClusterRunner(spec)
    try:
        runner.start_all()
        e = Env(runner)
        with e.admin() as admin:
            wait_until(lambda: any(g.leader_address for g in admin.groups()), 60, "a leader")
            for t in ("orders-eu", "payments", "orders-push", "orders-quota"):
                admin.create_topic(t, queues=2)
            admin.acl.create_user("alice", ALICE.secret_key)
            # Group:txq: her transactional halves, held to her produce quota (issue 27)
            admin.acl.set_policy("alice", parse_entries(["Topic:orders*=Pub", "Group:txq=Pub"]))
            admin.acl.create_user("bob", BOB.secret_key)
            admin.acl.set_policy("bob", parse_entries(["Topic:orders*=Sub", "Group:billing=Sub"]))
            admin.acl.create_user("dave", DAVE.secret_key)
            admin.acl.set_policy(
                "dave", parse_entries(["Topic:orders*=Pub,Sub", "Group:billing=Sub"])
            )
            admin.acl.create_user("quinn", QUINN.secret_key)
            version = admin.acl.set_policy(
                "quinn", parse_entries(["Topic:orders*=Sub", "Group:quota=Sub"])
            )
        # every node learns the users within its refresh interval; the tests ask any node (a
        # follower too), so all of them must hold the last version before the first test
        wait_until(lambda: _can_route(e, ALICE, "orders-eu"), 30, "the ACL on the NameServer")
        wait_until(lambda: not _behind(runner, version), 30, f"ACL version {version} everywhere")
        yield e
    finally:
        runner.stop_all()


def _behind(runner: ClusterRunner, version: int) -> list[str]:
    """The nodes whose log does not yet show ACL `version` or a later one (AclSync logs
    `acl.updated version=N` each time it takes a newer snapshot)."""
    behind = []
    for p in runner.processes():
        if p.role not in ("broker", "namesrv", "proxy"):
            continue
        log = p.data_dir / "process.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        seen = [int(v) for v in re.findall(r"acl\.updated version=(\d+)", text)]
        if max(seen, default=-1) < version:
            behind.append(p.name)
    return behind


def _can_route(e: Env, creds: Credentials, topic: str) -> bool:
    with grpc.insecure_channel(e.namesrv) as ch:
        try:
            namesrv_pb2_grpc.NameServerStub(ch).GetRouteInfoByTopic(
                namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic),
                timeout=3,
                metadata=Signer(creds).metadata(),
            )
        except grpc.RpcError:
            return False
    return True


def test_allowed_publish_and_a_denial_that_names_action_and_resource(env: Env) -> None:
    def sends() -> bool:
        try:
            with Producer(env.namesrv, credentials=ALICE, send_timeout_ms=5_000) as p:
                p.send("orders-eu", b"hello")
        except AccessDeniedError:
            return False  # the broker has not fetched the policy yet
        return True

    wait_until(sends, 30, "alice's send to orders-eu (the policy on the broker)")
    with Producer(env.namesrv, credentials=ALICE, send_timeout_ms=5_000) as p:
        assert p.send("orders-eu", b"second").queue_offset >= 0
        with pytest.raises(PermissionDeniedError) as denied:
            p.send("payments", b"nope")
    err = denied.value
    assert isinstance(err, AccessDeniedError) and err.code == "ACCESS_DENIED"
    assert "Pub" in err.message and "payments" in err.message, err.message
    # the route lookup is the first check alice fails for payments (NameServer), or the
    # broker's Pub check when she may look the route up: either names the topic
    assert err.details.get("resource") == "Topic:payments", err.details
    # the broker's own answer, framed data path, per batch
    _ensure_route = _framed_send(env, ALICE, "payments")
    assert isinstance(_ensure_route, AccessDeniedError), _ensure_route
    assert _ensure_route.details == {
        "subject": "alice",
        "action": "Pub",
        "resource": "Topic:payments",
        "reason": "no_allow",
        "grant": "raftmq acl policy add alice Topic:payments=Pub",
    }
    # v2 stored batches (SEND_STORED): each batch's topic is checked from its header
    denied_v2, allowed_v2 = _stored_send(env, ALICE, ["payments", "orders-eu"])
    assert isinstance(denied_v2, AccessDeniedError), denied_v2
    assert denied_v2.details.get("resource") == "Topic:payments", denied_v2.details
    assert not isinstance(allowed_v2, RaftMQError), allowed_v2


def _framed_send(
    env: Env, creds: Credentials | None, topic: str, when_ms: int | None = None
) -> object:
    """SEND_BATCHES to the group leader's framed port; the batch's error or the call's."""
    with env.admin() as admin:
        leader = next(g for g in admin.groups() if g.broker_group == "broker-a")
    port = env.data_port(leader.leader_address)
    signer = None
    if creds is not None:
        signer = Signer(creds, (lambda: when_ms) if when_ms is not None else None)

    async def go() -> object:
        fc = FrameClient("127.0.0.1", port, auth=signer.hello_auth if signer else None)
        req = broker_pb2.SendBatchesRequest()
        b = req.batches.add()
        b.topic = topic
        b.queue_id = 0
        try:
            raw = await fc.call(DataMethod.SEND_BATCHES, req.SerializeToString(), 5.0)
        except RaftMQError as exc:
            return exc
        finally:
            await fc.close()
        out = broker_pb2.SendBatchesResponse.FromString(raw)
        r = out.results[0]
        return error_from_detail(r.error) if r.HasField("error") else r

    return asyncio.run(go())


def _stored_send(env: Env, creds: Credentials, topics: list[str]) -> list[object]:
    """One SEND_STORED frame with a v2 stored batch per topic; each batch's error or answer."""
    with env.admin() as admin:
        leader = next(g for g in admin.groups() if g.broker_group == "broker-a")
    port = env.data_port(leader.leader_address)
    signer = Signer(creds, None)
    batches = [stored_batch.encode_batch(t, 0, [Message(t, b"v2")], None, "h") for t in topics]

    async def go() -> list[object]:
        fc = FrameClient("127.0.0.1", port, auth=signer.hello_auth)
        try:
            raw = await fc.call(DataMethod.SEND_STORED, stored_send.encode_request(batches, 0), 5.0)
        finally:
            await fc.close()
        answer = stored_send.decode_answer(raw)
        return [error_from_detail(r.error) if r.error else r for r in answer.results]

    return asyncio.run(go())


def test_a_user_without_sub_on_a_group_cannot_pull_or_commit(env: Env) -> None:
    q = QueueRef("orders-eu", "broker-a", 0)
    with PullConsumer(env.namesrv, "billing", credentials=BOB, start_from=StartFrom.EARLIEST) as c:
        wait_until(lambda: _polls(c, q), 30, "bob's pull as billing")
        c.commit()
    with PullConsumer(env.namesrv, "other", credentials=BOB, start_from=StartFrom.EARLIEST) as c:
        with pytest.raises(AccessDeniedError) as denied:
            c.assign([q])
            c.poll(timeout_ms=3_000)
        assert denied.value.details.get("resource") == "Group:other", denied.value.details
    # commit offsets for a group bob may not use: gRPC and framed both refuse
    with grpc.insecure_channel(env.brokers[0]) as ch, pytest.raises(grpc.RpcError) as rpc:
        broker_pb2_grpc.BrokerStub(ch).CommitOffset(
            broker_pb2.CommitOffsetRequest(
                consumer_group="other",
                offsets=[broker_pb2.QueueOffset(topic="orders-eu", queue_id=0, offset=1)],
            ),
            timeout=5,
            metadata=Signer(BOB).metadata(),
        )
    err = from_rpc_error(rpc.value)
    assert isinstance(err, AccessDeniedError) and err.details["resource"] == "Group:other"
    assert rpc.value.code() is grpc.StatusCode.PERMISSION_DENIED


def _polls(c: PullConsumer, q: QueueRef) -> bool:
    try:
        c.assign([q])
        c.poll(timeout_ms=500)
    except AccessDeniedError:
        return False
    return True


def test_unsigned_badly_signed_and_replayed_requests_are_refused(env: Env) -> None:
    with grpc.insecure_channel(env.brokers[0]) as ch:
        stub = broker_pb2_grpc.BrokerStub(ch)
        for md, why in (
            (None, "requires signed requests"),
            (Signer(Credentials("alice", "wrong-secret")).metadata(), "does not match"),
            (Signer(Credentials("mallory", "mallory-secret")).metadata(), "unknown"),
            (
                Signer(ALICE, lambda: int(time.time() * 1000) - 20 * 60_000).metadata(),
                "replay",
            ),
        ):
            with pytest.raises(grpc.RpcError) as rpc:
                stub.ListTopics(broker_pb2.ListTopicsRequest(), timeout=5, metadata=md)
            assert rpc.value.code() is grpc.StatusCode.UNAUTHENTICATED
            err = from_rpc_error(rpc.value)
            assert isinstance(err, UnauthenticatedError) and why in err.message, err.message
    # the SDK without credentials: one typed error, not a retry loop
    with env.admin(None) as anonymous, pytest.raises(UnauthenticatedError):
        anonymous.groups()
    # the framed data path refuses the HELLO itself
    for creds, when in (
        (None, None),
        (Credentials("alice", "wrong-secret"), None),
        (ALICE, int(time.time() * 1000) - 20 * 60_000),
    ):
        out = _framed_send(env, creds, "orders-eu", when)
        assert isinstance(out, UnauthenticatedError), out


def test_acl_cli_and_admin_reads(env: Env, tmp_path: Path) -> None:
    creds = tmp_path / "admin.toml"
    creds.write_text(f'access_key = "{ADMIN.access_key}"\nsecret_key = "{ADMIN.secret_key}"\n')

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable, "-m", "raftmq.ops.cli", "--namesrv", env.namesrv,
                "--credentials-file", str(creds), "acl", "--controllers", env.controllers, *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )  # fmt: skip

    out = cli("user", "create", "carol", "--user-secret", "carol-secret")
    assert out.returncode == 0, out.stderr
    out = cli("policy", "set", "carol", "Group:c*=Sub", "--deny", "Topic:payments=All")
    assert out.returncode == 0, out.stderr
    users = json.loads(cli("user", "list", "--json").stdout)
    assert {"name": "carol", "type": "Normal"} in users
    assert "carol-secret" not in cli("user", "list").stdout
    policies = json.loads(cli("policy", "list", "carol", "--json").stdout)
    assert {e["resource"] for e in policies["carol"]} == {"Group:c*", "Topic:payments"}
    out = cli("user", "create", "carol", "--user-secret", "carol-secret")
    assert out.returncode == 1 and "exists" in out.stderr, out.stderr
    assert cli("user", "delete", "carol").returncode == 0
    assert "carol" not in cli("policy", "list", "--json").stdout
    # a normal user may not manage users: super users only
    with env.admin(ALICE) as alice, pytest.raises(AccessDeniedError, match="super users"):
        alice.acl.create_user("eve", "eve-secret")


def test_the_official_rocketmq5_client_signs_and_is_checked_by_the_proxy(env: Env) -> None:
    # A declared dependency (the dev extra, which `make test` installs): never skipped.
    assert importlib.util.find_spec("rocketmq") is not None, (
        "the official client is missing: pip install rocketmq-python-client (the dev extra)"
    )
    endpoint = str(env.runner.spec.proxies[0])
    args = {
        "ak": DAVE.access_key,
        "sk": DAVE.secret_key,
        "topic": "orders-eu",
        "denied_topic": "payments",
        "group": "billing",
        "denied_group": "other",
    }
    out = subprocess.run(
        [sys.executable, str(DRIVER), "secured", endpoint, json.dumps(args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, f"exit {out.returncode}: {out.stdout[-2000:]} {out.stderr[-3000:]}"
    got = json.loads(lines[-1].removeprefix("RESULT "))
    assert got["sent"], got
    assert got["received"] >= 1, got
    for key in ("denied_send", "denied_receive", "anonymous_send", "bad_secret_send"):
        assert got[key], f"{key} was not refused: {got}"
    assert "40300" in got["denied_receive"] and "Sub on Group:other" in got["denied_receive"]
    # the client hides a failed route lookup's status: the v2 answers, from our own stubs
    with grpc.insecure_channel(endpoint) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)

        def route(topic: str, md: tuple[tuple[str, str], ...] | None) -> v2.Status:
            req = svc.QueryRouteRequest(topic=v2.Resource(name=topic))
            return stub.QueryRoute(req, timeout=10, metadata=md).status

        st = route("orders-eu", None)
        assert st.code == v2.UNAUTHORIZED and "signed requests" in st.message, st
        st = route("orders-eu", Signer(Credentials("dave", "not-the-secret")).metadata())
        assert st.code == v2.UNAUTHORIZED and "does not match" in st.message, st
        old = Signer(DAVE, lambda: int(time.time() * 1000) - 20 * 60_000).metadata()
        st = route("orders-eu", old)
        assert st.code == v2.UNAUTHORIZED and "replay" in st.message, st
        st = route("payments", Signer(DAVE).metadata())
        assert st.code == v2.FORBIDDEN and "Topic:payments" in st.message, st
        assert route("orders-eu", Signer(DAVE).metadata()).code == v2.OK


def test_secure_description_passes_auth_to_every_role() -> None:
    spec = load(ROOT / "deploy" / "secure.toml")
    assert spec.auth["auth_enabled"] is True
    for p in spec.processes():
        assert "--auth-enabled" in p.argv, p.name
        if p.role in ("namesrv", "proxy"):
            i = p.argv.index("--acl-controller-addresses")
            assert p.argv[i + 1] == spec.controller_addresses
    text = compose_yaml(spec)  # the secret comes from the host's environment, never the file
    assert 'RAFTMQ_SECRET_KEY: "${RAFTMQ_ADMIN_SECRET_KEY:?' in text
    assert "--auth-admin-secret-key" not in text
    plain = load(ROOT / "deploy" / "cluster.toml")
    assert "environment:" not in compose_yaml(plain)
    assert not plain.auth and all("--auth-enabled" not in p.argv for p in plain.processes())
    assert prepare_cluster_auth(plain) is not None, "an open cluster is announced as open"
    base = (
        "[[namesrv]]\nhost='127.0.0.1'\nport=9876\n[[group]]\nname='g'\n"
        "nodes=[{id='n0',host='127.0.0.1',port=10911,raft_port=20911}]\n"
    )
    with pytest.raises(SpecError, match="controllers"):
        parse(base + "[security.auth]\nenabled = true\n")
    with pytest.raises(SpecError, match="no key 'passwd'"):
        parse(base + "\n[security.auth]\npasswd = 'x'\n")


def test_a_push_consumer_with_sub_rights_consumes_end_to_end(env: Env) -> None:
    """Heartbeats, rebalance (consumer list), pulls and offset commits of a push consumer all
    pass their checks for a user with Sub on the topic and the group."""
    with Producer(env.namesrv, credentials=DAVE, send_timeout_ms=5_000) as p:
        sent = {p.send("orders-push", f"m{i}".encode()).msg_id for i in range(10)}
    got: set[str] = set()

    def listen(m: Any) -> ConsumeResult:
        got.add(m.msg_id)
        return ConsumeResult.SUCCESS

    with PushConsumer(
        env.namesrv,
        "billing",
        "orders-push",
        listen,
        credentials=DAVE,
        start_from=StartFrom.EARLIEST,
        heartbeat_interval_ms=500,
        rebalance_interval_ms=500,
    ):
        wait_until(lambda: got >= sent, 30, "dave's push consumer to get every message")


def test_changes_reach_the_nodes_within_the_refresh_interval(env: Env) -> None:
    """A new user works, a changed secret and a deleted user stop working, each within about
    one refresh interval (300 ms here) on the NameServer and the broker."""
    erin, erin2 = Credentials("erin", "erin-secret"), Credentials("erin", "erin-secret-2")
    with env.admin() as admin:
        admin.acl.create_user("erin", erin.secret_key)
        admin.acl.set_policy("erin", parse_entries(["Topic:orders*=Pub"]))
        t0 = time.monotonic()
        wait_until(lambda: _can_route(env, erin, "orders-eu"), 10, "erin on the NameServer")
        assert time.monotonic() - t0 < 10
        # the broker refreshes on its own clock: an empty batch, refused but not by auth
        wait_until(
            lambda: (
                not isinstance(
                    _framed_send(env, erin, "orders-eu"),
                    (UnauthenticatedError, PermissionDeniedError),
                )
            ),
            10,
            "erin on the broker",
        )
        admin.acl.update_user("erin", erin2.secret_key)
        wait_until(lambda: not _can_route(env, erin, "orders-eu"), 10, "the old secret refused")
        assert _can_route(env, erin2, "orders-eu")
        wait_until(
            lambda: isinstance(_framed_send(env, erin, "orders-eu"), UnauthenticatedError),
            10,
            "the old secret refused by the broker",
        )
        admin.acl.delete_user("erin")
        wait_until(lambda: not _can_route(env, erin2, "orders-eu"), 10, "the deleted user")
        wait_until(
            lambda: isinstance(_framed_send(env, erin2, "orders-eu"), UnauthenticatedError),
            10,
            "the deleted user refused by the broker",
        )


def test_a_transactional_producer_needs_pub_on_its_topic_and_group(env: Env) -> None:
    """Half sends (Pub on the topic), ends and check-back polls (Pub on the producer group)."""
    tina = Credentials("tina", "tina-secret")
    with env.admin() as admin:
        admin.acl.create_user("tina", tina.secret_key)
        admin.acl.set_policy("tina", parse_entries(["Topic:orders*=Pub", "Group:txg=Pub"]))
    wait_until(lambda: _can_route(env, tina, "orders-eu"), 10, "tina on the NameServer")

    def commit(_half: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    def end_error(result: object) -> object:
        return result.end_error() if isinstance(result, TransactionSendResult) else result

    def sent(group: str) -> object:
        with TransactionProducer(
            env.namesrv, group, commit, credentials=tina, group_refresh_ms=1000
        ) as p:
            try:
                return p.send_in_transaction("orders-eu", b"tx", commit)
            except RaftMQError as exc:
                return exc

    wait_until(lambda: end_error(sent("txg")) is None, 20, "tina's committed transaction")
    out = sent("other-group")  # the half is stored (Pub on the topic); its end is refused
    assert isinstance(end_error(out), AccessDeniedError), out


def test_broker_status_of_a_user_without_rights_exits_with_the_denial(env: Env) -> None:
    """Issue 26: the denial was a row of the table, exit 0, as if every node were down."""

    def status(creds: Credentials) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable, "-m", "raftmq.ops.cli", "--namesrv", env.namesrv,
                "--access-key", creds.access_key, "--secret-key", creds.secret_key,
                "broker", "status", "--config",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )  # fmt: skip

    denied = status(ALICE)
    assert denied.returncode == 1, denied.stdout + denied.stderr
    assert "ACCESS_DENIED" in denied.stderr and "broker nodes" not in denied.stdout, denied
    allowed = status(ADMIN)
    assert allowed.returncode == 0 and "broker config" in allowed.stdout, allowed


# ---- denials that say what happened (issue 27) -------------------------------------------------


def test_the_readme_denial_example_prints_what_it_shows(env: Env) -> None:
    """The README's `acl` block run against this cluster (its user renamed, its NameServer this
    one's): it prints exactly its `# prints:` lines. Before: the README showed details without
    a reason, and the proposed `acl policy set alice Topic:X=Get or Pub or Sub` was no valid
    command and would have replaced alice's whole policy."""
    with env.admin() as admin:
        admin.acl.create_user("ruth", "ruth-secret")
        admin.acl.set_policy(
            "ruth",
            parse_entries(["Topic:orders*=Pub", "Group:billing=Sub"])
            + parse_entries(["Topic:orders-secret=All"], "Deny"),
        )
    [block] = readme_blocks("python", "acl")
    names = {'"alice", "alice-secret"': '"ruth", "ruth-secret"', " alice ": " ruth "}
    code = substitute(block.code, env.namesrv, {"127.0.0.1:9976": env.namesrv, **names})
    expected = [ln.removeprefix("# ") for ln in code.split("# prints:\n", 1)[1].splitlines()]
    assert expected and all(" ruth " in ln for ln in expected), expected

    def prints() -> str:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
        )
        return done.stdout if done.stdout.splitlines() == expected else ""

    wait_until(prints, 30, f"the README's output {expected} (ruth's policy on every node)")


def test_each_grant_a_denial_names_is_valid_and_additive(env: Env, tmp_path: Path) -> None:
    """Follow the denials of a send to a topic the user has no entry for: each names a command
    that, run as printed, lets the next step through, and the user's other entries stay."""
    creds = tmp_path / "admin.toml"
    creds.write_text(f'access_key = "{ADMIN.access_key}"\nsecret_key = "{ADMIN.secret_key}"\n')
    sam = Credentials("sam", "sam-secret")
    with env.admin() as admin:
        admin.acl.create_user("sam", sam.secret_key)
        admin.acl.set_policy("sam", parse_entries(["Topic:orders*=Pub", "Group:billing=Sub"]))
    grants: list[str] = []

    def sends() -> bool:
        try:
            with Producer(env.namesrv, credentials=sam, send_timeout_ms=5_000) as p:
                p.send("payments", b"granted")
        except AccessDeniedError as exc:
            assert exc.reason == "no_allow" and exc.grant.startswith("raftmq acl policy add sam")
            if exc.grant not in grants:
                grants.append(exc.grant)
            argv = shlex.split(exc.grant)
            done = subprocess.run(
                [sys.executable, "-m", "raftmq.ops.cli", "--credentials-file", str(creds),
                 "acl", "--controllers", env.controllers, *argv[2:]],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            return False
        return True

    wait_until(sends, 60, "sam's send to payments, following the grants the denials name")
    assert grants == [
        "raftmq acl policy add sam Topic:payments=Get",  # the route, at the NameServer
        "raftmq acl policy add sam Topic:payments=Pub",  # the send, at the broker
    ], grants
    with env.admin() as admin:
        kept = {e.spec for e in admin.acl.policies()["sam"]}
    assert kept == {"Topic:orders*=Pub", "Group:billing=Sub", "Topic:payments=Get",
                    "Topic:payments=Pub"}, kept  # fmt: skip


def test_a_push_consumer_denied_its_group_fails_at_start(env: Env) -> None:
    """Before: it started, received nothing, and logged a WARNING per queue."""
    consumer = PushConsumer(
        env.namesrv,
        "other",  # bob has Sub on Group:billing only
        "orders-eu",
        lambda m: ConsumeResult.SUCCESS,
        credentials=BOB,
    )
    t0 = time.monotonic()
    with pytest.raises(AccessDeniedError) as denied:
        consumer.start()
    assert time.monotonic() - t0 < 15
    err = denied.value
    assert err.reason == "no_allow" and err.details["resource"] == "Group:other", err.details
    assert err.grant == "raftmq acl policy add bob Group:other=Sub"
    consumer.close()  # nothing to stop: it never started


def _send_all(creds: Credentials, env: Env, body: bytes, n: int) -> tuple[float, int]:
    """n sends one at a time as `creds`: (seconds taken, ms the brokers said they held)."""
    with Producer(env.namesrv, credentials=creds, send_timeout_ms=20_000) as p:
        wait_until(lambda: p.send("orders-quota", b"warm"), 30, "a route to orders-quota")
        t0 = time.monotonic()
        for _ in range(n):
            p.send("orders-quota", body)
        return time.monotonic() - t0, p.throttle_ms


def test_a_user_over_its_produce_quota_is_slowed_to_it_and_another_is_not(env: Env) -> None:
    """alice (200 KB/s) and dave (no quota) each send 600 KB one at a time: alice's sends are
    held (the bucket holds one second, so all but her last send's 380 KB wait: 1.9 s at least)
    and say so; dave's are not held at all. Every send succeeds: a quota delays, never refuses."""
    body = b"q" * 20_000
    n = 30
    alice_s, alice_held = _send_all(ALICE, env, body, n)
    _dave_s, dave_held = _send_all(DAVE, env, body, n)
    owed_s = ((n - 1) * len(body) - QUOTA) / QUOTA
    assert alice_s >= owed_s - 0.05, (alice_s, owed_s)  # asyncio's timers: ~1 ms early each
    # told: the held time is part of what the sends took (the rest: storing them)
    assert 0 < alice_held <= alice_s * 1000, (alice_held, alice_s)
    assert dave_held == 0, dave_held


def test_transactional_halves_are_held_to_the_produce_quota(env: Env) -> None:
    """A half send is a produce: alice (200 KB/s) sending 600 KB of transactional halves one at a
    time is held as her sends are (before, halves went around her quota unheld), and the half's
    answer says by how much."""
    body, n = b"t" * 20_000, 30

    def commit(_half: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    with TransactionProducer(
        env.namesrv, "txq", commit, credentials=ALICE, group_refresh_ms=1000
    ) as p:
        wait_until(
            lambda: p.send_in_transaction("orders-quota", b"warm", commit).end_error() is None,
            30,
            "alice's first transaction",
        )
        time.sleep(1.0)  # the warm-up's bytes and any earlier test's are paid off
        t0 = time.monotonic()
        for _ in range(n):
            p.send_in_transaction("orders-quota", body, commit)
        took = time.monotonic() - t0
        p.flush()
    owed_s = ((n - 1) * len(body) - QUOTA) / QUOTA
    assert took >= owed_s - 0.05, (took, owed_s)


def test_a_user_over_its_consume_quota_is_slowed_to_it_and_another_is_not(env: Env) -> None:
    """quinn (200 KB/s to consume) and dave (none) each read the same 600 KB from the start,
    5 messages (100 KB) a pull on each of the topic's 2 queues."""
    topic, body, per_pull = "orders-quota-c", b"c" * 20_000, 5
    with env.admin() as admin:
        admin.create_topic(topic, queues=2)
    with Producer(env.namesrv, credentials=DAVE, send_timeout_ms=20_000) as p:
        wait_until(lambda: p.send(topic, b"warm"), 30, f"a route to {topic}")
        for _ in range(30):
            p.send(topic, body)

    def read_all(creds: Credentials, group: str) -> tuple[float, int, int]:
        with PullConsumer(
            env.namesrv,
            group,
            credentials=creds,
            start_from=StartFrom.EARLIEST,
            max_messages_per_pull=per_pull,
        ) as c:
            queues = wait_until(lambda: c.queues_of(topic), 30, f"{topic}'s queues")
            assert isinstance(queues, list)
            with env.admin() as admin:
                ends = {s.queue: s.max_offset for s in admin.topic_status(topic)}
            t0 = time.monotonic()
            c.assign(queues)  # its fetchers start pulling here
            got = 0
            while any(c.position(q) < end for q, end in ends.items()):
                assert time.monotonic() - t0 < 60, "not all read in 60 s"
                got += sum(len(m.body) for m in c.poll(timeout_ms=500))
            return time.monotonic() - t0, got, c.throttle_ms

    quinn_s, quinn_bytes, quinn_held = read_all(QUINN, "quota")
    _dave_s, dave_bytes, dave_held = read_all(DAVE, "billing")
    assert quinn_bytes == dave_bytes >= 30 * len(body)
    # what may be read at once: the burst and one pull per queue served as the debt clears
    at_once = QUOTA + len(ends_of(env, topic)) * per_pull * len(body)
    owed_s = (quinn_bytes - at_once) / QUOTA
    assert quinn_s >= owed_s - 0.05, (quinn_s, owed_s)
    assert quinn_held > 0  # told (summed over queues pulled at once: may pass the time taken)
    assert dave_held == 0, dave_held


def _held_ms(call: Any) -> int:
    return sum(int(v) for k, v in call.trailing_metadata() or () if k == THROTTLE_KEY)


def _proxy_sends(env: Env, creds: Credentials, body: bytes, n: int) -> tuple[float, int]:
    """n v2 SendMessage calls one at a time through the proxy as `creds`: (seconds, ms held)."""
    signer = Signer(creds)
    held = 0
    with grpc.insecure_channel(str(env.runner.spec.proxies[0])) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)

        def send(data: bytes) -> tuple[v2.Status, int]:
            m = v2.Message(
                topic=v2.Resource(name="orders-quota"),
                body=data,
                system_properties=v2.SystemProperties(
                    message_id=f"{creds.access_key}-{time.monotonic_ns()}", message_type=v2.NORMAL
                ),
            )
            req = svc.SendMessageRequest(messages=[m])
            resp, call = stub.SendMessage.with_call(req, timeout=20, metadata=signer.metadata())
            return resp.status, _held_ms(call)

        # The proxy's route to the topic (run alone, no test before this one sent to it)
        wait_until(lambda: send(b"warm")[0].code == v2.OK, 30, "a route at the proxy")
        t0 = time.monotonic()
        for _ in range(n):
            status, ms = send(body)
            assert status.code == v2.OK, status  # held, never refused
            held += ms
        return time.monotonic() - t0, held


def test_the_proxy_slows_a_user_over_its_produce_quota_and_not_another(env: Env) -> None:
    """The same quota through the RocketMQ 5 API: alice (200 KB/s at the proxy) and dave (none)
    each send 600 KB one at a time; alice's calls are held and say so in their trailer."""
    body, n = b"p" * 20_000, 30
    alice_s, alice_held = _proxy_sends(env, ALICE, body, n)
    _dave_s, dave_held = _proxy_sends(env, DAVE, body, n)
    owed_s = ((n - 1) * len(body) - QUOTA) / QUOTA
    assert alice_s >= owed_s - 0.05, (alice_s, owed_s)
    assert 0 < alice_held <= alice_s * 1000, (alice_held, alice_s)
    assert dave_held == 0, dave_held


def test_the_proxy_slows_a_user_over_its_consume_quota_on_pop_and_not_another(env: Env) -> None:
    """quinn (200 KB/s to consume at the proxy) and dave (none) each receive (POP) the same
    600 KB, 5 messages a receive."""
    topic, body, batch = "orders-quota-pop", b"r" * 20_000, 5
    with env.admin() as admin:
        admin.create_topic(topic, queues=1)
    with Producer(env.namesrv, credentials=DAVE, send_timeout_ms=20_000) as p:
        wait_until(lambda: p.send(topic, body), 30, f"a route to {topic}")
        for _ in range(29):
            p.send(topic, body)

    def receive_all(creds: Credentials, group: str) -> tuple[float, int, int]:
        signer = Signer(creds)
        got = held = 0
        with grpc.insecure_channel(str(env.runner.spec.proxies[0])) as ch:
            stub = service_pb2_grpc.MessagingServiceStub(ch)
            req = svc.ReceiveMessageRequest(
                group=v2.Resource(name=group),
                message_queue=v2.MessageQueue(topic=v2.Resource(name=topic)),
                filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
                batch_size=batch,
            )
            req.invisible_duration.FromMilliseconds(120_000)  # received once each
            req.long_polling_timeout.FromMilliseconds(2_000)
            t0 = time.monotonic()
            while got < 30 * len(body):
                assert time.monotonic() - t0 < 60, f"{got} bytes received in 60 s"
                call = stub.ReceiveMessage(req, timeout=20, metadata=signer.metadata())
                for r in call:
                    if r.HasField("status"):
                        assert r.status.code in (v2.OK, v2.MESSAGE_NOT_FOUND), r.status
                    if r.HasField("message"):
                        got += len(r.message.body)
                held += _held_ms(call)
            return time.monotonic() - t0, got, held

    quinn_s, quinn_bytes, quinn_held = receive_all(QUINN, "quota")
    _dave_s, dave_bytes, dave_held = receive_all(DAVE, "billing")
    assert quinn_bytes == dave_bytes == 30 * len(body)
    # the burst, and one receive served as the debt clears (charged once answered)
    at_once = QUOTA + batch * len(body)
    owed_s = (quinn_bytes - at_once) / QUOTA
    assert quinn_s >= owed_s - 0.05, (quinn_s, owed_s)
    assert 0 < quinn_held <= quinn_s * 1000, (quinn_held, quinn_s)
    assert dave_held == 0, dave_held


def _leader(env: Env) -> str:
    """broker-a's leader once it is n0, its preferred node: the controller moves leadership
    there soon after a start (a raw gRPC stub, unlike the SDK, does not follow a move)."""
    preferred = env.brokers[0]
    with env.admin() as admin:
        wait_until(
            lambda: any(g.leader_address == preferred for g in admin.groups()),
            60,
            f"broker-a's preferred leader {preferred}",
        )
    return preferred


def _grpc_send(topic: str, body: bytes, queue_id: int = 0) -> broker_pb2.SendMessageRequest:
    return broker_pb2.SendMessageRequest(
        topic=topic, queue_id=queue_id, messages=[common_pb2.Message(body=body)]
    )


def _warm(stub: broker_pb2_grpc.BrokerStub, signer: Signer) -> None:
    """A first gRPC send that succeeds (a node that just became leader may refuse one)."""
    wait_until(
        lambda: stub.SendMessage(
            _grpc_send("orders-quota", b"warm"), timeout=20, metadata=signer.metadata()
        ),
        30,
        "a first gRPC send to orders-quota",
    )


def _grpc_sends(env: Env, creds: Credentials, body: bytes, n: int) -> tuple[float, int, int]:
    """n Broker.SendMessage calls (gRPC, not the framed port) one at a time to the leader as
    `creds`: (seconds taken, ms held told by the trailers, ms told by the answers' field)."""
    signer = Signer(creds)
    trailers = fields = 0
    with grpc.insecure_channel(_leader(env)) as ch:
        stub = broker_pb2_grpc.BrokerStub(ch)
        _warm(stub, signer)
        t0 = time.monotonic()
        for _ in range(n):
            resp, call = stub.SendMessage.with_call(
                _grpc_send("orders-quota", body), timeout=20, metadata=signer.metadata()
            )
            trailers += _held_ms(call)
            fields += resp.throttle_ms
        return time.monotonic() - t0, trailers, fields


def test_the_brokers_grpc_service_slows_a_user_over_its_quota_and_not_another(env: Env) -> None:
    """Issue 27 on the broker's gRPC port (admin tools, clients without the framed port): alice
    (200 KB/s, the same book as her framed sends) and dave (none) each send 600 KB one call at a
    time; alice's calls are held and say so in the trailer and the answer, dave's are not."""
    body, n = b"g" * 20_000, 30
    alice_s, alice_trailers, alice_fields = _grpc_sends(env, ALICE, body, n)
    _dave_s, dave_trailers, dave_fields = _grpc_sends(env, DAVE, body, n)
    owed_s = ((n - 1) * len(body) - QUOTA) / QUOTA
    assert alice_s >= owed_s - 0.05, (alice_s, owed_s)
    assert 0 < alice_trailers == alice_fields <= alice_s * 1000, (alice_trailers, alice_fields)
    assert dave_trailers == dave_fields == 0, (dave_trailers, dave_fields)


HELD_PER_USER = 4  # the broker's quota_max_held_calls_per_user (its default)
# alice's calls at once: most of the broker's 128 handler threads, but fewer than one host's
# share of them (112: common/call_shares.py), which would refuse some calls for itself
FLOOD = 100


def test_a_flood_of_throttled_grpc_calls_holds_its_share_of_threads_and_others_are_served(
    env: Env,
) -> None:
    """alice, owing 3 s, fires 100 gRPC sends at once: at most 4 are held (each holds a handler
    thread), the others are answered at once THROTTLED with the wait to honour, nothing stored;
    dave's send meanwhile is served at once. Without the cap every one of her calls was held, on
    100 of the 128 handler threads."""
    alice, dave = Signer(ALICE), Signer(DAVE)
    with grpc.insecure_channel(_leader(env)) as ch:
        stub = broker_pb2_grpc.BrokerStub(ch)
        _warm(stub, dave)
        # 800 KB: her burst (200 KB) and 3 s more (the call itself may be held for older debt)
        stub.SendMessage(
            _grpc_send("orders-quota", b"o" * 800_000), timeout=30, metadata=alice.metadata()
        )
        flood = [
            stub.SendMessage.future(
                _grpc_send("orders-quota", b"f"), timeout=30, metadata=alice.metadata()
            )
            for _ in range(FLOOD)
        ]
        # every call of the flood reached the broker: all but the held ones are answered
        wait_until(
            lambda: sum(f.done() for f in flood) >= FLOOD - HELD_PER_USER, 20, "the refusals"
        )
        resp, call = stub.SendMessage.with_call(
            _grpc_send("orders-quota", b"dave"), timeout=5, metadata=dave.metadata()
        )
        assert resp.results and resp.throttle_ms == 0 and _held_ms(call) == 0
        served, refused = [], []
        for f in flood:
            exc = f.exception(timeout=30)
            if exc is None:
                served.append(f.result())
                continue
            err = from_rpc_error(exc)
            assert err.code == "THROTTLED", err
            refused.append(err)
    assert len(served) + len(refused) == FLOOD
    assert 1 <= len(served) <= HELD_PER_USER, len(served)
    assert all(r.throttle_ms > 0 for r in served), [r.throttle_ms for r in served]
    for err in refused:
        assert err.details.get("user") == "alice", err.details
        assert int(err.details["retry_after_ms"]) > 0, err.details
        assert "send fewer calls at once" in err.message, err.message


def test_a_grpc_send_cancelled_while_held_for_its_quota_stores_nothing(env: Env) -> None:
    """A held call whose client gives up (cancels, or its deadline passes) wakes its handler
    thread, which then serves nothing: the client saw it fail, and a retry must not find it
    stored twice."""
    alice, dave = Signer(ALICE), Signer(DAVE)
    with env.admin() as admin:
        ends_before = {s.queue.queue_id: s.max_offset for s in admin.topic_status("orders-quota")}
    with grpc.insecure_channel(_leader(env)) as ch:
        stub = broker_pb2_grpc.BrokerStub(ch)
        _warm(stub, alice)
        # 1.2 MB: her burst and 5 s more (this call may be held for older debt first)
        stub.SendMessage(
            _grpc_send("orders-quota", b"o" * 1_200_000), timeout=30, metadata=alice.metadata()
        )
        held = stub.SendMessage.future(
            _grpc_send("orders-quota", b"cancelled", queue_id=1),
            timeout=30,
            metadata=alice.metadata(),
        )
        time.sleep(0.3)  # on the broker by now (if not, the cancel never reaches it: the same)
        held.cancel()
        # dave's send to the same queue after it: the woken thread would have stored before
        stub.SendMessage(
            _grpc_send("orders-quota", b"dave", queue_id=1), timeout=10, metadata=dave.metadata()
        )
    with env.admin() as admin:
        ends_after = {s.queue.queue_id: s.max_offset for s in admin.topic_status("orders-quota")}
    assert ends_after[1] == ends_before[1] + 1, (ends_before, ends_after)  # dave's only


def test_the_brokers_grpc_pulls_are_slowed_to_a_users_consume_quota(env: Env) -> None:
    """quinn (200 KB/s to consume) and dave (none) each pull the same 600 KB over gRPC: quinn's
    pulls are held (or answered empty at the same offset, the wait told) until she owes nothing;
    dave's are answered at once."""
    topic, body = "orders-quota-g", b"r" * 20_000
    with env.admin() as admin:
        admin.create_topic(topic, queues=1)
    with Producer(env.namesrv, credentials=DAVE, send_timeout_ms=20_000) as p:
        wait_until(lambda: p.send(topic, body), 30, f"a route to {topic}")
        for _ in range(29):
            p.send(topic, body)

    def pull_all(creds: Credentials, group: str) -> tuple[float, int, int]:
        signer = Signer(creds)
        offset = got = told = 0
        with grpc.insecure_channel(_leader(env)) as ch:
            stub = broker_pb2_grpc.BrokerStub(ch)
            t0 = time.monotonic()
            while got < 30 * len(body):
                assert time.monotonic() - t0 < 60, f"{got} bytes pulled in 60 s"
                resp, call = stub.PullMessage.with_call(
                    broker_pb2.PullMessageRequest(
                        consumer_group=group,
                        topic=topic,
                        queue_id=0,
                        offset=offset,
                        max_count=5,
                        max_wait_ms=2_000,
                    ),
                    timeout=20,
                    metadata=signer.metadata(),
                )
                assert resp.throttle_ms == _held_ms(call), (resp.throttle_ms, _held_ms(call))
                got += sum(len(m.message.body) for m in resp.messages)
                told += resp.throttle_ms
                offset = resp.next_offset
            return time.monotonic() - t0, got, told

    quinn_s, quinn_bytes, quinn_told = pull_all(QUINN, "quota")
    _dave_s, dave_bytes, dave_told = pull_all(DAVE, "billing")
    assert quinn_bytes == dave_bytes == 30 * len(body)
    at_once = QUOTA + 5 * len(body)  # the burst, and the pull served as the debt clears
    owed_s = (quinn_bytes - at_once) / QUOTA
    assert quinn_s >= owed_s - 0.05, (quinn_s, owed_s)
    assert quinn_told > 0 and dave_told == 0, (quinn_told, dave_told)


def test_the_proxy_serves_metrics_behind_its_bearer_token_with_quotas_per_user(env: Env) -> None:
    """The proxy's /metrics has the brokers' access rules (common/scrape_access.py): a bearer
    token here; /healthz stays open for liveness probes. Its quota counters are per user."""
    import urllib.error
    import urllib.request

    [url] = [u for name, u in env.runner.spec.metrics_endpoints() if name == "proxy-0"]
    _proxy_sends(env, ALICE, b"m" * 1_000, 1)

    def get(path: str, token: str | None) -> tuple[int, str]:
        req = urllib.request.Request(url.replace("/metrics", path))
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    assert get("/metrics", None)[0] == 401
    assert get("/metrics", "not-the-token")[0] == 401
    assert get("/healthz", None)[0] == 200
    status, text = get("/metrics", SCRAPE_TOKEN)
    assert status == 200, text
    assert "raftmq_proxy_clients" in text and "raftmq_proxy_pop_queues" in text
    produced = [
        line
        for line in text.splitlines()
        if line.startswith("raftmq_quota_bytes_total{")
        and 'user="alice"' in line
        and 'flow="produce"' in line
    ]
    assert produced and float(produced[0].rsplit(" ", 1)[1]) >= 1_000, produced


def ends_of(env: Env, topic: str) -> list[int]:
    with env.admin() as admin:
        return [s.max_offset for s in admin.topic_status(topic)]


class _Browser:
    """A cookie-keeping HTTP client (urllib): what a browser does with the dashboard's forms."""

    def __init__(self, base: str) -> None:
        import http.cookiejar
        import urllib.request

        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def go(self, path: str, form: dict[str, str] | None = None) -> tuple[int, str, str]:
        """(status, final path, body) after redirects."""
        import urllib.error
        import urllib.parse

        data = urllib.parse.urlencode(form).encode() if form is not None else None
        try:
            with self.opener.open(self.base + path, data=data, timeout=30) as r:
                return r.status, urllib.parse.urlparse(r.url).path, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, urllib.parse.urlparse(exc.url).path, exc.read().decode()


def _token(page: str) -> str:
    import re

    m = re.search(r'name="token" value="([^"]+)"', page)
    assert m, page[-1500:]
    return m.group(1)


def test_the_dashboard_asks_a_sign_in_and_only_an_admin_acts(env: Env) -> None:
    """Issue 27: with auth on, every page asks a user of the cluster; alice (a normal user)
    reads but is shown no action and her POST is refused; the admin (super user) acts, and
    only with the CSRF token of its own sign-in; a tampered cookie is signed out."""
    from raftmq.common.acl import User, UserType
    from raftmq.ops.dashboard.app import Dashboard, Login
    from raftmq.ops.dashboard.server import DashboardServer

    with env.admin() as admin:
        login = Login(admin.acl.snapshot, User(ADMIN.access_key, ADMIN.secret_key, UserType.SUPER))
        server = DashboardServer(
            Dashboard(admin, allow_actions=True, namesrv=env.namesrv, login=login),
            "127.0.0.1",
            0,
        )
        base = f"http://{server.start()}"
        try:
            anon = _Browser(base)
            status, where, _ = anon.go("/topics")
            assert (status, where) == (200, "/login")  # redirected to sign in
            assert anon.go("/healthz")[0] == 200  # the probe needs no user
            status, _, page = anon.go("/login", {"access_key": "alice", "secret_key": "no"})
            assert status == 401 and "wrong" in page

            alice = _Browser(base)
            status, where, page = alice.go(
                "/login", {"access_key": "alice", "secret_key": ALICE.secret_key, "next": "/topics"}
            )
            assert (status, where) == (200, "/topics") and "alice (read-only)" in page
            assert "orders-eu" in page and 'id="create-topic"' not in page  # no action offered
            status, _, page = alice.go(
                "/actions/create-topic", {"topic": "by-alice", "queues": "1", "token": "x"}
            )
            assert status == 403 and "may only read" in page, page

            ops = _Browser(base)
            status, where, page = ops.go(
                "/login",
                {"access_key": ADMIN.access_key, "secret_key": ADMIN.secret_key, "next": "/topics"},
            )
            assert status == 200 and 'id="create-topic"' in page
            token = _token(page)
            form = {"topic": "by-admin", "queues": "1"}
            assert ops.go("/actions/create-topic", {**form, "token": "forged"})[0] == 403
            # another sign-in's token (alice's session cannot see the admin's forms) is refused
            other = _Browser(base)
            other.go(
                "/login",
                {"access_key": ADMIN.access_key, "secret_key": ADMIN.secret_key, "next": "/topics"},
            )
            _, _, other_page = other.go("/topics")
            assert ops.go("/actions/create-topic", {**form, "token": _token(other_page)})[0] == 403
            status, _, page = ops.go("/actions/create-topic", {**form, "token": token})
            assert status == 200 and 'id="confirm"' in page  # the first step: what will happen

            # the ACL screen: users, their dashboard role and policy; a grant, confirmed first
            status, _, page = ops.go("/acl")
            assert status == 200 and "Allow Topic:orders*=Pub" in page and "read-only" in page
            grant = {"user": "alice", "entry": "Topic:granted-here=Pub", "token": token}
            status, _, page = ops.go("/actions/acl-grant", grant)
            assert status == 200 and 'id="confirm"' in page
            status, _, page = ops.go("/actions/acl-grant", {**grant, "confirm": "yes"})
            assert status == 200 and 'id="done"' in page, page[-800:]
            entries = {e.spec for e in admin.acl.policies()["alice"]}
            assert {"Topic:orders*=Pub", "Topic:granted-here=Pub"} <= entries, entries
            added = parse_entries(["Topic:granted-here=Pub"])
            admin.acl.add_to_policy("alice", remove=added)  # as it was, for the other tests
            assert alice.go("/actions/acl-grant", grant)[0] == 403  # alice only reads
            # issue 27: removal and broker settings, admin only and with its own sign-in's token
            remove = {"user": "alice", "entry": "Topic:orders*=Pub", "decision": "Allow",
                      "confirm": "yes"}  # fmt: skip
            settings = {"settings": "retention_check_interval_ms=999", "confirm": "yes"}
            for action, form in (("/actions/acl-remove", remove),
                                 ("/actions/broker-config", settings)):  # fmt: skip
                status, _, page = alice.go(action, {**form, "token": token})
                assert status == 403 and "may only read" in page, (action, page[-500:])
                assert ops.go(action, {**form, "token": "forged"})[0] == 403, action
            assert "Topic:orders*=Pub" in {e.spec for e in admin.acl.policies()["alice"]}
            intervals = {n.status.config["retention_check_interval_ms"]
                         for n in admin.broker_statuses() if n.status}  # fmt: skip
            assert "999" not in intervals, intervals
            for cookie in ops.jar:
                cookie.value = cookie.value[:-1] + ("0" if cookie.value[-1] != "0" else "1")
            assert ops.go("/topics")[1] == "/login"  # tampered: signed out
        finally:
            server.stop()


def test_the_sign_in_and_users_pages_in_a_browser(env: Env, browser: Any, shots: Path) -> None:
    """Issue 27, in headless chromium: the sign-in page, then the users page as the admin
    (screenshots with data beside the other pages' when RAFTMQ_DASHBOARD_SHOTS is set)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from raftmq.common.acl import User, UserType
    from raftmq.ops.dashboard.app import Dashboard, Login
    from raftmq.ops.dashboard.server import DashboardServer

    with env.admin() as admin:
        login = Login(admin.acl.snapshot, User(ADMIN.access_key, ADMIN.secret_key, UserType.SUPER))
        server = DashboardServer(
            Dashboard(admin, allow_actions=True, namesrv=env.namesrv, login=login), "127.0.0.1", 0
        )
        base = f"http://{server.start()}"
        try:
            browser.delete_all_cookies()
            browser.get(f"{base}/acl")
            form = WebDriverWait(browser, 30).until(
                ec.presence_of_element_located((By.ID, "login"))
            )
            browser.save_screenshot(str(shots / "login.png"))
            form.find_element(By.NAME, "access_key").send_keys(ADMIN.access_key)
            form.find_element(By.NAME, "secret_key").send_keys(ADMIN.secret_key)
            form.find_element(By.TAG_NAME, "button").click()
            WebDriverWait(browser, 30).until(ec.presence_of_element_located((By.ID, "acl-users")))
            assert browser.find_element(By.ID, "who").text.startswith("ops-admin (admin)")
            rows = browser.find_elements(By.CSS_SELECTOR, "#acl-users tbody tr")
            users = {r.find_elements(By.TAG_NAME, "td")[0].text for r in rows}
            assert {"alice", "bob", "dave"} <= users, users
            browser.save_screenshot(str(shots / "acl.png"))
            _remove_an_entry_and_a_user(browser, admin, shots)
        finally:
            server.stop()


def _remove_an_entry_and_a_user(browser: Any, admin: Admin, shots: Path) -> None:
    """Issue 27, signed in as the admin: one entry of a user's policy removed from /acl (the
    others kept), then a user deleted; each confirmed first, nothing changed before."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    def wait_for(element_id: str) -> None:
        WebDriverWait(browser, 30).until(ec.presence_of_element_located((By.ID, element_id)))

    extra = parse_entries(["Topic:dash-remove=Pub"])
    admin.acl.add_to_policy("bob", add=extra)
    admin.acl.create_user("dash-temp", "dash-temp-secret")
    try:
        browser.get(browser.current_url)  # /acl again, with the new entry and user
        rows = browser.find_elements(By.CSS_SELECTOR, "#acl-entries tbody tr")
        [row] = [r for r in rows if [td.text for td in r.find_elements(By.TAG_NAME, "td")][:3]
                 == ["bob", "Allow", "Topic:dash-remove=Pub"]]  # fmt: skip
        row.find_element(By.TAG_NAME, "button").click()
        wait_for("confirm-box")
        assert "Topic:dash-remove=Pub" in browser.find_element(By.ID, "confirm-box").text
        assert extra[0] in admin.acl.policies()["bob"], "nothing before the confirmation"
        browser.find_element(By.CSS_SELECTOR, "#confirm button").click()
        wait_for("done")
        bob = admin.acl.policies()["bob"]
        assert extra[0] not in bob and {e.spec for e in bob} == {
            "Topic:orders*=Sub", "Group:billing=Sub"
        }, bob  # fmt: skip
        browser.get(browser.current_url.split("/actions/")[0] + "/acl")
        box = browser.find_element(By.CSS_SELECTOR, "#acl-delete input[name=user]")
        box.send_keys("dash-temp")
        browser.find_element(By.CSS_SELECTOR, "#acl-delete button").click()
        wait_for("confirm-box")
        assert "dash-temp" in admin.acl.snapshot().users, "nothing before the confirmation"
        browser.save_screenshot(str(shots / "acl-delete-confirm.png"))
        browser.find_element(By.CSS_SELECTOR, "#confirm button").click()
        wait_for("done")
        assert "dash-temp" not in admin.acl.snapshot().users
    finally:
        admin.acl.add_to_policy("bob", remove=extra)
        if "dash-temp" in admin.acl.snapshot().users:
            admin.acl.delete_user("dash-temp")
