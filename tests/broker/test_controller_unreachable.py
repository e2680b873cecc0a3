"""A broker whose role reports reach no controller says so, once, and once more when one answers
again (issue 15, apache/rocketmq#4800: a leader cut off from every controller kept working and no
process logged a word for 100 s). A real broker process; the controllers are ports where nothing
listens, then a controller servicer in this process on one of them."""

from __future__ import annotations

import time
from concurrent import futures
from pathlib import Path

import grpc

from raftmq.broker.role_reporter import ReachabilityWatch
from raftmq.common.pb import controller_pb2_grpc
from tests.broker.test_server_startup import Recorder
from tests.harness.procs import Proc, free_ports, wait_until

WARN = "broker.controllers_unreachable"
BACK = "broker.controllers_reachable"


def count(proc: Proc, event: str) -> int:
    return proc.log.read_text(errors="replace").count(event)


def test_unreachable_controllers_are_reported_once_then_their_return(tmp_path: Path) -> None:
    grpc_port, raft_port, ns_port, c1, c2 = free_ports(5)
    controllers = f"127.0.0.1:{c1},127.0.0.1:{c2}"
    broker = Proc(
        "broker",
        [
            "-m",
            "raftmq.broker.server",
            "--node-id",
            "n0",
            "--members",
            f"n0=127.0.0.1:{grpc_port}/127.0.0.1:{raft_port}",
            "--data-dir",
            str(tmp_path / "n0"),
            "--namesrv-addresses",
            f"127.0.0.1:{ns_port}",
            "--controller-addresses",
            controllers,
            "--heartbeat-interval-ms",
            "500",
        ],
        tmp_path / "broker.log",
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    try:
        started = time.monotonic()
        broker.start("broker.started")
        wait_until(lambda: count(broker, WARN) >= 1, 15, "the unreachable warning")
        warned_after_s = time.monotonic() - started
        time.sleep(4)  # many more failed rounds: still one line
        assert count(broker, WARN) == 1, broker.tail()
        (line,) = [ln for ln in broker.log.read_text().splitlines() if WARN in ln]
        assert "WARNING" in line and controllers in line and "unreachable_ms=" in line
        assert warned_after_s < 10, warned_after_s

        recorder = Recorder()
        controller_pb2_grpc.add_ControllerServicer_to_server(recorder, server)
        assert server.add_insecure_port(f"127.0.0.1:{c2}") == c2
        server.start()
        wait_until(lambda: count(broker, BACK) >= 1, 15, "the reachable-again line")
        time.sleep(2)
        assert count(broker, BACK) == 1 and count(broker, WARN) == 1, broker.tail()
        assert recorder.leader_terms(), "the controller got the leader's report"
        assert "Traceback" not in broker.log.read_text()
    finally:
        broker.kill()
        server.stop(0).wait()


def test_the_watch_warns_once_per_outage() -> None:
    watch = ReachabilityWatch(warn_after_ms=1000)
    assert watch.failed(0) is None and watch.failed(999) is None
    assert watch.failed(1500) == 1500
    assert watch.failed(5000) is None  # once per outage
    assert watch.succeeded(6000) == 6000
    assert watch.succeeded(7000) is None  # nothing was warned about
    assert watch.failed(8000) is None and watch.failed(9000) == 1000  # a new outage
