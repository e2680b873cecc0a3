"""Leader balancing on real processes: the controller hands broker-a's leadership back to its
preferred node (n0) by a graceful Raft transfer, with a producer sending meanwhile and not one
send failing; with n0 dead it leaves the leadership where it is and never even attempts a hand-off
to n0 (n0 stops reporting, the policy drops it), and once n0 is back and has reported for the hold
time n0 leads again."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.client.admin import Admin
from raftmq.ops.cluster_runner import ClusterRunner
from raftmq.ops.cluster_spec import parse
from tests.controller.test_controller_cluster import broker_leader, spec_text
from tests.controller.test_failover import Sender, namesrv_str
from tests.harness.local_cluster import free_ports
from tests.harness.procs import wait_until

# alive_ms <= hold_ms: by the time a dead leader's successor is past the hold, the dead node has
# been silent longer than alive_ms (brokers report every heartbeat, 1 s here).
FAST_BALANCE = (
    "[settings.controller]\nbalance_hold_ms=2000\nbalance_interval_ms=3000\nbalance_alive_ms=2000\n"
)


def controller_logs(r: ClusterRunner) -> dict[str, int]:
    """Each controller's log size now: where to start reading for what happens next."""
    return {
        name: run.log.stat().st_size
        for name, run in r.running.items()
        if run.spec.role == "controller" and run.log.exists()
    }


def attempts_since(r: ClusterRunner, offsets: dict[str, int], to_node: str) -> list[str]:
    out = []
    for name, offset in offsets.items():
        with open(r.running[name].log, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        out += [
            line
            for line in text.splitlines()
            if "controller.balance_" in line and f"to={to_node}" in line
        ]
    return out


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[ClusterRunner]:
    r = ClusterRunner(parse(spec_text(free_ports(14), tmp_path / "data") + FAST_BALANCE))
    try:
        r.start_all()
        yield r
    finally:
        r.stop_all()


def test_preferred_leader_comes_back_without_failed_sends(runner: ClusterRunner) -> None:
    r = runner
    ns = namesrv_str(r)
    wait_until(lambda: broker_leader(r)[0] == "n0", 40, "the preferred node n0 to lead")
    with Admin(ns) as admin:
        admin.create_topic("balance", queues=4)
        wait_until(lambda: len(admin.route("balance").write_queues()) == 4, 20, "route")
        sender = Sender(ns, "balance")
        sender.start()
        try:
            wait_until(lambda: len(sender.acked) > 30, 30, "sends to flow")
            assert admin.elect("broker-a", "n1") == "n1"
            moved_at = time.monotonic()
            wait_until(lambda: broker_leader(r)[0] == "n1", 10, "n1 to lead after elect")
            # The controller hands it back after the hold (2 s): no failed send on the way.
            wait_until(lambda: broker_leader(r)[0] == "n0", 30, "the controller to restore n0")
            assert time.monotonic() - moved_at >= 1.5  # the hold was respected
            before = len(sender.acked)
            wait_until(lambda: len(sender.acked) > before + 30, 30, "sends to go on")
        finally:
            sender.stop()
    assert sender.failed == 0

    # n0 dead: leadership moves elsewhere and stays there; no hand-off to n0 is even attempted.
    offsets = controller_logs(r)
    r.kill("broker-a-n0", signal.SIGKILL)
    wait_until(lambda: broker_leader(r)[0] not in ("", "n0"), 30, "a new leader")
    other, term = broker_leader(r)
    time.sleep(8)  # more than two balance intervals
    assert broker_leader(r) == (other, term)
    assert attempts_since(r, offsets, "n0") == []
    # n0 back: once it has reported for the hold time (2 s) it leads again.
    offsets = controller_logs(r)
    r.start("broker-a-n0")
    back_at = time.monotonic()
    wait_until(lambda: broker_leader(r)[0] == "n0", 40, "n0 to lead again")
    assert time.monotonic() - back_at >= 1.0  # the hold (less n0's reports before its ready line)
    assert any("balance_attempt" in line for line in attempts_since(r, offsets, "n0"))
