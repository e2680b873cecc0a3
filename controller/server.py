"""The controller process: `raftmq-controller [--config FILE] [--<key> VALUE ...]` (or
`python -m raftmq.controller.server`). Prints `controller.started listen=HOST:PORT node=ID` once
serving; SIGTERM or SIGINT exits cleanly."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from raftmq.common import tls
from raftmq.common.acl import PolicyEntry, check_name, make_user
from raftmq.common.acl_sync import auth_config_of
from raftmq.common.auth_guard import AuthInterceptor, Guard
from raftmq.common.call_shares import CallShares, per_address_cap
from raftmq.common.errors import (
    InvalidArgumentError,
    NotLeaderError,
    UnsupportedError,
    rpc_errors,
)
from raftmq.common.grpc_options import SERVER_LIVENESS
from raftmq.common.grpc_service import add_servicer
from raftmq.common.metrics_http import start_metrics
from raftmq.common.pb import common_pb2, controller_pb2, controller_pb2_grpc
from raftmq.common.process import SettingsSection, parse_one_section, run_role
from raftmq.controller import settings as settings_mod
from raftmq.controller.acl_state import AclCommand
from raftmq.controller.metrics import ControllerMetrics, readiness
from raftmq.controller.node import ControllerNode
from raftmq.controller.settings import ControllerSettings
from raftmq.controller.state import RoleReport
from raftmq.raftlog.record import Role

HANDLER_THREADS = 16  # gRPC handler threads (control-plane calls take milliseconds)

_log = logging.getLogger("controller")
CONTROLLER_SERVICE = controller_pb2.DESCRIPTOR.services_by_name["Controller"]
_ROLE_TO_PB = {
    Role.LEADER: common_pb2.LEADER,
    Role.FOLLOWER: common_pb2.FOLLOWER,
    Role.CANDIDATE: common_pb2.CANDIDATE,
}


class ControllerService(controller_pb2_grpc.ControllerServicer):
    def __init__(self, node: ControllerNode) -> None:
        self.node = node

    @rpc_errors
    def ReportRole(
        self, request: controller_pb2.ReportRoleRequest, context: grpc.ServicerContext
    ) -> controller_pb2.ReportRoleResponse:
        if not request.broker_group or not request.node_id or request.term < 0:
            raise InvalidArgumentError("a role report needs broker_group, node_id and term >= 0")
        v = self.node.report(
            RoleReport(
                request.broker_group,
                request.node_id,
                request.address,
                request.term,
                request.role == common_pb2.LEADER,
                time.time_ns() // 1_000_000,
            )
        )
        return controller_pb2.ReportRoleResponse(
            accepted=v.accepted,
            reason=v.reason,
            leader_node_id=v.leader_node_id,
            term=v.term,
            epoch=v.epoch,
        )

    @rpc_errors
    def GetAlerts(
        self, request: controller_pb2.GetAlertsRequest, context: grpc.ServicerContext
    ) -> controller_pb2.GetAlertsResponse:
        node = self.node
        if not node.rlog.is_leader_ready():
            _, address = node.leader()
            hint = "" if address == node.settings.listen else address
            raise NotLeaderError.for_node(node.settings.node_id, "controllers", hint)
        active, events = node.alarms.snapshot()
        return controller_pb2.GetAlertsResponse(
            rules=[r.name for r in node.alarms.rules],
            active=[
                controller_pb2.Alert(
                    rule=a.rule,
                    subject=a.subject,
                    state=a.state.value,
                    since_ms=a.since_ms,
                    value=a.value,
                )
                for a in active
            ],
            events=[
                controller_pb2.AlertEvent(
                    seq=e.seq,
                    status=e.status,
                    rule=e.rule,
                    subject=e.subject,
                    value=e.value,
                    at_ms=e.at_ms,
                    since_ms=e.since_ms,
                )
                for e in events
            ],
            node_id=node.settings.node_id,
        )

    @rpc_errors
    def GetControllerStatus(
        self, request: controller_pb2.GetControllerStatusRequest, context: grpc.ServicerContext
    ) -> controller_pb2.ControllerStatus:
        st = self.node.rlog.status()
        leader_id, _ = self.node.leader()
        return controller_pb2.ControllerStatus(
            node_id=self.node.settings.node_id,
            role=_ROLE_TO_PB.get(st.role, common_pb2.ROLE_UNSPECIFIED),
            leader_node_id=leader_id,
            term=st.term,
            applied_index=self.node.applied,
            groups=[
                controller_pb2.GroupRecord(
                    broker_group=g.broker_group,
                    leader_node_id=g.leader_node_id,
                    leader_address=g.leader_address,
                    term=g.term,
                    epoch=g.epoch,
                    changed_ms=g.changed_ms,
                    members=g.members,
                )
                for g in self.node.records()
            ],
        )

    # ---- users and policies (issue 19) ---------------------------------------------------------

    def _auth_on(self) -> None:
        """Users and policies are managed only where they are enforced: on an open cluster
        anyone could plant a super user that would hold once auth is switched on."""
        if self.node.signer is None:
            raise UnsupportedError(
                "auth is off on this controller: enable [security.auth] (auth_enabled) first; "
                "the admin user from the cluster description then manages users and policies"
            )

    def _acl_change(self, command: AclCommand) -> controller_pb2.AclChangeResponse:
        self._auth_on()
        v = self.node.commit_acl(command)
        if not v.accepted:
            raise InvalidArgumentError(v.reason)
        return controller_pb2.AclChangeResponse(version=v.epoch)

    @rpc_errors
    def PutUser(
        self, request: controller_pb2.PutUserRequest, context: grpc.ServicerContext
    ) -> controller_pb2.AclChangeResponse:
        self._auth_on()
        u = request.user
        user = make_user(u.name, u.secret, u.type or "Normal")
        mode = {controller_pb2.PUT_CREATE: "create", controller_pb2.PUT_UPDATE: "update"}
        return self._acl_change(
            AclCommand("put_user", user.name, user, mode.get(request.mode, "upsert"))
        )

    @rpc_errors
    def DeleteUser(
        self, request: controller_pb2.DeleteUserRequest, context: grpc.ServicerContext
    ) -> controller_pb2.AclChangeResponse:
        return self._acl_change(AclCommand("delete_user", check_name(request.name)))

    @rpc_errors
    def SetPolicy(
        self, request: controller_pb2.SetPolicyRequest, context: grpc.ServicerContext
    ) -> controller_pb2.AclChangeResponse:
        entries = tuple(
            PolicyEntry.from_dict(
                {"resource": e.resource, "actions": list(e.actions), "decision": e.decision}
            )
            for e in request.entries
        )
        if not entries:
            raise InvalidArgumentError("a policy needs at least one entry; delete it instead")
        return self._acl_change(
            AclCommand("set_policy", check_name(request.subject), entries=entries)
        )

    @rpc_errors
    def DeletePolicy(
        self, request: controller_pb2.DeletePolicyRequest, context: grpc.ServicerContext
    ) -> controller_pb2.AclChangeResponse:
        return self._acl_change(AclCommand("delete_policy", check_name(request.subject)))

    @rpc_errors
    def GetAcl(
        self, request: controller_pb2.GetAclRequest, context: grpc.ServicerContext
    ) -> controller_pb2.GetAclResponse:
        self._auth_on()
        acl = self.node.acl()
        if request.known_version == acl.version:
            return controller_pb2.GetAclResponse(version=acl.version, unchanged=True)
        return controller_pb2.GetAclResponse(version=acl.version, snapshot=acl.to_json())


SECTION = SettingsSection(ControllerSettings, settings_mod.ENV_PREFIX)
DESCRIPTION = "raftmq controller: replicated record of broker group leaders."


def parse_args(argv: Sequence[str] | None) -> tuple[Path | None, dict[str, object]]:
    return parse_one_section("raftmq-controller", DESCRIPTION, SECTION, argv)


def main(argv: Sequence[str] | None = None) -> int:
    return run_role("controller", lambda: settings_mod.load(*parse_args(argv)), serve)


def serve(settings: ControllerSettings, stop: threading.Event) -> int:
    try:
        auth = auth_config_of(settings)
    except ValueError as exc:
        _log.error("controller.bad_settings error=%s", exc)
        return 2
    node = ControllerNode(settings)
    metrics = ControllerMetrics(node, CollectorRegistry(auto_describe=False))
    assert metrics.rpc is not None
    interceptors: list[grpc.ServerInterceptor[Any, Any]] = [
        metrics.rpc.interceptor(),
        CallShares(per_address_cap(settings.rpc_max_calls_per_address, HANDLER_THREADS)),
    ]
    if auth.enabled:  # the controller checks against its own replicated users and policies
        interceptors.append(AuthInterceptor(Guard(auth, node.acl), [CONTROLLER_SERVICE]))
    server = grpc.server(
        futures.ThreadPoolExecutor(
            max_workers=HANDLER_THREADS, thread_name_prefix="controller-rpc"
        ),
        options=[("grpc.so_reuseport", 0), *SERVER_LIVENESS],
        interceptors=interceptors,
    )
    add_servicer(server, ControllerService(node), CONTROLLER_SERVICE)
    try:
        port = tls.add_port(server, settings.listen)
    except RuntimeError as exc:
        _log.error("controller.listen_failed listen=%s error=%s", settings.listen, exc)
        node.close()
        return 1
    if port == 0:
        _log.error("controller.listen_failed listen=%s (address in use?)", settings.listen)
        node.close()
        return 1
    try:
        http = start_metrics(
            settings.metrics_listen,
            metrics.registry,
            lambda: readiness(node),
            "controller",
            settings,
        )
    except OSError as exc:
        _log.error("controller.listen_failed error=%s", exc)
        node.close()
        return 1
    node.start()
    server.start()
    address = f"{settings.listen.rpartition(':')[0]}:{port}"
    print(
        f"controller.started listen={address} node={settings.node_id}"
        + (f" metrics={http.address}" if http is not None else ""),
        flush=True,
    )
    while not stop.wait(0.5):
        pass
    server.stop(2).wait()
    if http is not None:
        http.stop()
    node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
