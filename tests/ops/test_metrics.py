"""Prometheus metrics of every role of a real cluster (processes started from a cluster
description with metrics ports): scraped over HTTP and parsed with prometheus_client's own
parser, the counters move by exactly what was sent and consumed, errors are counted by code,
the controller and NameServer report their routes, and /readyz follows a group losing its
majority."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2
from raftmq.ops.cluster_runner import ClusterRunner
from raftmq.ops.cluster_spec import ClusterSpec, ProcessSpec, local_description, parse
from tests.harness.local_cluster import free_ports
from tests.harness.procs import ROOT, wait_until

TOPIC = "metrics-t"
GROUP = "metrics-g"
SENT = 1000


def spec_for(tmp: Path) -> ClusterSpec:
    """1 NameServer, broker-a of 3 nodes, 1 controller; a metrics port for each (14 ports)."""
    ports = free_ports(14)
    return parse(
        local_description(
            ports,
            tmp / "data",
            name="M",
            namesrvs=1,
            controllers=1,
            metrics=True,
            extra="[settings.broker]\nheartbeat_interval_ms=1000\n",
        )
    )


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRunner]:
    r = ClusterRunner(spec_for(tmp_path_factory.mktemp("metrics")))
    try:
        r.start_all()
        yield r
    finally:
        r.stop_all()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(p: ProcessSpec) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the process's /metrics, by (sample name, sorted labels)."""
    status, text = get(f"http://{p.metrics}/metrics")
    assert status == 200, text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """Sum of the samples named `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def of_role(r: ClusterRunner, role: str) -> list[ProcessSpec]:
    return [p for p in r.processes() if p.role == role]


def test_every_role_serves_metrics_that_count_what_was_sent(runner: ClusterRunner) -> None:
    r = runner
    brokers, namesrv, controller = (
        of_role(r, "broker"),
        of_role(r, "namesrv"),
        of_role(r, "controller"),
    )
    assert all(p.metrics for p in r.processes())
    for p in r.processes():
        assert get(f"http://{p.metrics}/healthz")[0] == 200
    namesrvs = ",".join(str(e) for e in r.spec.namesrvs)
    wait_until(
        lambda: all(get(f"http://{p.metrics}/readyz")[0] == 200 for p in brokers),
        30,
        "ready brokers",
    )
    with Admin(namesrvs) as admin:
        admin.create_topic(TOPIC, queues=4)
    before = [scrape(p) for p in brokers]
    with Producer(namesrvs) as producer:
        futures = [producer.send_async(TOPIC, b"m%d" % i) for i in range(SENT)]
        for f in futures:
            f.result(30)
    # Sends are counted on the leader that stored them: the group's sum moves by SENT exactly.
    after = [scrape(p) for p in brokers]
    moved = sum(
        value(a, "rocketmq_messages_in_total", topic=TOPIC)
        - value(b, "rocketmq_messages_in_total", topic=TOPIC)
        for a, b in zip(after, before, strict=True)
    )
    assert moved == SENT
    assert sum(value(a, "rocketmq_throughput_in_total", topic=TOPIC) for a in after) > SENT * 2
    # Latency histograms: at least one timed send (batches: fewer requests than messages; the
    # SDK sends each leader's ready stored batches in one SEND_STORED frame).
    timed = sum(
        value(a, "rocketmq_rpc_latency_seconds_count", method=m)
        for a in after
        for m in ("SEND_MESSAGE", "SEND_BATCHES", "SEND_STORED")
    )
    assert 1 <= timed < SENT
    # One leader; its Raft gauges agree with themselves; the followers have matched.
    leaders = [a for a in after if value(a, "raftmq_raft_role", role="leader") == 1]
    assert len(leaders) == 1
    lead = leaders[0]
    assert value(lead, "raftmq_raft_commit_index") >= value(lead, "raftmq_raft_applied_index") > 0
    assert value(lead, "raftmq_raft_term") >= 1
    lead_proc = next(p for p, a in zip(brokers, after, strict=True) if a is lead)
    followers = {
        dict(ls)["follower"] for n, ls in lead if n == "raftmq_raft_follower_match_lag_entries"
    }
    assert followers == {p.name.rpartition("-")[2] for p in brokers} - {lead_proc.name[-2:]}
    wait_until(
        lambda: all(
            v == 0
            for (n, _), v in scrape(lead_proc).items()
            if n == "raftmq_raft_follower_match_lag_entries"
        ),
        20,
        "followers to match the leader",
    )
    assert value(lead, "rocketmq_storage_size_bytes", kind="journal") > 0
    assert value(lead, "raftmq_disk_free_bytes") > 0
    storage = {"raftmq_storage_error", "raftmq_storage_corrupt_records"}
    assert storage | {"raftmq_scrub_bytes_total", "raftmq_scrub_passes_total"} <= {
        n for n, _ in lead
    }
    assert all(value(lead, n) == 0 for n in storage)  # every record read back intact
    # Offsets by the leader (issue 29): the leader placed the batches' offsets (answered at
    # commit), and says how many it left to the dispatcher.
    assert value(lead, "raftmq_offsets_placed_batches_total") >= 1
    assert "raftmq_offsets_left_batches_total" in {n for n, _ in lead}

    # Consume everything and commit: messages out move by SENT, the group's lag drops to 0.
    got = 0
    with PullConsumer(namesrvs, GROUP, start_from=StartFrom.EARLIEST) as consumer:
        consumer.subscribe(TOPIC)
        deadline = time.monotonic() + 30
        while got < SENT and time.monotonic() < deadline:
            got += len(consumer.poll(300))
        consumer.commit()
    assert got == SENT
    final = [scrape(p) for p in brokers]
    assert (
        sum(
            value(a, "rocketmq_messages_out_total", topic=TOPIC, consumer_group=GROUP)
            for a in final
        )
        == SENT
    )

    def lag_rows() -> dict[str, float]:
        s = scrape(lead_proc)
        return {
            dict(ls)["queue_id"]: v
            for (n, ls), v in s.items()
            if n == "rocketmq_consumer_lag_messages" and dict(ls)["consumer_group"] == GROUP
        }

    rows = wait_until(lambda: len(lag_rows()) == 4 and lag_rows(), 10, "a lag row per queue")
    assert rows == {"0": 0, "1": 0, "2": 0, "3": 0}

    # Errors by code: a send to a queue the topic does not have is INVALID_ARGUMENT.
    host_port = f"{lead_proc.host}:{lead_proc.ports[0]}"
    with grpc.insecure_channel(host_port) as ch, pytest.raises(grpc.RpcError):
        broker_pb2_grpc.BrokerStub(ch).SendMessage(
            broker_pb2.SendMessageRequest(
                topic=TOPIC, queue_id=99, messages=[common_pb2.Message(body=b"x")]
            ),
            timeout=5,
        )
    assert (
        value(
            scrape(lead_proc), "raftmq_errors_total", method="SendMessage", code="INVALID_ARGUMENT"
        )
        == 1
    )

    # The NameServer holds the route and counted the lookups; the controller the leader.
    ns = scrape(namesrv[0])
    assert value(ns, "raftmq_namesrv_topics") >= 1
    assert value(ns, "raftmq_namesrv_broker_groups") == 1
    assert value(ns, "raftmq_namesrv_group_has_leader", broker_group="broker-a") == 1
    assert value(ns, "rocketmq_rpc_latency_seconds_count", method="GetRouteInfoByTopic") >= 1
    ctl = scrape(controller[0])
    assert value(ctl, "raftmq_controller_raft_role", role="leader") == 1
    assert value(ctl, "raftmq_controller_group_has_leader", broker_group="broker-a") == 1
    assert value(ctl, "raftmq_controller_group_leader_changes_total", broker_group="broker-a") >= 1
    assert value(ctl, "rocketmq_rpc_latency_seconds_count", method="ReportRole") >= 1
    assert get(f"http://{namesrv[0].metrics}/readyz")[0] == 200
    assert get(f"http://{controller[0].metrics}/readyz")[0] == 200


def test_readyz_follows_the_group_majority(runner: ClusterRunner) -> None:
    """Two of three broker nodes killed: the survivor has no leader, and says so on /readyz."""
    r = runner
    brokers = of_role(r, "broker")
    wait_until(
        lambda: all(get(f"http://{p.metrics}/readyz")[0] == 200 for p in brokers),
        30,
        "ready brokers",
    )
    survivor, *others = brokers
    for p in others:
        r.kill(p.name)
    _status, text = wait_until(
        lambda: (got := get(f"http://{survivor.metrics}/readyz"))[0] == 503 and got,
        30,
        "the survivor to say it is not ready",
    )  # type: ignore[misc]
    assert "without a known leader" in text, text
    assert get(f"http://{survivor.metrics}/healthz")[0] == 200
    for p in others:
        r.start(p.name)
    wait_until(
        lambda: all(get(f"http://{p.metrics}/readyz")[0] == 200 for p in brokers), 60, "ready again"
    )


def test_cluster_up_prints_where_the_metrics_are(tmp_path: Path) -> None:
    """`make run` is `raftmq cluster up`: it names every process's /metrics URL."""
    spec_file = tmp_path / "cluster.toml"
    spec_file.write_text(
        local_description(
            free_ports(5),  # 1 NameServer, 1 group of 1 node (gRPC + Raft), metrics for both
            tmp_path / "data",
            name="Up",
            namesrvs=1,
            controllers=0,
            nodes_per_group=1,
            metrics=True,
        )
    )
    spec = parse(spec_file.read_text())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "raftmq.ops.cli", "cluster", *args, "--spec", str(spec_file)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    up = cli("up", "--detach")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        for name, url in spec.metrics_endpoints():
            assert re.search(rf"{re.escape(name)}\s+{re.escape(url)}", up.stdout), up.stdout
            assert get(url)[0] == 200
    finally:
        cli("down")
