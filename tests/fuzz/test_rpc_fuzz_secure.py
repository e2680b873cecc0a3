"""The RPC fuzzer (tests/fuzz/test_rpc_fuzz.py) against a cluster with [security.auth] on
(issue 19): every method of the Broker, transactions, NameServer and controller fed hostile
requests, unsigned and signed as a user whose policy allows only `Pub` on `fuzz-ok*` and `Sub`
on `Group:fuzz-g`. No request may pass a check it should fail: unsigned ones are all refused
with UNAUTHENTICATED; a signed one that the pure decision (common/acl.py + the RPC table)
denies must be answered PERMISSION_DENIED, whatever else is wrong with it. The control plane's
forged registrations and leader pushes (the gap the open fuzzer avoids) are among them: super
users only. No process dies or logs a traceback."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq import Admin
from raftmq.common.acl import Acl, Decision, User, UserType, authorize, parse_entries
from raftmq.common.auth import Credentials, Signer
from raftmq.common.errors import ERROR_DETAIL_KEY
from raftmq.common.pb import (
    broker_pb2,
    broker_pb2_grpc,
    controller_pb2,
    namesrv_pb2,
    transaction_pb2,
)
from raftmq.common.rpc_acl import RULES, SUPER
from tests.fuzz.test_rpc_fuzz import EXAMPLES, _check, _payload
from tests.harness.procs import (
    Cluster,
    GroupLayout,
    broker_procs,
    free_ports,
    namesrv_proc,
    wait_until,
)

ADMIN = Credentials("fuzz-admin", "fuzz-admin-secret")
USER = Credentials("fuzzer", "fuzzer-secret")
POLICY = parse_entries(["Topic:fuzz-ok*=Pub", "Group:fuzz-g=Sub"])
# The ACL as the nodes hold it, for the model
MODEL = Acl(1, {"fuzzer": User("fuzzer", USER.secret_key)}, {"fuzzer": POLICY})
ADMIN_USER = User(ADMIN.access_key, ADMIN.secret_key, UserType.SUPER)
GROUP = "broker-a"
AUTH = [
    "--auth-enabled", "--auth-admin-access-key", ADMIN.access_key,
    "--auth-admin-secret-key", ADMIN.secret_key, "--acl-refresh-ms", "300",
]  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str]]:
    tmp = tmp_path_factory.mktemp("fuzz-secure")
    ns_port, ctl_raft, *rest = free_ports(11)
    ns_addr = f"127.0.0.1:{ns_port}"
    ns = namesrv_proc(
        tmp,
        "ns0",
        ns_port,
        [
            "--broker-expiry-ms", "5000", "--scan-interval-ms", "200", "--enable-controller",
            "--controller-node-id", "c0", "--controller-raft-address", f"127.0.0.1:{ctl_raft}",
            "--controller-data-dir", str(tmp / "ctl"), "--controller-namesrv-addresses", ns_addr,
            "--no-controller-balance-leaders", *AUTH,
            *("--controller" + a[1:] if a.startswith("--") else a for a in AUTH),
        ],
    )  # fmt: skip
    layout = GroupLayout(GROUP, rest[:3], rest[3:6], rest[6:9])
    brokers = broker_procs(tmp, layout, [ns_addr], ["--controller-addresses", ns_addr, *AUTH])
    c = Cluster(tmp, [ns], [ns_addr], {GROUP: (layout, brokers)})
    try:
        ns.start("namesrv.started")
        for p in brokers:
            p.start("broker.started")
        with Admin(ns_addr, credentials=ADMIN, controllers=ns_addr) as admin:
            wait_until(lambda: any(g.leader_address for g in admin.groups()), 60, "a leader")
            admin.create_topic("fuzz-ok", queues=2)
            admin.acl.create_user(USER.access_key, USER.secret_key)
            admin.acl.set_policy(USER.access_key, POLICY)
        wait_until(lambda: _knows_user(layout), 30, "the fuzz user on every broker")
        yield c, ns_addr
    finally:
        c.close()


def _knows_user(layout: GroupLayout) -> bool:
    for i in range(3):
        with grpc.insecure_channel(layout.address(i)) as ch:
            try:
                broker_pb2_grpc.BrokerStub(ch).GetQueueBounds(
                    broker_pb2.GetQueueBoundsRequest(topic="fuzz-g-not", queue_id=0),
                    timeout=3,
                    metadata=Signer(USER).metadata(),
                )
            except grpc.RpcError as err:
                if err.code() is grpc.StatusCode.UNAUTHENTICATED:
                    return False
    return True


def _should_deny(path: str, request_type: type, payload: bytes) -> bool | None:
    """The model: True if the decision must refuse it, False if it may pass, None if it does
    not parse (then it must fail anyway, with whatever status)."""
    try:
        req = request_type.FromString(payload)
    except (DecodeError, ValueError):
        return None
    for need in RULES[path](req):
        action, resource = need
        if need == SUPER[0]:
            return True
        actions = action if isinstance(action, frozenset) else {action}
        if not any(
            authorize(MODEL, "fuzzer", a, resource, ADMIN_USER) is Decision.ALLOW for a in actions
        ):
            return True
    return False


def _fuzz(addresses: list[str], service: ServiceDescriptor, stats: dict[str, int]) -> None:
    for method in service.methods:
        _fuzz_method(addresses, service, method, stats)


def _fuzz_method(
    addresses: list[str], service: ServiceDescriptor, method: Any, stats: dict[str, int]
) -> None:
    path = f"/{service.full_name}/{method.name}"
    request_type = GetMessageClass(method.input_type)

    @settings(
        max_examples=max(10, EXAMPLES // 2),  # x2: signed or not; keeps the file near 30 s
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    # control_plane=False: the real group is named too; forged registrations must be refused
    @given(payload=_payload(method, False), signed=st.booleans())
    def one(payload: bytes, signed: bool) -> None:
        with grpc.insecure_channel(random.choice(addresses)) as ch:
            call = ch.unary_unary(path)
            md = Signer(USER).metadata() if signed else None
            handled = True  # a server handler ran (answered, or raised a table error)
            try:
                call(payload, timeout=2.0, metadata=md)
                outcome = grpc.StatusCode.OK
            except grpc.RpcError as err:
                _check(service.name, method.name, err)
                outcome = err.code()
                handled = ERROR_DETAIL_KEY in dict(err.trailing_metadata() or ())
        if outcome is grpc.StatusCode.DEADLINE_EXCEEDED:
            return  # no verdict in time; nothing passed
        if not signed:
            assert outcome is grpc.StatusCode.UNAUTHENTICATED, f"{path} unsigned: {outcome}"
            stats["unsigned"] += 1
            return
        deny = _should_deny(path, request_type, payload)
        if deny:
            # refused by the check, or by grpc itself before any handler (a size limit)
            refused = outcome is grpc.StatusCode.PERMISSION_DENIED or not handled
            assert refused, f"{path} passed its check: {outcome}"
            stats["denied"] += 1
        elif deny is None:
            assert outcome is not grpc.StatusCode.OK, f"{path}: garbage accepted"
        else:
            stats["allowed"] += 1

    one()


def test_no_fuzzed_request_passes_a_check_it_should_fail(cluster: tuple[Cluster, str]) -> None:
    c, ns = cluster
    layout, _ = c.groups[GROUP]
    brokers = [layout.address(i) for i in range(3)]
    stats = {"unsigned": 0, "denied": 0, "allowed": 0}
    _fuzz(brokers, broker_pb2.DESCRIPTOR.services_by_name["Broker"], stats)
    _fuzz(brokers, transaction_pb2.DESCRIPTOR.services_by_name["BrokerTransaction"], stats)
    _fuzz([ns], namesrv_pb2.DESCRIPTOR.services_by_name["NameServer"], stats)
    _fuzz([ns], controller_pb2.DESCRIPTOR.services_by_name["Controller"], stats)
    assert stats["unsigned"] > 100 and stats["denied"] > 100, stats
    for p in c.procs():
        assert p.popen is not None and p.popen.poll() is None, f"{p.name} died"
        text = Path(p.log).read_text(errors="replace")
        assert "Traceback" not in text, f"{p.name} logged a traceback:\n{text[-3000:]}"
    # the real group's route is still the real leader's: no forged registration got through
    with Admin(ns, credentials=ADMIN) as admin:
        [g] = [g for g in admin.groups() if g.broker_group == GROUP]
        assert g.leader_address in brokers
