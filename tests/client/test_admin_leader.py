"""Admin calls made while a broker group has no known leader (real processes on loopback).

A cluster just started, or a group in an election: the controller (or a test) can know the
leader a heartbeat before the NameServers do, and `create_topic` then failed at once with "no
leader is known yet" (a clean-clone `make test` failed so: test_balance_cluster). An admin call
sends nothing until it knows a leader, so it waits for one, boundedly, as Kafka's admin client
retries LEADER_NOT_AVAILABLE within its timeout."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from raftmq.client import admin as admin_module
from raftmq.client.admin import Admin
from raftmq.common.errors import NotLeaderError
from tests.harness.local_cluster import free_ports
from tests.harness.procs import GroupLayout, broker_procs, namesrv_proc, wait_until


def test_create_topic_waits_for_the_group_to_have_a_leader_then_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = free_ports(10)
    ns = namesrv_proc(tmp_path, "ns0", ports[0], ["--scan-interval-ms", "200"])
    layout = GroupLayout("broker-a", ports[1:4], ports[4:7], ports[7:10])
    nodes = broker_procs(tmp_path, layout, [f"127.0.0.1:{ports[0]}"])
    try:
        ns.start("namesrv.started")
        nodes[0].start("broker.started")  # one node of three: no majority, no leader
        with Admin(f"127.0.0.1:{ports[0]}") as admin:
            wait_until(
                lambda: [g.broker_group for g in admin.groups()] == ["broker-a"],
                30,
                "n0 to register its group",
            )
            assert admin.groups()[0].leader_address == ""
            # Without a majority the wait is bounded and ends with the same typed error.
            monkeypatch.setattr(admin_module, "LEADER_WAIT_S", 1.0)
            t0 = time.monotonic()
            with pytest.raises(NotLeaderError, match="no leader is known yet"):
                admin.create_topic("early", queues=2)
            assert 1.0 <= time.monotonic() - t0 < 10
            # The other two nodes start meanwhile: the same call waits for their leader.
            monkeypatch.setattr(admin_module, "LEADER_WAIT_S", 60.0)  # however slow the machine
            starters = [
                threading.Thread(target=n.start, args=("broker.started",)) for n in nodes[1:]
            ]
            for s in starters:
                s.start()
            try:
                assert admin.create_topic("early", queues=2) == ["broker-a"]
            finally:
                for s in starters:
                    s.join(120)
            wait_until(lambda: len(admin.route("early").write_queues()) == 2, 20, "its route")
    finally:
        for p in (*nodes, ns):
            p.kill()
