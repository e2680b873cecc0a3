"""Leader balancing on real processes: the controller hands broker-a's leadership back to its
preferred node (n0) by a graceful Raft transfer, with a producer sending meanwhile and not one
send failing; with n0 dead it leaves the leadership where it is, and once n0 is back (and the
hold time passed) n0 leads again."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from client.admin import Admin
from client.cluster_runner import ClusterRunner
from client.cluster_spec import parse
from raftlog.local_cluster import free_ports
from tests.controller.test_controller_cluster import broker_leader, spec_text
from tests.controller.test_failover import Sender, namesrv_str
from tests.procs import wait_until

FAST_BALANCE = "[settings.controller]\nbalance_hold_ms=2000\nbalance_interval_ms=3000\n"


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

    # n0 dead: leadership moves elsewhere and stays there (no hand-off to a dead node).
    r.kill("broker-a-n0", signal.SIGKILL)
    wait_until(lambda: broker_leader(r)[0] not in ("", "n0"), 30, "a new leader")
    other, term = broker_leader(r)
    time.sleep(8)  # more than two balance intervals
    assert broker_leader(r) == (other, term)
    # n0 back: after the hold it leads again.
    r.start("broker-a-n0")
    wait_until(lambda: broker_leader(r)[0] == "n0", 40, "n0 to lead again")
