"""The pure mappings of the proxy: receipt handles, v2 messages to raftmq and back, routes and the
error table."""

from __future__ import annotations

import gzip
import hashlib

import pytest

from raftmq.client.routes import GroupRoute, QueueData, TopicRoute
from raftmq.common.errors import (
    InvalidFilterError,
    MessageTooLargeError,
    NotLeaderError,
    OutcomeUnknownError,
    TopicNotFoundError,
)
from raftmq.common.pb import common_pb2
from raftmq.common.pb.apache.rocketmq.v2 import definition_pb2 as v2
from raftmq.proxy import convert, receipt, routing, transactions
from raftmq.proxy.codes import ApiError, status_of


def test_receipt_handle_round_trip_and_damage() -> None:
    h = receipt.ReceiptHandle("ab12", "broker-a", 3, 17, 99, 1_700_000_000_000)
    assert receipt.decode(h.encode()) == h
    for bad in ("", "x" * 600, "rmq1~a~b~1~2~3", "rmq2~a~b~1~2~3~4", "rmq1~a~b~1~-2~3~4"):
        with pytest.raises(ApiError) as exc:
            receipt.decode(bad)
        assert exc.value.code == v2.INVALID_RECEIPT_HANDLE and exc.value.message


def _msg(**sp: object) -> v2.Message:
    return v2.Message(
        topic=v2.Resource(name="t"),
        body=b"hello",
        user_properties={"a": "1"},
        system_properties=v2.SystemProperties(**sp),  # type: ignore[arg-type]
    )


def test_outgoing_keeps_what_raftmq_has_no_field_for() -> None:
    m = _msg(tag="TagA", keys=["k"], message_id="ID1", message_type=v2.FIFO, message_group="g1")
    m.system_properties.born_timestamp.FromMilliseconds(1234)
    out = convert.to_outgoing(m, 1024)
    assert (out.topic, out.body, out.tag, out.keys) == ("t", b"hello", "TagA", ("k",))
    assert out.message_group == "g1" and out.message_id == "ID1"
    assert out.properties["a"] == "1" and out.properties[convert.P_BORN_MS] == "1234"
    back = convert.to_v2(
        convert.Stored(
            "t", out.body, out.tag, out.keys, out.properties, "broker-a", 2, 7, "RAFT", 99, 5, "h"
        ),
        receipt_handle="H",
        delivery_attempt=3,
        invisible_ms=1500,
        store_host="p:1",
    )
    sp = back.system_properties
    assert dict(back.user_properties) == {"a": "1"}
    assert (sp.message_id, sp.message_group, sp.message_type) == ("ID1", "g1", v2.FIFO)
    assert sp.born_timestamp.ToMilliseconds() == 1234 and sp.store_timestamp.ToMilliseconds() == 99
    assert (sp.queue_id, sp.queue_offset, sp.delivery_attempt) == (2, 7, 3)
    # MD5 in uppercase hex, as RocketMQ's proxy: the one digest every official client checks
    # alike (the Node.js client reads a CRC32 as decimal, the Python client as hex).
    assert sp.body_digest.type == v2.MD5
    assert sp.body_digest.checksum == hashlib.md5(b"hello").hexdigest().upper()
    assert sp.invisible_duration.ToMilliseconds() == 1500 and sp.receipt_handle == "H"


def test_sdk_message_is_received_with_its_raftmq_id() -> None:
    back = convert.to_v2(
        convert.Stored(
            "t",
            b"b",
            None,
            (),
            # The broker's own properties (a delayed, a transactional message) are not the user's.
            {"x": "y", "TIMER_DELIVER_MS": "5", "PGROUP": "t", "__RMQ.TRANSACTION_CLIENT": "c"},
            "g",
            0,
            0,
            "RAFTID",
            9,
            8,
            "host",
        ),
        receipt_handle="H",
        delivery_attempt=1,
        invisible_ms=1000,
        store_host="p",
    )
    sp = back.system_properties
    assert sp.message_id == "RAFTID" and sp.message_type == v2.NORMAL
    assert sp.born_timestamp.ToMilliseconds() == 8 and sp.born_host == "host"
    assert not sp.HasField("tag") and not sp.HasField("message_group")
    assert dict(back.user_properties) == {"x": "y"}


@pytest.mark.parametrize(
    ("sp", "code"),
    [
        ({"message_type": v2.FIFO}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ({"message_type": v2.NORMAL, "message_group": "g"}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ({"message_type": v2.LITE}, v2.UNSUPPORTED),
        ({"message_type": v2.DELAY}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ({"message_type": v2.FIFO, "message_group": "g" * 65}, v2.ILLEGAL_MESSAGE_GROUP),
    ],
)
def test_outgoing_refusals(sp: dict[str, object], code: int) -> None:
    with pytest.raises(ApiError) as exc:
        convert.to_outgoing(_msg(**sp), 1024)
    assert exc.value.code == code and exc.value.message


def test_delivery_timestamp_makes_a_delay_message() -> None:
    for mtype in (v2.NORMAL, v2.DELAY):
        m = _msg(message_type=mtype)
        m.system_properties.delivery_timestamp.FromMilliseconds(2_000_000_000_000)
        out = convert.to_outgoing(m, 1024)
        assert out.deliver_at_ms == 2_000_000_000_000 and out.message_type == v2.DELAY
    for mtype in (v2.TRANSACTION, v2.FIFO):
        m = _msg(message_type=mtype, message_group="g")
        m.system_properties.delivery_timestamp.FromMilliseconds(2_000_000_000_000)
        with pytest.raises(ApiError) as exc:
            convert.to_outgoing(m, 1024)
        assert exc.value.code == v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
        assert "delivery timestamp" in exc.value.message


def test_delivery_timestamp_out_of_range_is_refused() -> None:
    m = _msg(message_type=v2.DELAY)
    m.system_properties.delivery_timestamp.seconds = 1_795_482_867_067  # ms given as seconds
    with pytest.raises(ApiError) as exc:
        convert.to_outgoing(m, 1024)
    assert exc.value.code == v2.ILLEGAL_DELIVERY_TIME and "not a valid time" in exc.value.message


def test_transaction_message_maps() -> None:
    out = convert.to_outgoing(_msg(message_type=v2.TRANSACTION), 1024)
    assert out.message_type == v2.TRANSACTION and out.deliver_at_ms is None
    assert out.properties[convert.P_MESSAGE_TYPE] == "TRANSACTION"


def test_outgoing_body_and_property_checks() -> None:
    m = _msg()
    m.body = b""
    with pytest.raises(ApiError, match="empty"):
        convert.to_outgoing(m, 10)
    m.body = b"x" * 11
    with pytest.raises(ApiError) as exc:
        convert.to_outgoing(m, 10)
    assert exc.value.code == v2.MESSAGE_BODY_TOO_LARGE
    m.body = gzip.compress(b"y" * 1000)
    m.system_properties.body_encoding = v2.GZIP
    with pytest.raises(ApiError) as exc:
        convert.to_outgoing(m, 100)  # inflates past the limit
    assert exc.value.code == v2.MESSAGE_BODY_TOO_LARGE
    assert convert.to_outgoing(m, 2000).body == b"y" * 1000
    m.body = b"not gzip"
    with pytest.raises(ApiError) as exc:
        convert.to_outgoing(m, 2000)
    assert exc.value.code == v2.MESSAGE_CORRUPTED
    for name in ("UNIQ_KEY", "rmq5.message_id", "__RMQ.X"):
        bad = _msg()
        bad.user_properties[name] = "v"
        with pytest.raises(ApiError) as exc:
            convert.to_outgoing(bad, 100)
        assert exc.value.code == v2.ILLEGAL_MESSAGE_PROPERTY_KEY
    bad_topic = _msg()
    bad_topic.topic.name = "no spaces"
    with pytest.raises(ApiError) as exc:
        convert.to_outgoing(bad_topic, 100)
    assert exc.value.code == v2.ILLEGAL_TOPIC


def _route(ordered: bool = False) -> TopicRoute:
    qs = (
        QueueData("broker-a", 4, 4, common_pb2.PERM_READ_WRITE, ordered),
        QueueData("broker-b", 2, 2, common_pb2.PERM_READ_ONLY, ordered),
    )
    groups = {g: GroupRoute(g, f"{g}:1", (f"{g}:1",), 1) for g in ("broker-a", "broker-b")}
    return TopicRoute("t", qs, groups, 0)


def test_routes_name_the_owning_proxy() -> None:
    proxies = ("10.0.0.1:8081", "10.0.0.2:8081")
    mqs = routing.message_queues(_route(), proxies)
    assert [(q.broker.name, q.id) for q in mqs] == [("broker-a", i) for i in range(4)] + [
        ("broker-b", 0),
        ("broker-b", 1),
    ]
    for q in mqs:
        owner = routing.owner_of(q.broker.name, proxies)
        assert (
            f"{q.broker.endpoints.addresses[0].host}:{q.broker.endpoints.addresses[0].port}"
            == owner
        )
        assert q.broker.endpoints.scheme == v2.IPv4 and q.broker.id == 0
    assert {q.permission for q in mqs if q.broker.name == "broker-b"} == {v2.READ}
    assert all(list(q.accept_message_types) == [v2.NORMAL, v2.DELAY, v2.TRANSACTION] for q in mqs)
    assert all(
        list(q.accept_message_types) == [v2.FIFO]
        for q in routing.message_queues(_route(True), proxies)
    )
    assert routing.endpoints("proxy-0:8081").scheme == v2.DOMAIN_NAME


def test_fifo_group_maps_to_one_queue_as_the_sdk_sharding_key() -> None:
    route = _route(True)
    q1 = routing.send_queue(route, "order-42")
    assert q1 is not None and q1 == routing.send_queue(route, "order-42")
    assert routing.send_queue(route, "") is None
    spread = {routing.send_queue(route, f"g{i}") for i in range(200)}
    assert len(spread) == 4  # every writable queue gets groups


def test_read_queues_only_of_this_proxy() -> None:
    route = _route()
    me = "a:1"
    # Every group this proxy serves, whichever assignment the client names (issue 26).
    assert {q.broker_group for q in routing.read_queues(route, me, (me,))} == {
        "broker-a",
        "broker-b",
    }
    other = ("a:1", "b:1")
    mine = routing.read_queues(route, me, other)
    assert all(routing.owner_of(q.broker_group, other) == me for q in mine)


def test_error_table() -> None:
    assert status_of(TopicNotFoundError("no")).code == v2.TOPIC_NOT_FOUND
    assert status_of(MessageTooLargeError("big")).code == v2.MESSAGE_BODY_TOO_LARGE
    assert status_of(InvalidFilterError("f")).code == v2.ILLEGAL_FILTER_EXPRESSION
    assert status_of(NotLeaderError("x")).code == v2.HA_NOT_AVAILABLE
    assert status_of(OutcomeUnknownError("x")).code == v2.MASTER_PERSISTENCE_TIMEOUT
    s = status_of(KeyError("secret internals"))
    assert s.code == v2.INTERNAL_SERVER_ERROR and "secret" not in s.message


def test_transaction_ids_name_their_broker_group() -> None:
    tid = transactions.transaction_id("broker-a", "0f3c")
    assert transactions.parse_transaction_id(tid) == ("broker-a", "0f3c")
    for bad in ("", "nocolon", ":x", "g:"):
        with pytest.raises(ApiError) as exc:
            transactions.parse_transaction_id(bad)
        assert (
            exc.value.code == v2.INVALID_TRANSACTION_ID and "send of the half" in exc.value.message
        )
    assert transactions.resolution(v2.COMMIT).name == "COMMIT"
    assert transactions.resolution(v2.ROLLBACK).name == "ROLLBACK"
    with pytest.raises(ApiError) as exc:
        transactions.resolution(v2.TRANSACTION_RESOLUTION_UNSPECIFIED)
    assert exc.value.code == v2.BAD_REQUEST


def test_idle_transaction_topics_are_the_unconnected_unused_ones() -> None:
    last = {"a": 100.0, "b": 100.0, "c": 195.0}
    # a: no client publishes it, unused for 100 s; b: a client publishes it; c: used recently.
    assert transactions.idle(last, {"b"}, 200.0, 60.0) == ["a"]
    assert transactions.idle(last, set(), 200.0, 60.0) == ["a", "b"]
    assert transactions.idle(last, {"a", "b", "c"}, 1e9, 0.0) == []
