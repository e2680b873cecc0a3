"""RoleReporter: a broker node tells the controllers its role and term. Non-blocking for the
caller: the latest report waits in a one-slot mailbox and a thread delivers it to the controller
leader (following NOT_LEADER hints), with bounded back-off; a newer report replaces an older one
of the same or a lower term."""

from __future__ import annotations

import logging
import threading

import grpc

from raftmq.common.errors import NotLeaderError, from_rpc_error
from raftmq.common.grpc_options import CHANNEL_LIVENESS
from raftmq.common.pb import common_pb2, controller_pb2, controller_pb2_grpc

log = logging.getLogger("broker.reporter")
CALL_TIMEOUT_S = 3.0


class RoleReporter:
    def __init__(self, controller_addresses: tuple[str, ...]) -> None:
        self._addresses = list(controller_addresses)
        self._channels = {
            a: grpc.insecure_channel(a, options=CHANNEL_LIVENESS) for a in self._addresses
        }
        self._leader = self._addresses[0] if self._addresses else ""
        self._cond = threading.Condition()
        self._pending: controller_pb2.ReportRoleRequest | None = None
        self._latest_term = 0  # reports of an older term are stale by construction
        self._closed = False
        self.last_response: controller_pb2.ReportRoleResponse | None = None
        self._thread = threading.Thread(target=self._run, name="role-reporter", daemon=True)
        self._thread.start()

    def report(
        self, cluster: str, group: str, node_id: str, address: str, term: int, leader: bool
    ) -> None:
        req = controller_pb2.ReportRoleRequest(
            cluster=cluster,
            broker_group=group,
            node_id=node_id,
            address=address,
            term=term,
            role=common_pb2.LEADER if leader else common_pb2.FOLLOWER,
        )
        with self._cond:
            if term < self._latest_term:
                return  # a heartbeat that read the role just before a newer change: keep that
            self._latest_term = term
            self._pending = req
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=CALL_TIMEOUT_S + 1)
        for ch in self._channels.values():
            ch.close()

    def _run(self) -> None:
        backoff = 0.05
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                req = self._pending
                self._pending = None
            assert req is not None
            if self._deliver(req):
                backoff = 0.05
                continue
            with self._cond:
                if self._pending is None:
                    self._pending = req  # retry unless a newer report arrived
                self._cond.wait(backoff)
            backoff = min(backoff * 2, 2.0)

    def _deliver(self, req: controller_pb2.ReportRoleRequest) -> bool:
        tried: set[str] = set()
        address = self._leader
        while address and address not in tried:
            tried.add(address)
            stub = controller_pb2_grpc.ControllerStub(self._channel(address))
            try:
                out = stub.ReportRole(req, timeout=CALL_TIMEOUT_S)
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                if isinstance(err, NotLeaderError) and err.leader_hint:
                    address = err.leader_hint
                    continue
                address = next((a for a in self._addresses if a not in tried), "")
                continue
            self._leader = address
            self.last_response = out
            if not out.accepted:
                log.info(
                    "broker.role_report_refused group=%s node=%s term=%d reason=%s",
                    req.broker_group,
                    req.node_id,
                    req.term,
                    out.reason,
                )
            return True
        return False

    def _channel(self, address: str) -> grpc.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = grpc.insecure_channel(address, options=CHANNEL_LIVENESS)
        return ch
