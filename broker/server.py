"""The broker node process: `raftmq-broker [--config FILE] [--<key> VALUE ...]` (or
`python -m raftmq.broker.server`).

Runs one node of a broker group: the replicated log, the dispatcher, the gRPC Broker service, the
framed data path (broker/data_server.py) and the NameServer registration. Once serving it prints
`broker.started listen=HOST:PORT node=ID group=GROUP data=HOST:PORT` to stdout (data= is empty
when data_listen is "off"). SIGTERM or SIGINT: hand leadership off, unregister, exit 0.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from pathlib import Path

import grpc

from raftmq.broker import settings as settings_mod
from raftmq.broker.convert import topic_to_pb
from raftmq.broker.data_server import DataServer
from raftmq.broker.metrics import readiness
from raftmq.broker.node import BrokerNode, build_broker_node
from raftmq.broker.registration import Registrar
from raftmq.broker.role_reporter import RoleReporter
from raftmq.broker.service import ROLE_TO_PB, BrokerService
from raftmq.broker.settings import BrokerSettings
from raftmq.broker.transactions_service import TRANSACTION_SERVICE, TransactionService
from raftmq.broker.transactions_shell import TransactionShell
from raftmq.common import tls
from raftmq.common.acl_sync import NodeSecurity
from raftmq.common.call_shares import CallShares, per_address_cap
from raftmq.common.grpc_options import SERVER_LIVENESS
from raftmq.common.grpc_service import add_servicer
from raftmq.common.metrics_http import MetricsServer, start_metrics
from raftmq.common.pb import broker_pb2, common_pb2, namesrv_pb2
from raftmq.common.process import SettingsSection, parse_one_section, run_role
from raftmq.common.topic_config import Permission, TopicConfig
from raftmq.raftlog.record import Role, RoleChange

_log = logging.getLogger("broker")
BROKER_SERVICE = broker_pb2.DESCRIPTOR.services_by_name["Broker"]

WIRE_OVERHEAD_BYTES = 1 << 20  # request framing and properties beyond the message bodies
UNREACHABLE_WARN_HEARTBEATS = 3  # no controller answered for this many heartbeats: say so,
UNREACHABLE_WARN_MAX_MS = 10_000  # or for this long, whichever is shorter


class BrokerServer:
    """A BrokerNode behind a gRPC server, registered with the NameServers. Build it on the main
    thread; start() then stop(), once each."""

    def __init__(
        self,
        settings: BrokerSettings,
        node_factory: Callable[[BrokerSettings], BrokerNode] = build_broker_node,
    ) -> None:
        self.settings = settings
        # issue 19: signs this node's calls, checks every request when auth is on
        self.security = NodeSecurity.for_settings(settings, settings.controller_list)
        # Order matters: the Raft log runs (and may win or lose an election) from the moment
        # node_factory builds it, so everything the role listener calls exists before the node,
        # and the role the node reached before its listener was registered is reported after.
        self.reporter = (
            RoleReporter(
                settings.controller_list,
                unreachable_warn_ms=min(
                    UNREACHABLE_WARN_HEARTBEATS * settings.heartbeat_interval_ms,
                    UNREACHABLE_WARN_MAX_MS,
                ),
                signer=self.security.signer,
            )
            if settings.controller_list
            else None
        )
        self.address = ""
        self.data_address = ""  # advertised once bound
        self.registrar = Registrar(
            settings.namesrv_list,
            self._registration,
            settings.heartbeat_interval_ms,
            self.security.signer,
        )
        self.node = node_factory(settings)
        wire_max = 2 * settings.max_message_bytes + WIRE_OVERHEAD_BYTES
        self._server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=settings.max_workers, thread_name_prefix="broker-rpc"
            ),
            options=[
                ("grpc.max_receive_message_length", wire_max),
                ("grpc.max_send_message_length", max(wire_max, settings.pull_max_bytes * 2)),
                ("grpc.so_reuseport", 0),
                *SERVER_LIVENESS,
            ],
            maximum_concurrent_rpcs=settings.max_workers * 4,
            interceptors=[
                *self.node.metrics.grpc_interceptors(),
                CallShares(
                    per_address_cap(settings.rpc_max_calls_per_address, settings.max_workers)
                ),
                *self.security.interceptors([BROKER_SERVICE, TRANSACTION_SERVICE]),
            ],
        )
        self.metrics: MetricsServer | None = None
        self.metrics_address = ""
        add_servicer(self._server, BrokerService(self.node), BROKER_SERVICE)
        self.transactions = TransactionShell(self.node, self.node.transactions)
        add_servicer(self._server, TransactionService(self.transactions), TRANSACTION_SERVICE)
        self.data_server = (
            DataServer(self.node, settings, self.transactions, self.security.guard)
            if settings.data_bind
            else None
        )
        self.node.add_role_listener(self._on_role_change)
        self.node.add_topic_listener(self.registrar.poke)
        st = self.node.status()  # the role reached before the listener existed
        self._on_role_change(RoleChange(st.node_id, st.role, st.term, st.leader))

    def _registration(self) -> namesrv_pb2.RegisterBrokerRequest:
        st = self.node.status()
        if self.reporter is not None and st.role is not Role.CANDIDATE:
            # Re-reported every heartbeat: a controller that restarted or lost a push learns
            # the leader again, and the controller leader knows which nodes are alive (leader
            # balancing hands leadership only to those). A report that changes nothing is
            # answered without touching the controllers' log.
            me = self.node.me
            self.reporter.report(
                self.settings.cluster,
                self.node.group,
                me.node_id,
                me.address,
                st.term,
                st.role is Role.LEADER,
            )
        return namesrv_pb2.RegisterBrokerRequest(
            cluster=self.settings.cluster,
            broker_group=self.node.group,
            node_id=self.node.me.node_id,
            address=self.node.me.address,
            raft_address=self.node.me.raft_address,
            role=ROLE_TO_PB.get(st.role, common_pb2.ROLE_UNSPECIFIED),
            term=st.term,
            topics=registered_topics(self.node.topics(), self.node.settings.accept_sends),
            data_address=self.data_address,
        )

    def _on_role_change(self, change: RoleChange) -> None:
        self.registrar.poke()
        if self.reporter is not None and change.role is not Role.CANDIDATE:
            me = self.node.me
            self.reporter.report(
                self.settings.cluster,
                self.node.group,
                me.node_id,
                me.address,
                change.term,
                change.role is Role.LEADER,
            )

    def start(self) -> str:
        listen = self.settings.listen or self.node.me.address
        host = listen.rpartition(":")[0]
        try:
            port = tls.add_port(self._server, listen)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {listen}: {exc}") from exc
        if port == 0:
            raise OSError(f"cannot listen on {listen} (address in use?)")
        self.security.start()
        self.node.start()
        self.transactions.start()
        if self.data_server is not None:
            bind = self.settings.data_bind
            assert bind is not None
            try:
                self.data_address = self.data_server.start(*bind)
            except OSError as exc:
                raise OSError(f"cannot listen on {bind[0]}:{bind[1]} (data_listen): {exc}") from exc
        node = self.node
        self.metrics = start_metrics(
            self.settings.metrics_listen,
            node.metrics.registry,
            lambda: readiness(node),
            "broker",
            self.settings,
        )
        self.metrics_address = self.metrics.address if self.metrics is not None else ""
        self._server.start()
        self.registrar.start()
        self.address = f"{host}:{port}"
        return self.address

    def stop(self) -> None:
        # Hand leadership off first so writers move on without errors, then stop serving.
        if self.node.rlog.is_leader():
            try:
                self.node.rlog.transfer_leadership(timeout_s=2.0)
            except Exception:
                _log.exception("broker.transfer_on_stop_failed")
        grace_s = self.settings.shutdown_grace_ms / 1000
        self.transactions.stop()  # held check polls answer at once
        grpc_stopped = self._server.stop(grace_s)
        if self.data_server is not None:
            self.data_server.stop(grace_s)  # held pulls answer at once; in-flight calls finish
        grpc_stopped.wait()
        self.registrar.stop(
            namesrv_pb2.UnregisterBrokerRequest(
                cluster=self.settings.cluster,
                broker_group=self.node.group,
                node_id=self.node.me.node_id,
            )
        )
        if self.reporter is not None:
            self.reporter.close()
        if self.metrics is not None:
            self.metrics.stop()
        self.security.close()
        self.node.close()


SECTION = SettingsSection(BrokerSettings, settings_mod.ENV_PREFIX)
DESCRIPTION = "raftmq broker node: one member of a Raft-replicated broker group."


def registered_topics(
    topics: Iterable[TopicConfig], accept_sends: bool
) -> list[common_pb2.TopicConfig]:
    """The topic table as the NameServers are told it: read-only everywhere while this node
    does not accept sends (mqadmin's wipeWritePerm), so routes steer producers elsewhere."""
    if not accept_sends:
        topics = [dataclasses.replace(t, perm=t.perm & ~Permission.WRITE) for t in topics]
    return [topic_to_pb(t) for t in topics]


def parse_args(argv: Sequence[str] | None) -> tuple[Path | None, dict[str, object]]:
    return parse_one_section("raftmq-broker", DESCRIPTION, SECTION, argv)


def main(argv: Sequence[str] | None = None) -> int:
    return run_role("broker", lambda: settings_mod.load(*parse_args(argv)), serve)


def serve(settings: BrokerSettings, stop: threading.Event) -> int:
    if settings.debug_ack_before_commit:
        _log.critical(
            "broker.debug_ack_before_commit=true: sends are acknowledged BEFORE the majority "
            "commit and can be lost; never use this outside the chaos suite's self-test"
        )
    server = BrokerServer(settings)
    try:
        address = server.start()
    except OSError as exc:
        _log.error("broker.listen_failed error=%s", exc)
        server.node.close()
        return 1
    _log.info(
        "broker.started listen=%s data=%s node=%s group=%s members=%s",
        address,
        server.data_address,
        settings.node_id,
        settings.broker_group,
        settings.members,
    )
    print(
        f"broker.started listen={address} node={settings.node_id} group={settings.broker_group} "
        f"data={server.data_address}"
        + (f" metrics={server.metrics_address}" if server.metrics_address else ""),
        flush=True,
    )
    while not stop.wait(0.5):
        failure = server.node.dispatcher.failure
        if failure is not None:
            _log.critical("broker.dispatcher_failed error=%s; stopping", failure)
            server.node.outcomes.fail(failure)
            server.stop()
            return 1
    server.stop()
    _log.info("broker.stopped listen=%s", address)
    return 0


if __name__ == "__main__":
    sys.exit(main())
