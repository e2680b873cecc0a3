"""RoleReporter: a broker node tells the controllers its role and term. Non-blocking for the
caller: the latest report waits in a one-slot mailbox and a thread delivers it to the controller
leader (following NOT_LEADER hints), with bounded back-off; a newer report replaces an older one
of the same or a lower term.

A broker whose reports reach no controller for longer than `unreachable_warn_ms` says so once
(WARNING, naming the controllers and for how long) and once more when one answers again: such a
leader keeps serving, but failover routing through the controllers no longer knows it."""

from __future__ import annotations

import logging
import threading
import time

import grpc

from raftmq.common import tls
from raftmq.common.auth import Signer, call_metadata
from raftmq.common.errors import NotLeaderError, from_rpc_error
from raftmq.common.grpc_options import CHANNEL_LIVENESS
from raftmq.common.pb import common_pb2, controller_pb2, controller_pb2_grpc

log = logging.getLogger("broker.reporter")
CALL_TIMEOUT_S = 3.0
DEFAULT_UNREACHABLE_WARN_MS = 10_000


class ReachabilityWatch:
    """When to say that no controller answers: once per outage, after `warn_after_ms` of nothing
    but failures, and once when one answers again. Plain values in and out (now_ms passed in)."""

    def __init__(self, warn_after_ms: int) -> None:
        self.warn_after_ms = warn_after_ms
        self.failing_since_ms: int | None = None  # first failure after the last success
        self.warned = False

    def failed(self, now_ms: int) -> int | None:
        """A round over every controller failed; the outage's length in ms when it is time to
        warn (once per outage), else None."""
        if self.failing_since_ms is None:
            self.failing_since_ms = now_ms
        outage_ms = now_ms - self.failing_since_ms
        if not self.warned and outage_ms >= self.warn_after_ms:
            self.warned = True
            return outage_ms
        return None

    def succeeded(self, now_ms: int) -> int | None:
        """A report was answered; the outage's length in ms if it had been warned about."""
        since, warned = self.failing_since_ms, self.warned
        self.failing_since_ms, self.warned = None, False
        return now_ms - since if warned and since is not None else None


class RoleReporter:
    def __init__(
        self,
        controller_addresses: tuple[str, ...],
        unreachable_warn_ms: int = DEFAULT_UNREACHABLE_WARN_MS,
        signer: Signer | None = None,
    ) -> None:
        self._signer = signer  # signs the reports when auth is on (issue 19)
        self._addresses = list(controller_addresses)
        self._watch = ReachabilityWatch(unreachable_warn_ms)
        self._last_error = ""
        self._channels = {a: tls.channel(a, CHANNEL_LIVENESS) for a in self._addresses}
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
                outage_ms = self._watch.succeeded(_now_ms())
                if outage_ms is not None:
                    log.info(
                        "broker.controllers_reachable group=%s node=%s controller=%s "
                        "unreachable_ms=%d",
                        req.broker_group,
                        req.node_id,
                        self._leader,
                        outage_ms,
                    )
                backoff = 0.05
                continue
            outage_ms = self._watch.failed(_now_ms())
            if outage_ms is not None:
                log.warning(
                    "broker.controllers_unreachable group=%s node=%s controllers=%s "
                    "unreachable_ms=%d last_error=%s: role reports reach no controller; "
                    "this node keeps serving, but failover routing does not know its role",
                    req.broker_group,
                    req.node_id,
                    ",".join(self._addresses),
                    outage_ms,
                    self._last_error,
                )
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
                out = stub.ReportRole(
                    req, timeout=CALL_TIMEOUT_S, metadata=call_metadata(self._signer)
                )
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                self._last_error = f"{address}:{_code(exc)}"
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
            ch = self._channels[address] = tls.channel(address, CHANNEL_LIVENESS)
        return ch


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _code(exc: grpc.RpcError) -> str:
    code = getattr(exc, "code", None)
    value = code() if callable(code) else None
    return value.name if isinstance(value, grpc.StatusCode) else type(exc).__name__
