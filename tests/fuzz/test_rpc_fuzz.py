"""Every RPC of every role fed requests built from the proto descriptors with garbage, boundary
and out-of-range values (negative and huge numbers, empty, oversized and non-ASCII strings,
unknown enum values, undecodable bytes, invalid UTF-8, deadlines near 0), sent to a real running
cluster (a NameServer carrying an embedded controller and one broker group of three nodes).

Every answer must be success or a status of the error table with a message, never INTERNAL; no
process may die or log a traceback; afterwards the cluster still produces and consumes.
`RAFTMQ_FUZZ_EXAMPLES` sets the examples per method (CI: 25; `make test-slow` runs 20x that).

This cluster runs with auth off, where the control plane trusts its callers, so the fuzzer never
names the real broker group in NameServer/controller registration calls (a forged leader change
with a huge term would redirect routes until the real leader reports a higher one). With
[security.auth] on those calls are for super users only: tests/fuzz/test_rpc_fuzz_secure.py
fuzzes them with the real group's name and checks each is refused.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq import Admin, ConsumeResult, Producer, PushConsumer, StartFrom
from raftmq.common.errors import ERROR_DETAIL_KEY, ERROR_TABLE
from raftmq.common.pb import broker_pb2, common_pb2, controller_pb2, namesrv_pb2
from tests.harness.procs import (
    Cluster,
    GroupLayout,
    broker_procs,
    free_ports,
    namesrv_proc,
    wait_until,
)

FD = FieldDescriptor
EXAMPLES = int(os.environ.get("RAFTMQ_FUZZ_EXAMPLES", "25"))
CALL_TIMEOUT_S = 1.0
MAX_DEPTH = 3
# Statuses our servers answer with (the error table), plus the client's own deadline.
ALLOWED = {row.status for row in ERROR_TABLE} - {grpc.StatusCode.INTERNAL} | {
    grpc.StatusCode.DEADLINE_EXCEEDED
}
# Names the control plane must not be fed (see the module docstring).
REAL_GROUP = "broker-a"
CONTROL_PLANE = {"RegisterBroker", "UnregisterBroker", "PushLeaderChange", "ReportRole"}

INT32 = [0, 1, -1, 2**31 - 1, -(2**31), 7, 1 << 20]
INT64 = [*INT32, 2**63 - 1, -(2**63), 1 << 40]
UINT32 = [0, 1, 2**32 - 1, 1 << 31]
UINT64 = [*UINT32, 2**64 - 1, 1 << 63]
STRINGS = ["", " ", "fuzz", "a b", "%RETRY%g", "%DLQ%g", "RMQ_SYS_TRANS_HALF_TOPIC", "名前",
           "\x00", "x" * 300, "y" * 70_000, "TagA || TagB", "a = = 'b'", "a IN ()", "*",
           "127.0.0.1:99999", "localhost", "DefaultCluster", "n0"]  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str]]:
    tmp = tmp_path_factory.mktemp("fuzz")
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
            "--no-controller-balance-leaders",
        ],
    )  # fmt: skip
    layout = GroupLayout(REAL_GROUP, rest[:3], rest[3:6], rest[6:9])
    brokers = broker_procs(tmp, layout, [ns_addr], ["--controller-addresses", ns_addr])
    c = Cluster(tmp, [ns], [ns_addr], {REAL_GROUP: (layout, brokers)})
    try:
        ns.start("namesrv.started")
        for p in brokers:
            p.start("broker.started")
        with Admin(ns_addr) as admin:
            wait_until(lambda: any(g.leader_address for g in admin.groups()), 60, "a leader")
            admin.create_topic("fuzz", queues=2)
        yield c, ns_addr
    finally:
        c.close()


# ---- requests from descriptors ------------------------------------------------------------------


def _scalar(f: FieldDescriptor, control_plane: bool) -> st.SearchStrategy[Any]:
    t = f.type
    if t == FieldDescriptor.TYPE_STRING:
        names = [s for s in STRINGS if not (control_plane and s in ("DefaultCluster", "n0"))]
        if not control_plane:
            names.append(REAL_GROUP)
        return st.one_of(st.sampled_from(names), st.text(max_size=24))
    if t == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(b"\xff" * 70_000))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in f.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-3, 1000))  # open enums
    if t in (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32):
        return st.one_of(st.sampled_from(INT32), st.integers(-(2**31), 2**31 - 1))
    if t in (FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64):
        return st.one_of(st.sampled_from(INT64), st.integers(-(2**63), 2**63 - 1))
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.sampled_from(UINT32)
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.sampled_from(UINT64)
    raise AssertionError(f"field type {t} of {f.full_name} has no strategy")


def _is_map(f: FieldDescriptor) -> bool:
    return f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry


def _field(f: FieldDescriptor, depth: int, control_plane: bool) -> st.SearchStrategy[Any]:
    if _is_map(f):
        key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        return st.dictionaries(
            _scalar(key, control_plane), _value(value, depth, control_plane), max_size=4
        )
    one = _value(f, depth, control_plane)
    if f.is_repeated:
        return st.one_of(st.lists(one, max_size=3), st.lists(one, min_size=300, max_size=300))
    return one


def _value(f: FieldDescriptor, depth: int, control_plane: bool) -> st.SearchStrategy[Any]:
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        return _message(f.message_type, depth + 1, control_plane)
    return _scalar(f, control_plane)


def _message(desc: Descriptor, depth: int, control_plane: bool) -> st.SearchStrategy[Message]:
    cls = GetMessageClass(desc)
    if depth > MAX_DEPTH:
        return st.just(cls())
    fields = {
        f.name: _field(f, depth, control_plane)
        for f in desc.fields
        if not (f.type == FieldDescriptor.TYPE_MESSAGE and depth >= MAX_DEPTH and not _is_map(f))
    }

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = cls()
        for name, strategy in fields.items():
            if draw(st.booleans()):  # leave about half the fields unset
                continue
            value = draw(strategy)
            field = desc.fields_by_name[name]
            try:
                if _is_map(field):
                    getattr(msg, name).update(value)
                elif field.is_repeated:
                    getattr(msg, name).extend(value)
                elif field.type == FieldDescriptor.TYPE_MESSAGE:
                    getattr(msg, name).CopyFrom(value)
                else:
                    setattr(msg, name, value)
            except (ValueError, TypeError):
                pass  # a value protobuf itself refuses (e.g. a lone surrogate): not sendable
        return msg

    return build()


def _bad_utf8(desc: Descriptor) -> bytes:
    """A request whose first string field carries invalid UTF-8 (wire type 2, same number)."""
    for f in desc.fields:
        if f.type == FieldDescriptor.TYPE_STRING and f.number < 16:
            return bytes([f.number << 3 | 2, 3]) + b"\xff\xfe\xfd"
    return b"\xff\xff\xff\xff"


def _payload(method: Any, control_plane: bool) -> st.SearchStrategy[bytes]:
    desc = method.input_type
    return st.one_of(
        _message(desc, 0, control_plane).map(lambda m: m.SerializeToString()),
        _message(desc, 0, control_plane).map(lambda m: m.SerializeToString()),
        st.binary(max_size=64),  # anything at all
        st.just(_bad_utf8(desc)),
    )


# ---- the calls ----------------------------------------------------------------------------------


def _check(service: str, method: str, err: grpc.RpcError) -> None:
    code = err.code()
    where = f"{service}/{method}"
    assert code in ALLOWED, f"{where} answered {code}: {err.details()}"
    assert code != grpc.StatusCode.INTERNAL
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return  # our own short deadline
    assert err.details(), f"{where} answered {code} without a message"
    trailing = dict(err.trailing_metadata() or ())
    if code == grpc.StatusCode.UNKNOWN:  # only as the table's OUTCOME_UNKNOWN, never bare
        detail = common_pb2.ErrorDetail.FromString(trailing[ERROR_DETAIL_KEY])
        assert detail.code == common_pb2.OUTCOME_UNKNOWN, where


def _fuzz_method(
    addresses: list[str], service: ServiceDescriptor, method: Any, control: bool
) -> None:
    path = f"/{service.full_name}/{method.name}"

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(payload=_payload(method, control), tiny_deadline=st.booleans())
    def one(payload: bytes, tiny_deadline: bool) -> None:
        address = random.choice(addresses)
        with grpc.insecure_channel(address) as ch:
            call = ch.unary_unary(path)  # raw bytes both ways
            timeout = 0.001 if tiny_deadline and random.random() < 0.2 else CALL_TIMEOUT_S
            try:
                call(payload, timeout=timeout)
            except grpc.RpcError as err:
                _check(service.name, method.name, err)

    one()


def _fuzz_service(
    addresses: list[str], service: ServiceDescriptor, control_plane_methods: set[str]
) -> None:
    for method in service.methods:
        _fuzz_method(addresses, service, method, method.name in control_plane_methods)


def _no_tracebacks(c: Cluster) -> None:
    for p in c.procs():
        assert p.popen is not None and p.popen.poll() is None, f"{p.name} died"
        text = Path(p.log).read_text(errors="replace")
        assert "Traceback" not in text, f"{p.name} logged a traceback:\n{text[-3000:]}"


def _still_works(ns: str) -> None:
    topic = f"after-fuzz-{random.randrange(1 << 30)}"
    with Admin(ns) as admin:
        admin.create_topic(topic, queues=2)
        wait_until(lambda: len(admin.route(topic).write_queues()) == 2, 30, "the new topic")
    got: list[bytes] = []

    def listen(m: Any) -> ConsumeResult:
        got.append(m.body)
        return ConsumeResult.SUCCESS

    with Producer(ns) as p:
        sent = [p.send(topic, f"ok-{i}".encode()).msg_id for i in range(20)]
    with PushConsumer(ns, "g-after-fuzz", topic, listen, start_from=StartFrom.EARLIEST):
        wait_until(lambda: len(got) >= len(sent), 30, "the messages after the fuzz")
    assert sorted(got) == sorted(f"ok-{i}".encode() for i in range(20))


def test_every_rpc_answers_hostile_requests_with_a_table_status(
    cluster: tuple[Cluster, str],
) -> None:
    c, ns = cluster
    layout, _ = c.groups[REAL_GROUP]
    brokers = [layout.address(i) for i in range(3)]
    _fuzz_service(brokers, broker_pb2.DESCRIPTOR.services_by_name["Broker"], set())
    _fuzz_service([ns], namesrv_pb2.DESCRIPTOR.services_by_name["NameServer"], CONTROL_PLANE)
    _fuzz_service([ns], controller_pb2.DESCRIPTOR.services_by_name["Controller"], CONTROL_PLANE)
    _no_tracebacks(c)
    _still_works(ns)
    _no_tracebacks(c)


@pytest.mark.slow
def test_every_rpc_fuzzed_longer(cluster: tuple[Cluster, str]) -> None:
    """`make test-slow`: the same suite with 20x the examples."""
    global EXAMPLES
    EXAMPLES *= 20
    try:
        test_every_rpc_answers_hostile_requests_with_a_table_status(cluster)
    finally:
        EXAMPLES //= 20
