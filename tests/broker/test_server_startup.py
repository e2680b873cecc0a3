"""BrokerServer's construction order: the Raft log runs from the moment the node is built, so a
role change before or during the wiring of the role listener must still reach the controllers
(issue 15: `AttributeError: 'BrokerServer' object has no attribute 'reporter'`, once in 125
starts). A MemoryLog steers the role deterministically; a controller servicer in this process
records what arrives."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from raftmq.broker.node import BrokerNode
from raftmq.broker.server import BrokerServer
from raftmq.broker.settings import BrokerSettings
from raftmq.broker.store import MessageStore
from raftmq.common.pb import common_pb2, controller_pb2, controller_pb2_grpc
from raftmq.raftlog.memory import MemoryLog
from raftmq.raftlog.record import RoleChange
from tests.harness.local_cluster import free_ports
from tests.harness.procs import wait_until

MEMBERS = (
    "n0=127.0.0.1:10911/127.0.0.1:20911,"
    "n1=127.0.0.1:10912/127.0.0.1:20912,"
    "n2=127.0.0.1:10913/127.0.0.1:20913"
)


class Recorder(controller_pb2_grpc.ControllerServicer):
    def __init__(self) -> None:
        self.reports: list[controller_pb2.ReportRoleRequest] = []
        self.lock = threading.Lock()

    def ReportRole(
        self, request: controller_pb2.ReportRoleRequest, context: grpc.ServicerContext
    ) -> controller_pb2.ReportRoleResponse:
        with self.lock:
            self.reports.append(request)
        return controller_pb2.ReportRoleResponse(accepted=True, leader_node_id=request.node_id)

    def leader_terms(self) -> list[int]:
        with self.lock:
            return [r.term for r in self.reports if r.role == common_pb2.LEADER]


@pytest.fixture
def controller() -> Iterator[tuple[str, Recorder]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    recorder = Recorder()
    controller_pb2_grpc.add_ControllerServicer_to_server(recorder, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", recorder
    finally:
        server.stop(0).wait()


def settings(data_dir: Path, controller: str) -> BrokerSettings:
    (namesrv,) = free_ports(1)  # nothing listens there: registration just fails, quietly
    return BrokerSettings(
        node_id="n0",
        members=MEMBERS,
        data_dir=data_dir,
        controller_addresses=controller,
        namesrv_addresses=f"127.0.0.1:{namesrv}",
        store_map_size_bytes=64 << 20,
    )


def factory(log: MemoryLog, node_class: type[BrokerNode]) -> Callable[[BrokerSettings], BrokerNode]:
    def build(s: BrokerSettings) -> BrokerNode:
        return node_class(s, log, MessageStore(s.data_dir / "store", map_size_bytes=64 << 20))

    return build


def test_a_role_won_before_the_listener_exists_is_reported(
    tmp_path: Path, controller: tuple[str, Recorder]
) -> None:
    address, recorder = controller
    log = MemoryLog("127.0.0.1:20911", leader=False)

    class ElectedWhileBuilt(BrokerNode):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            log.become_leader()  # the election ends before BrokerServer wires its listener

    server = BrokerServer(settings(tmp_path, address), factory(log, ElectedWhileBuilt))
    try:
        wait_until(lambda: 1 in recorder.leader_terms(), 10, "the leader report of term 1")
    finally:
        server.reporter and server.reporter.close()
        server.node.close()


def test_a_role_change_right_after_the_listener_is_wired_is_reported(
    tmp_path: Path, controller: tuple[str, Recorder]
) -> None:
    address, recorder = controller
    log = MemoryLog("127.0.0.1:20911", leader=False)
    failures: list[BaseException] = []

    class ElectedWhileWired(BrokerNode):
        def add_role_listener(self, listener: Callable[[RoleChange], None]) -> None:
            super().add_role_listener(listener)

            def checked(change: RoleChange) -> None:
                try:
                    listener(change)
                except BaseException as exc:  # what the node's own guard would only log
                    failures.append(exc)

            self._role_listeners[-1] = checked
            log.become_leader()  # Raft runs: the change can land at once

    server = BrokerServer(settings(tmp_path, address), factory(log, ElectedWhileWired))
    try:
        assert failures == []
        wait_until(lambda: 1 in recorder.leader_terms(), 10, "the leader report of term 1")
    finally:
        server.reporter and server.reporter.close()
        server.node.close()
