"""The official RocketMQ 5 Node.js client (npm `rocketmq-client-nodejs`, installed by `make deps`
into tests/proxy/nodejs/) as a black box against a real raftmq cluster behind a real proxy
process: normal, FIFO, delayed and transactional sends; SimpleConsumer receive / ack / change
invisible duration and redelivery after the invisible duration; PushConsumer; tag filter; the
SDK and the Node.js client seeing the same messages both ways; and FIFO order per message group
held across a SIGKILL of the broker group's leader (last: it kills a node of the shared cluster).

The scenarios are tests/proxy/nodejs/driver.js, one `node` process per run, printing one
`RESULT {json}` line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.common.pb.apache.rocketmq.v2 import definition_pb2 as v2
from raftmq.common.pb.apache.rocketmq.v2 import service_pb2 as svc
from raftmq.common.pb.apache.rocketmq.v2 import service_pb2_grpc
from raftmq.ops.cluster_runner import broker_status
from tests.harness.local_cluster import free_ports
from tests.harness.procs import Cluster, Proc, start_cluster, wait_until
from tests.harness.readme import readme_blocks

NODE_DIR = Path(__file__).with_name("nodejs")
DRIVER = NODE_DIR / "driver.js"
TOPICS = {
    "orders": False,  # the README example
    "jn": False,
    "jtag": False,
    "jrd": False,
    "jci": False,
    "jff": True,
    "jpush": False,
    "jdly": False,
    "jtxn": False,
    "jsdk": False,
    "jsdk2": False,
    "jfo": True,
}

NODE = shutil.which("node")
if NODE is None or not (NODE_DIR / "node_modules" / "rocketmq-client-nodejs").is_dir():
    # `make deps` installs both (scripts/ensure_node.sh); only an unreachable npm registry
    # leaves them out, and it says so.
    pytest.skip(
        "the official Node.js client is missing: run `make deps` (Node.js from Debian, then "
        "`npm ci` in tests/proxy/nodejs)",
        allow_module_level=True,
    )


class NodeEnv:
    def __init__(self, cluster: Cluster, proxy: Proc, endpoint: str, home: Path) -> None:
        self.cluster = cluster
        self.proxy = proxy
        self.endpoint = endpoint
        # The client's own logger writes under $HOME/logs/rocketmq: the test's folder, not root's.
        self.env = {**os.environ, "HOME": str(home)}
        self.client_log = home / "logs" / "rocketmq" / "rocketmq_client_nodejs.log"

    def argv(self, scenario: str, args: dict[str, Any]) -> list[str]:
        assert NODE is not None
        return [NODE, str(DRIVER), scenario, self.endpoint, json.dumps(args)]

    def diagnose(self, out: str, err: str) -> str:
        try:
            client = "\n".join(self.client_log.read_text().splitlines()[-20:])
        except OSError:
            client = "(none)"
        return (
            f"{out[-3000:]}\n{err[-4000:]}\nclient log:\n{client}\nproxy log:\n{self.proxy.tail()}"
        )

    def run(self, scenario: str, **args: Any) -> dict[str, Any]:
        out = subprocess.run(
            self.argv(scenario, args),
            cwd=NODE_DIR,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return self.result(scenario, out.returncode, out.stdout, out.stderr)

    def result(self, scenario: str, code: int | None, out: str, err: str) -> dict[str, Any]:
        for line in out.splitlines():
            if line.startswith("RESULT "):
                got: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
                return got
        raise AssertionError(f"{scenario} gave no result (exit {code}):\n{self.diagnose(out, err)}")

    def produce_then(
        self, produce: dict[str, Any], scenario: str, **args: Any
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """A produce, then `scenario`, in one client process: (what was sent, its result)."""
        sent, res = self.run("steps", steps=[["produce", produce], [scenario, args]])["results"]
        return sent["sent"], res


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeEnv]:
    tmp = tmp_path_factory.mktemp("rmq5-node")
    cluster = start_cluster(
        tmp,
        groups=("broker-a",),
        namesrvs=1,
        broker_args=["--transaction-timeout-ms", "2000", "--transaction-check-interval-ms", "1000"],
    )
    endpoint = f"127.0.0.1:{free_ports(1)[0]}"
    proxy = Proc(
        "proxy",
        [
            "-m",
            "raftmq.proxy.server",
            "--listen",
            endpoint,
            "--namesrv-addresses",
            cluster.namesrv,
            "--offset-commit-interval-ms",
            "100",
            # A PushConsumer's long polls follow the proxy's settings; its shutdown waits for
            # the one in flight, so a short one keeps the test quick (the README's example
            # waits 5 s).
            "--max-long-polling-ms",
            "5000",
        ],
        tmp / "proxy.log",
    )
    try:
        proxy.start("proxy.started")
        cluster.wait_leaders()  # topics are created through the leader
        with Admin(cluster.namesrv) as admin:
            for topic, ordered in TOPICS.items():
                admin.create_topic(topic, queues=4, ordered=ordered)
        with grpc.insecure_channel(endpoint) as ch:
            stub = service_pb2_grpc.MessagingServiceStub(ch)
            for topic in TOPICS:  # registered with the NameServer: the clients find routes

                def routed(topic: str = topic) -> bool:
                    req = svc.QueryRouteRequest(topic=v2.Resource(name=topic))
                    return stub.QueryRoute(req, timeout=10).status.code == v2.OK

                wait_until(routed, 30, f"a route of {topic}", interval_s=0.2)
        home = tmp / "home"
        home.mkdir()
        yield NodeEnv(cluster, proxy, endpoint, home)
    finally:
        proxy.kill()
        cluster.close()
    assert "Traceback" not in proxy.tail(400), proxy.tail(400)


def test_the_readme_example_runs(env: NodeEnv) -> None:
    (block,) = readme_blocks("javascript", "rmq5node")
    script = NODE_DIR / "readme_example.js"  # beside node_modules: require finds the client
    script.write_text(block.code.replace("127.0.0.1:8081", env.endpoint))
    try:
        out = subprocess.run(
            [NODE or "node", str(script)],
            env=env.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        script.unlink()
    assert out.returncode == 0, env.diagnose(out.stdout, out.stderr)
    lines = out.stdout.splitlines()
    assert len(lines) == 2, env.diagnose(out.stdout, out.stderr)
    assert lines[1] == f"{lines[0]} hello from Node.js"  # the id the producer was given


def test_normal_messages_round_trip(env: NodeEnv) -> None:
    msgs = [
        {
            "body": f"m{i}",
            "tag": "AB"[i % 2],
            "keys": [f"k{i}", f"x{i}"],
            "properties": {"color": "red", "i": str(i)},
        }
        for i in range(6)
    ]
    sent, res = env.produce_then(
        {"topic": "jn", "messages": msgs},
        "consume",
        topic="jn",
        group="g-jn",
        count=6,
        check_empty=True,
        await_s=1,
    )
    assert len({s["id"] for s in sent}) == 6
    got = {m["id"]: m for m in res["got"]}
    assert sorted(got) == sorted(s["id"] for s in sent), "the ids the producer was given"
    for s, spec in zip(sent, msgs, strict=True):
        m = got[s["id"]]
        assert m["body"] == spec["body"] and m["tag"] == spec["tag"]
        assert m["keys"] == spec["keys"] and m["properties"] == spec["properties"]
        assert m["attempt"] == 1 and m["born_ms"] > 0 and m["group"] is None
    assert res["extra"] == [], "acknowledged messages came back"


def test_tag_filter(env: NodeEnv) -> None:
    _, res = env.produce_then(
        {"topic": "jtag", "messages": [{"body": f"t{i}", "tag": "AB"[i % 2]} for i in range(6)]},
        "consume",
        topic="jtag",
        group="g-jtag",
        filter="A",
        count=3,
        check_empty=True,
        await_s=1,
    )
    assert sorted(m["body"] for m in res["got"]) == ["t0", "t2", "t4"]
    assert res["extra"] == []


def test_unacked_message_comes_back_after_its_invisible_duration(env: NodeEnv) -> None:
    sent, res = env.produce_then(
        {"topic": "jrd", "messages": [{"body": "once"}]},
        "redeliver",
        topic="jrd",
        group="g-jrd",
        await_s=1,
    )
    assert [m["id"] for m in res["first"]] == [sent[0]["id"]]
    assert res["at_once"] == [], "an invisible message was delivered again"
    assert [m["id"] for m in res["again"]] == [sent[0]["id"]]
    assert res["again"][0]["attempt"] == 2
    assert res["again_after_s"] > 1.5  # invisible for 4 s from the first receive
    assert "expired" in res["old_ack_error"], res["old_ack_error"]
    assert res["new_ack_error"] == ""
    assert res["after"] == [], "an acknowledged message came back"


def test_change_invisible_duration(env: NodeEnv) -> None:
    _, res = env.produce_then(
        {"topic": "jci", "messages": [{"body": "slow"}]},
        "change_invisible",
        topic="jci",
        group="g-jci",
        await_s=1,
    )
    assert [m["body"] for m in res["first"]] == ["slow"]
    assert res["new_handle"] and res["new_handle"] != res["old_handle"]
    assert res["meanwhile"] == [], "visible again although its invisible time was extended"
    assert res["ack_error"] == ""


def test_fifo_order_per_message_group(env: NodeEnv) -> None:
    msgs = [{"body": f"{g}-{i}", "group": g} for i in range(5) for g in ("ga", "gb", "gc")]
    _, res = env.produce_then(
        {"topic": "jff", "messages": msgs}, "fifo", topic="jff", group="g-jff", count=15
    )
    assert len(res["got"]) == 15
    for g in ("ga", "gb", "gc"):
        seq = [m["body"] for m in res["got"] if m["group"] == g]
        assert seq == [f"{g}-{i}" for i in range(5)], seq


def test_push_consumer(env: NodeEnv) -> None:
    sent, res = env.produce_then(
        {"topic": "jpush", "messages": [{"body": f"p{i}"} for i in range(5)]},
        "push",
        topic="jpush",
        group="g-jpush",
        count=5,
    )
    assert sorted(m["id"] for m in res["got"]) == sorted(s["id"] for s in sent)
    # Acknowledged by the push consumer: nothing is left for the group.
    after = env.run("consume", topic="jpush", group="g-jpush", count=1, timeout_s=2, await_s=1)
    assert after["got"] == [], "the push consumer's acks were lost"


def test_delayed_message_is_not_received_before_due(env: NodeEnv) -> None:
    res = env.run("delayed", topic="jdly", group="g-jdly", body="later", delay_ms=3000)
    assert [m["body"] for m in res["got"]] == ["later"], res
    assert res["got"][0]["id"] == res["id"]
    assert res["got"][0]["properties"] == {}, "the broker's timer properties leaked"
    assert res["early"] == [], res  # nothing came before its delivery timestamp
    # The broker's clock decides; same machine, so a small margin only.
    assert res["received_ms"] >= res["due_ms"] - 200, res


def test_transactions_commit_rollback_and_check_back(env: NodeEnv) -> None:
    txn, consumed = env.run(
        "steps",
        steps=[
            ["transactions", {"topic": "jtxn", "check_wait_s": 40}],
            [
                "consume",
                {"topic": "jtxn", "group": "g-jtxn", "count": 2, "check_empty": True, "await_s": 1},
            ],
        ],
    )["results"]
    sent = txn["sent"]
    # The proxy asked the client's checker about the open one only, and it committed it.
    assert [c["id"] for c in txn["checked"]] == [sent["orphan"]["id"]], txn
    got = {m["body"]: m for m in consumed["got"]}
    assert sorted(got) == ["commit", "orphan"], consumed  # the rolled back one never shows
    assert got["commit"]["id"] == sent["commit"]["id"]
    assert got["orphan"]["id"] == sent["orphan"]["id"]
    assert all(m["properties"] == {} for m in consumed["got"]), "transaction properties leaked"
    assert consumed["extra"] == []


def test_sdk_producer_nodejs_consumer(env: NodeEnv) -> None:
    with Producer(env.cluster.namesrv) as p:
        r = p.send("jsdk", b"from-sdk", tags="T", keys=["key1", "key2"], properties={"p": "1"})
    res = env.run("consume", topic="jsdk", group="g-jsdk", count=1, await_s=1)
    [m] = res["got"]
    assert m["id"] == r.msg_id and m["body"] == "from-sdk" and m["tag"] == "T"
    assert m["keys"] == ["key1", "key2"] and m["properties"] == {"p": "1"}


def test_nodejs_producer_sdk_consumer(env: NodeEnv) -> None:
    spec = {"body": "from-node", "tag": "T2", "keys": ["k2"], "properties": {"p": "2"}}
    [sent] = env.run("produce", topic="jsdk2", messages=[spec])["sent"]
    got: list[Any] = []
    with PullConsumer(env.cluster.namesrv, "g-jsdk2", start_from=StartFrom.EARLIEST) as c:
        c.subscribe("jsdk2")
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got = c.poll(timeout_ms=500)
    [m] = got
    assert (m.body, m.tags, m.keys) == (b"from-node", "T2", ("k2",))
    assert m.properties["p"] == "2"
    # What raftmq's message has no field for rides along under rmq5.: the v2 id among them.
    assert m.properties["rmq5.message_id"] == sent["id"]
    assert m.properties["rmq5.message_type"] == "NORMAL"


# ---- last: SIGKILL of the leader of the module's cluster ------------------------------------


def _leader(env: NodeEnv) -> Proc:
    layout, procs = env.cluster.groups["broker-a"]

    def find() -> Proc | None:
        for i, p in enumerate(procs):
            if p.alive and broker_status(p.name, "broker-a", layout.address(i)).role == "LEADER":
                return p
        return None

    found = wait_until(find, 30, "a leader of broker-a")
    assert isinstance(found, Proc)
    return found


def test_fifo_order_held_across_a_leader_kill(env: NodeEnv) -> None:
    args = {"topic": "jfo", "count": 80, "interval_s": 0.02, "groups": 3}
    run = subprocess.Popen(
        env.argv("produce_stream", args),
        cwd=NODE_DIR,
        env=env.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None and run.stderr is not None
    acked_before = 0
    for line in run.stdout:
        if line.startswith("SENT "):
            acked_before += 1
            if acked_before == 20:
                break
    _leader(env).kill()  # SIGKILL, mid-run
    try:
        rest, err = run.communicate(timeout=120)
    finally:
        run.kill()
    result = env.result("produce_stream", run.returncode, rest, err)
    sent = result["sent"]
    print(f"acknowledged {len(sent)} of {args['count']}; failed sends: {result['failed']}")
    # The client went on after the failover (a send may fail while there is no leader).
    assert len(sent) > 60, result["failed"]
    assert int(sent[-1]["body"][1:]) >= 70, "the client stopped sending after the failover"
    _leader(env)  # a new one
    res = env.run("fifo", topic="jfo", group="g-jfo", count=len(sent), timeout_s=60, batch=16)
    got = [m["body"] for m in res["got"]]
    assert {s["body"] for s in sent} <= set(got), "an acknowledged message was lost"
    for g in range(3):  # order per message group: the sent order (a resend may repeat one)
        mine = [b for b in got if int(b[1:]) % 3 == g]
        firsts = list(dict.fromkeys(mine))
        assert firsts == sorted(firsts, key=lambda b: int(b[1:])), (g, mine)
