"""Mistakes and hostile input without a cluster (issue 15): each gives a typed RaftMQError whose
text names what was wrong and what to do, at the place it was given (a constructor, a value type,
a cluster description), never a TypeError, a traceback or a silent fallback."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest

from raftmq.client.admin import Admin, GroupInfo, check_queue_count
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.consumer_push import PushConsumer
from raftmq.client.messages import OutgoingMessage, SendResult, to_pb
from raftmq.client.producer import Producer
from raftmq.client.routes import ChannelPool, RouteCache
from raftmq.common.errors import (
    ERROR_TABLE,
    InvalidArgumentError,
    InvalidFilterError,
    InvalidMessageError,
    InvalidNameError,
    InvalidTopicConfigError,
    RaftMQError,
    TopicNotFoundError,
)
from raftmq.common.filter.sql92 import FilterSyntaxError, compile_filter
from raftmq.common.filter.subscription import check_subscription
from raftmq.common.filter.tag import parse_tag_expression
from raftmq.common.message import Message, MessageLimits, validate_group, validate_message
from raftmq.common.pb import namesrv_pb2
from raftmq.common.types import QueueRef, check_offset, parse_address_list
from raftmq.ops import cli, cli_data
from raftmq.ops.cluster_spec import SpecError, load, local_description

NOWHERE = "127.0.0.1:1"  # a valid address nothing listens on: constructors never dial


# ---- 1. filters --------------------------------------------------------------------------------


def test_a_filter_syntax_error_is_a_typed_error_with_its_own_code() -> None:
    with pytest.raises(RaftMQError) as info:
        compile_filter("region = = 'eu'")
    assert isinstance(info.value, InvalidFilterError)
    assert isinstance(info.value, InvalidArgumentError)
    assert isinstance(info.value, ValueError)  # callers catching ValueError keep working
    assert info.value.code == "INVALID_FILTER"
    assert info.value.details["position"] == "9"
    assert any(row.exc is InvalidFilterError for row in ERROR_TABLE)


@pytest.mark.parametrize(("sql", "position"), [("region = = 'eu'", 9), ("a IN ()", 6), ("a >", 3)])
def test_a_bad_sql_expression_fails_when_a_consumer_is_built(sql: str, position: int) -> None:
    with pytest.raises(InvalidFilterError, match=f"position {position}.*SQL92 has"):
        PullConsumer(NOWHERE, "g", sql_expression=sql)
    with pytest.raises(InvalidFilterError, match=f"position {position}"):
        PushConsumer(NOWHERE, "g", "t", print, sql_expression=sql)


@pytest.mark.parametrize(
    ("tags", "match"),
    [
        ("||", "name a tag, or use '\\*'"),
        ("TagA ||", "position 7.*dangling '\\|\\|'"),
        ("|| TagA", "position 0.*a tag before"),
        ("TagA && TagB", "only have '\\|\\|'.*SQL92"),
        ("TagA | TagB", "single '\\|'"),
    ],
)
def test_a_bad_tag_expression_fails_when_a_consumer_is_built(tags: str, match: str) -> None:
    with pytest.raises(InvalidFilterError, match=match):
        PullConsumer(NOWHERE, "g", tag_expression=tags)
    with pytest.raises(InvalidFilterError, match=match):
        PushConsumer(NOWHERE, "g", "t", print, tag_expression=tags)


def test_a_tag_expression_and_an_sql_expression_together_are_refused() -> None:
    with pytest.raises(InvalidFilterError, match=r"one filter.*TAGS IN"):
        check_subscription("TagA", "region = 'eu'")
    check_subscription("*", "region = 'eu'")  # '*' is the default: no conflict
    check_subscription("TagA || TagB", "")


def test_a_long_bad_expression_is_quoted_cut_with_its_length() -> None:
    sql = "(" * 5000 + "a = 1" + ")" * 5000
    with pytest.raises(InvalidFilterError) as info:
        check_subscription(None, sql)
    message = info.value.message
    assert "(10005 characters)" in message and "SQL92 has" in message
    assert len(message) < 1000, "the error is a line a person reads, not the expression again"
    assert info.value.details["sql_expression"] == sql  # the whole text stays in the details
    with pytest.raises(InvalidFilterError) as info:
        check_subscription("||" * 3000, None)
    assert "(6000 characters)" in info.value.message and len(info.value.message) < 1000


def test_the_broker_parser_keeps_rocketmq_tolerance_but_refuses_operators_it_lacks() -> None:
    assert parse_tag_expression("TagA ||").tags == frozenset({"TagA"})  # as RocketMQ's broker
    with pytest.raises(InvalidFilterError):
        parse_tag_expression("TagA && TagB")
    with pytest.raises(FilterSyntaxError):
        parse_tag_expression("TagA ||", strict=True)


def test_cli_consume_with_a_bad_filter_prints_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(["--namesrv", NOWHERE, "consume", "demo", "--group", "g", "--tags", "||"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "INVALID_FILTER" in err and "Traceback" not in out + err


# ---- 2. queue ids and offsets ------------------------------------------------------------------


@pytest.mark.parametrize("queue_id", [-1, 1 << 31, "0", True])
def test_a_queue_ref_refuses_a_queue_id_outside_int32(queue_id: object) -> None:
    with pytest.raises(InvalidArgumentError, match="queue_id") as info:
        QueueRef("demo", "broker-a", queue_id)  # type: ignore[arg-type]
    assert info.value.details["argument"] == "queue_id"


def test_seek_and_offsets_are_checked_in_the_sdk() -> None:
    assert check_offset(0) == 0
    for bad in (-1, 1 << 63, 1.5):
        with pytest.raises(InvalidArgumentError, match="offset"):
            check_offset(bad)
    with PullConsumer(NOWHERE, "g") as c:
        with pytest.raises(InvalidArgumentError, match="offset -5"):
            c.seek(QueueRef("demo", "broker-a", 0), -5)
        with pytest.raises(InvalidArgumentError, match="QueueRef"):
            c.assign([("demo", "broker-a", 0)])  # type: ignore[list-item]


def test_admin_checks_queue_counts() -> None:
    for bad in (0, -1, 1025):
        with pytest.raises(InvalidTopicConfigError, match=r"1\.\.1024"):
            check_queue_count("t", bad)
    with Admin(NOWHERE) as admin, pytest.raises(InvalidTopicConfigError, match="0 queues"):
        admin.create_topic("t", queues=0)


# ---- 3. message field types --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("properties", "match"),
    [
        ({"k": 5}, "property 'k' is int.*str\\(5\\)"),
        ({"k": None}, "property 'k' is None.*leave the property out"),
        ({1: "v"}, "property name 1 is of type int"),
    ],
)
def test_a_property_that_is_not_a_string_is_named(properties: object, match: str) -> None:
    with pytest.raises(InvalidMessageError, match=match):
        to_pb(b"x", None, (), properties, 0, "h")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match=match):
        OutgoingMessage(b"x", properties=properties)  # type: ignore[arg-type]
    msg = Message("t", b"x", properties=properties)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match=match):
        validate_message(msg, MessageLimits())


def test_tags_and_keys_that_are_not_strings_are_named() -> None:
    with pytest.raises(InvalidMessageError, match="tags must be a string"):
        OutgoingMessage(b"x", tags=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="message key 7"):
        to_pb(b"x", None, ("a", 7), None, 0, "h")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="keys=\\['k'\\]"):
        OutgoingMessage(b"x", keys="k")  # type: ignore[arg-type]


# ---- 5. group names ----------------------------------------------------------------------------


@pytest.mark.parametrize("group", ["%RETRY%g", "%DLQ%g", "rmq_sys_g", "CID_RMQ_SYS_g"])
def test_system_prefixes_are_refused_for_client_groups(group: str) -> None:
    with pytest.raises(InvalidNameError, match="reserved prefix"):
        validate_group(group)
    with pytest.raises(InvalidNameError, match="reserved prefix"):
        PullConsumer(NOWHERE, group)
    validate_group(group, allow_system=True)  # a committed record is applied as it is


# ---- 6. addresses ------------------------------------------------------------------------------


def test_one_address_parser_with_both_separators_and_checked_ports() -> None:
    assert parse_address_list("a:1;b:2, c:3", "x") == ("a:1", "b:2", "c:3")
    assert parse_address_list(["a:1", "b:2;a:1"], "x") == ("a:1", "b:2")
    with pytest.raises(InvalidArgumentError, match=r"no port.*localhost:9876"):
        parse_address_list("localhost", "namesrv_addresses")
    with pytest.raises(InvalidArgumentError, match=r"99999.*1\.\.65535"):
        parse_address_list("127.0.0.1:99999", "namesrv_addresses")
    with pytest.raises(InvalidArgumentError, match="is empty"):
        parse_address_list(" ; ", "namesrv_addresses")


@pytest.mark.parametrize("bad", ["", "localhost", "127.0.0.1:99999", ","])
def test_sdk_constructors_refuse_a_bad_namesrv_list_with_a_typed_error(bad: str) -> None:
    for build in (
        lambda: Producer(bad),
        lambda: PullConsumer(bad, "g"),
        lambda: PushConsumer(bad, "g", "t", print),
        lambda: Admin(bad),
        lambda: RouteCache(bad, ChannelPool()),
    ):
        with pytest.raises(InvalidArgumentError, match="namesrv_addresses"):
            build()


def test_the_sdk_accepts_rocketmq_semicolons() -> None:
    with Admin("127.0.0.1:9876;127.0.0.1:9877") as admin:
        assert admin.routes.namesrv_addresses == ("127.0.0.1:9876", "127.0.0.1:9877")


@pytest.mark.parametrize("bad", ["", "localhost", "127.0.0.1:99999"])
def test_cli_refuses_a_bad_namesrv_without_falling_back(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["--namesrv", bad, "topic", "list"])
    _, err = capsys.readouterr()
    assert code == 1 and "--namesrv" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["consume", "t", "--group", "g", "--timeout", "nan"], "--timeout: 'nan' is out of range"),
        (["consume", "t", "--group", "g", "--timeout", "-3"], "--timeout: '-3' is out of range"),
        (["consume", "t", "--group", "g", "--max", "-1"], "--max: -1 is out of range"),
        (["produce", "t", "--rate", "inf"], "--rate: 'inf' is out of range"),
        (["produce", "t", "--count", "0"], "at least 1"),
        (["produce", "t", "--size", "ten"], "--size: 'ten' is not a whole number"),
        (["message", "list", "--topic", "t", "--from", "0", "--page-size", "5000"], "1 to 1024"),
        (["dlq", "list", "--group", "g", "--max", "0"], "--max: 0 is out of range"),
        (["alerts", "--last", "-5"], "--last: -5 is out of range"),
        (["chaos", "run", "--scenario", "baseline", "--rate", "0"], "give a number above 0"),
    ],
)
def test_cli_numbers_out_of_range_are_usage_errors_before_anything_connects(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--namesrv", NOWHERE, *argv])
    _, err = capsys.readouterr()
    assert info.value.code == 2 and says in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "help_of"),
    [
        (["consume", "t", "--group", "g", "--count", "1"], "raftmq consume --help"),
        (["topic", "create", "t", "--bogus"], "raftmq topic create --help"),
        (["--bogus", "topic", "list"], "raftmq topic list --help"),
    ],
)
def test_an_unknown_option_points_at_its_subcommands_help(
    argv: list[str], help_of: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--namesrv", NOWHERE, *argv])
    _, err = capsys.readouterr()
    assert info.value.code == 2 and "unrecognized arguments" in err and f"`{help_of}`" in err, err


# ---- 4. cluster description settings -----------------------------------------------------------


def test_a_misspelled_settings_key_fails_when_the_description_is_read(tmp_path: Path) -> None:
    text = local_description(
        range(20000, 20020), tmp_path / "data", extra="[settings.broker]\nflush_polcy = 'sync'\n"
    )
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load(path)
    assert str(path) in str(info.value)
    assert "'flush_polcy'" in str(info.value) and "did you mean 'flush_policy'" in str(info.value)


@pytest.mark.parametrize("role", ["namesrv", "controller"])
def test_every_role_settings_table_is_checked(role: str, tmp_path: Path) -> None:
    text = local_description(
        range(20000, 20020), tmp_path / "data", extra=f"[settings.{role}]\nno_such_key = 1\n"
    )
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    with pytest.raises(SpecError, match=f"settings.{role}.*no_such_key"):
        load(path)


# ---- 7. the relative-time form of the CLI ------------------------------------------------------


def test_the_documented_relative_time_reaches_the_handler() -> None:
    argv = cli.join_relative_times(["group", "reset", "g", "--topic", "t", "--to-time", "-10m"])
    args = cli.build_parser().parse_args(argv)
    assert args.to_time == "-10m"


class _FakeProducer:
    """Sends 1 and 3 succeed, send 2 fails, send 4 is interrupted by Ctrl-C."""

    def __init__(self, namesrv: str) -> None:
        self.calls = 0

    def __enter__(self) -> _FakeProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def send_async(self, topic: str, body: bytes, **kw: object) -> Future[SendResult]:
        self.calls += 1
        if self.calls == 4:
            raise KeyboardInterrupt
        f: Future[SendResult] = Future()
        if self.calls == 2:
            f.set_exception(TopicNotFoundError.for_topic(topic))
        else:
            f.set_result(SendResult(f"id{self.calls}", topic, "broker-a", 0, self.calls))
        return f


def test_produce_counts_successes_and_prints_a_summary_on_ctrl_c(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_data, "Producer", _FakeProducer)
    monkeypatch.setattr(cli_data.console, "width", 250)
    code = cli.main(["--namesrv", NOWHERE, "produce", "t", "--count", "10"])
    out, _ = capsys.readouterr()
    assert code == 130
    assert "2 messages acknowledged, 1 failed, 0 outcome unknown, of 3 sent" in out, out
    assert "2/10" in out and "10/10" not in out, "the bar counts acknowledged sends only"


def test_group_elect_warns_that_the_balancer_moves_leadership_back(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = tuple(namesrv_pb2.BrokerNode(node_id=f"n{i}") for i in range(3))

    class FakeAdmin:
        def __init__(self, namesrv: str) -> None:
            pass

        def __enter__(self) -> FakeAdmin:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def elect(self, group: str, node: str) -> str:
            return node

        def groups(self) -> list[GroupInfo]:
            return [
                GroupInfo("c", "broker-a", "n1", "", 1, nodes),
                GroupInfo("c", "broker-b", "n1", "", 1, nodes),
            ]

    monkeypatch.setattr(cli_data, "Admin", FakeAdmin)
    monkeypatch.setattr(cli_data.console, "width", 400)
    code = cli.main(["--namesrv", NOWHERE, "group", "elect", "--group", "broker-a", "--node", "n2"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "preferred leader n0" in out and 'preferred_leader = "n2"' in out, out
    # broker-b's preferred node is n1 (the i-th group prefers its i-th node): no warning.
    code = cli.main(["--namesrv", NOWHERE, "group", "elect", "--group", "broker-b", "--node", "n1"])
    out, _ = capsys.readouterr()
    assert code == 0 and "warning" not in out


@pytest.mark.parametrize(
    "name", ["heartbeat_interval_ms", "rebalance_interval_ms", "commit_interval_ms"]
)
def test_a_push_consumer_refuses_an_interval_the_wire_cannot_carry(name: str) -> None:
    # Found by the SDK fuzzer: heartbeat_interval_ms=2**63 was taken, and close() then failed with
    # protobuf's "Value out of range" building the leaving heartbeat (expiry = 3 intervals, uint32).
    with pytest.raises(InvalidArgumentError, match=name):
        PushConsumer("127.0.0.1:1", "g", "t", print, **{name: 2**63})


@pytest.mark.parametrize("timeout_ms", [-1, 2**31, 2**63])
def test_poll_refuses_a_wait_it_cannot_bound(timeout_ms: int) -> None:
    # Found by the SDK fuzzer: poll(timeout_ms=2**31) waited 24 days (the run hung) and 2**63
    # failed with OverflowError from the condition's wait.
    consumer = PullConsumer("127.0.0.1:1", "g")
    try:
        with pytest.raises(InvalidArgumentError, match="timeout_ms"):
            consumer.poll(timeout_ms=timeout_ms)
    finally:
        consumer.close()
