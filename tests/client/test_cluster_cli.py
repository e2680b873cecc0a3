"""`raftmq cluster up` end to end: the whole cluster of a description starts as local processes,
`raftmq cluster status` and the data commands work against it, Ctrl-C stops every process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from raftmq.ops.cluster_spec import local_description
from tests.harness.procs import ROOT, free_ports, wait_until


def spec_text(ports: list[int], data: Path) -> str:
    return local_description(
        ports,
        data,
        name="TestCluster",
        groups=("broker-a", "broker-b"),
        controllers=0,
        extra="[settings.broker]\nheartbeat_interval_ms=1000\n",
    )


def raftmq(*args: str, namesrv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "raftmq.ops.cli", "--namesrv", namesrv, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def live_pids(marker: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", "--", marker], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def test_cluster_up_status_produce_consume_and_ctrl_c(tmp_path: Path) -> None:
    ports = free_ports(14)
    data = tmp_path / "data"
    spec = tmp_path / "cluster.toml"
    spec.write_text(spec_text(ports, data))
    namesrv = f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
    log = open(tmp_path / "up.log", "w")  # noqa: SIM115
    up = subprocess.Popen(
        [sys.executable, "-m", "raftmq.ops.cli", "cluster", "up", "--spec", str(spec)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(
            lambda: "is up" in (tmp_path / "up.log").read_text(), 120, "`cluster up` to report"
        )

        # A snapshot may catch an election in flight on a loaded machine (200-400 ms election
        # timeouts): the status must show one leader per group and four followers soon.
        def settled() -> bool:
            st = raftmq("cluster", "status", namesrv=namesrv)
            assert st.returncode == 0, st.stdout + st.stderr
            return st.stdout.count("LEADER") == 2 and st.stdout.count("FOLLOWER") == 4

        wait_until(settled, 30, "status to show 2 leaders and 4 followers", interval_s=0.5)
        assert raftmq("topic", "create", "demo", "--queues", "2", namesrv=namesrv).returncode == 0
        produced = raftmq("produce", "demo", "--count", "500", namesrv=namesrv)
        assert produced.returncode == 0 and "500 messages" in produced.stdout, produced.stdout
        consumed = raftmq(
            "consume",
            "demo",
            "--group",
            "g1",
            "--from-beginning",
            "--max",
            "500",
            "--quiet",
            "--timeout",
            "60",
            namesrv=namesrv,
        )
        assert "500 messages" in consumed.stdout, consumed.stdout + consumed.stderr
        lag = raftmq("group", "lag", "g1", "--topic", "demo", namesrv=namesrv)
        assert lag.returncode == 0 and "total" in lag.stdout
        missing = raftmq("topic", "route", "no-such-topic", namesrv=namesrv)
        assert missing.returncode == 1 and "Traceback" not in missing.stderr
        assert "error (NO_ROUTE)" in missing.stderr
        markers = [str(data), f"--listen 127.0.0.1:{ports[0]}", f"--listen 127.0.0.1:{ports[1]}"]
        assert sum(len(live_pids(m)) for m in markers) == 8
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=90) == 0, (tmp_path / "up.log").read_text()[-3000:]
        wait_until(lambda: not any(live_pids(m) for m in markers), 30, "every process to exit")
    finally:
        if up.poll() is None:
            up.kill()
        for m in [str(data), f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"]:
            for pid in live_pids(m):
                os.kill(pid, signal.SIGKILL)
        log.close()
        time.sleep(0.1)
