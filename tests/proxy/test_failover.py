"""SIGKILL a broker group's leader while the official RocketMQ 5 client sends through the proxy:
the client goes on after the failover and no acknowledged message is lost (FIFO order per message
group held across it)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.client.admin import Admin
from raftmq.ops.cluster_runner import broker_status
from tests.harness.local_cluster import free_ports
from tests.harness.procs import ROOT, Proc, start_cluster, wait_until
from tests.proxy.test_official_client import DRIVER, Env

pytestmark = pytest.mark.slow


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    cluster = start_cluster(tmp_path, groups=("broker-a",), namesrvs=1)
    endpoint = f"127.0.0.1:{free_ports(1)[0]}"
    proxy = Proc(
        "proxy",
        ["-m", "raftmq.proxy.server", "--listen", endpoint, "--namesrv-addresses", cluster.namesrv],
        tmp_path / "proxy.log",
    )
    try:
        proxy.start("proxy.started")
        cluster.wait_leaders()  # topics are created through the leader
        with Admin(cluster.namesrv) as admin:
            admin.create_topic("fo", queues=4, ordered=True)
            wait_until(lambda: admin.route("fo"), 30, "the route of fo")
        yield Env(cluster, proxy, endpoint)
    finally:
        proxy.kill()
        cluster.close()


def _leader(env: Env) -> Proc:
    layout, procs = env.cluster.groups["broker-a"]

    def find() -> Proc | None:
        for i, p in enumerate(procs):
            if p.alive and broker_status(p.name, "broker-a", layout.address(i)).role == "LEADER":
                return p
        return None

    found = wait_until(find, 30, "a leader of broker-a")
    assert isinstance(found, Proc)
    return found


def test_leader_kill_mid_run_loses_no_acknowledged_message(env: Env) -> None:
    args = {"topic": "fo", "count": 150, "interval_s": 0.02, "groups": 3}
    run = subprocess.Popen(
        [sys.executable, str(DRIVER), "produce_stream", env.endpoint, json.dumps(args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert run.stdout is not None
    acked_before = 0
    for line in run.stdout:
        if line.startswith("SENT "):
            acked_before += 1
            if acked_before == 40:
                break
    _leader(env).kill()  # SIGKILL
    rest = run.stdout.read()
    assert run.wait(120) == 0
    result = json.loads(rest.split("RESULT ", 1)[1])
    sent = result["sent"]
    print(f"acknowledged {len(sent)} of {args['count']}; failed sends: {result['failed']}")
    assert len(sent) > 100, result["failed"]  # the client went on after the failover
    _leader(env)  # a new one
    res = env.run("fifo", topic="fo", group="g-fo", count=len(sent), timeout_s=60, batch=16)
    got = [m["body"] for m in res["got"]]
    assert {s["body"] for s in sent} <= set(got), "an acknowledged message was lost"
    for g in range(3):  # order per message group: the sent order (a resend may repeat one)
        mine = [b for b in got if int(b[1:]) % 3 == g]
        firsts = list(dict.fromkeys(mine))
        assert firsts == sorted(firsts, key=lambda b: int(b[1:])), (g, mine)
