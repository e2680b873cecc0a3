"""User content is never read as markup (issue 26): bodies, keys, tags and properties full of rich
markup (`[/]`, `[bold red]`, `[link=...]`, `[word]`), emoji codes, control characters and invalid
UTF-8 go through every `raftmq` command that prints them, against the acceptance cluster; each
must exit 0 and print the content as written, control characters as escapes (`message range`
and `dlq resend --group` too)."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_push import ConsumeResult, PushConsumer
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer, SendResult
from raftmq.common.pb import controller_pb2
from raftmq.ops import cli, cli_alerts, cli_controller, cli_data
from raftmq.ops.terminal_text import literal, make_console
from tests.acceptance.cluster import create_topic
from tests.harness.procs import Cluster, wait_until

TOPIC, READERS, DLQ_GROUP = "markup-fuzz", "markup-readers", "markup-dlq"
TAG = "[bold red]T[/]"
KEYS = ("[/]", "[link=http://evil.example]k[/link]")
PROPERTY = ("p", "[word] [/] [i]")
# Each body under 40 bytes: `message list` and `dlq list` show the first 40.
BODIES = (
    b"[/] [word] [bold red]R[/bold red]",
    b"[link=http://e.example]L[/link]",
    b":thumbs_up: ends in a backslash\\",
    b"\x1b[31mESC\x07 tab\tnl\n\xff\xfe",
)
# What each body must print as: markup and emoji codes as written, each control character and
# invalid byte as its escape.
SHOWN = (
    "[/] [word] [bold red]R[/bold red]",
    "[link=http://e.example]L[/link]",
    ":thumbs_up: ends in a backslash\\",
    "\\x1b[31mESC\\x07 tab\\tnl\\n\\xff\\xfe",
)


@dataclass
class Data:
    sent: list[SendResult]
    dead_letter: ReceivedMessage


@pytest.fixture(scope="module")
def data(cluster: Cluster) -> Data:
    create_topic(cluster, TOPIC, queues=1)
    with Admin(cluster.namesrv) as admin, Producer(cluster.namesrv, trace=True) as producer:
        sent = [
            producer.send(TOPIC, body, tags=TAG, keys=list(KEYS), properties=dict([PROPERTY]))
            for body in BODIES
        ]
        # Every message fails once in DLQ_GROUP, which dead-letters at the first failure.
        with PushConsumer(
            cluster.namesrv,
            DLQ_GROUP,
            TOPIC,
            lambda m: ConsumeResult.RECONSUME_LATER,
            start_from=StartFrom.EARLIEST,
            max_reconsume_times=0,
            commit_interval_ms=100,
            rebalance_interval_ms=1_000,
            heartbeat_interval_ms=1_000,
        ):
            wait_until(
                lambda: len(admin.dead_letters(DLQ_GROUP)) == len(BODIES), 60, "the dead letters"
            )
        dead = admin.dead_letters(DLQ_GROUP)
    return Data(sent, next(d for d in dead if d.body == BODIES[0]))


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Wide enough that no table cell folds: each cell is compared whole.
    for console in (cli_data.console, cli.err_console, cli_controller.console):
        monkeypatch.setattr(console, "width", 1000)
    yield


def run(cluster: Cluster, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = cli.main(["--namesrv", cluster.namesrv, *argv])
    out, err = capsys.readouterr()
    assert code == 0, f"{argv}: exit {code}: {err}"
    assert "\x1b" not in out and "\x07" not in out, f"{argv} printed a control character: {out!r}"
    return out


def assert_literal(out: str, *expected: str) -> None:
    for text in expected:
        assert text in out, f"{text!r} not printed as written in:\n{out}"


def test_every_printing_command_shows_user_content_as_written(
    cluster: Cluster, data: Data, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run(
        cluster, capsys, "consume", TOPIC, "--group", READERS, "--from-beginning",
        "--max", str(len(BODIES)), "--timeout", "60",
    )  # fmt: skip
    assert_literal(out, TAG, *KEYS, *SHOWN, f"consumed by group {READERS}")
    for sent, shown in zip(data.sent, SHOWN, strict=True):
        out = run(cluster, capsys, "message", "get", "--id", sent.msg_id)
        assert_literal(out, sent.msg_id, TAG, ",".join(KEYS), shown)
        queue = f"{sent.broker_group}#{sent.queue_id}"
        out = run(cluster, capsys, "message", "range", "--topic", TOPIC, "--queue", queue,
                  "--from-offset", str(sent.queue_offset))  # fmt: skip
        assert_literal(out, sent.msg_id, TAG, ",".join(KEYS), shown)
    out = run(cluster, capsys, "message", "get", "--key", KEYS[0], "--topic", TOPIC)
    assert_literal(out, *SHOWN)
    out = run(cluster, capsys, "message", "list", "--topic", TOPIC, "--from", "0", "--all")
    assert_literal(out, TAG, *SHOWN, f"{len(BODIES)} messages")

    def traced() -> bool:
        with Admin(cluster.namesrv) as admin:
            try:
                return bool(admin.message_trace(data.sent[0].msg_id).steps())
            except Exception:
                return False

    wait_until(traced, 60, "the first message's trace")
    out = run(cluster, capsys, "message", "trace", "--id", data.sent[0].msg_id)
    assert_literal(out, data.sent[0].msg_id, "send")
    out = run(cluster, capsys, "dlq", "list", "--group", DLQ_GROUP)
    assert_literal(out, *SHOWN, TOPIC)
    dead = data.dead_letter.msg_id
    out = run(cluster, capsys, "dlq", "resend", "--group", DLQ_GROUP, "--dry-run")
    assert_literal(out, f"dead letters of group {DLQ_GROUP}", dead, "nothing was sent")
    out = run(cluster, capsys, "dlq", "show", "--id", dead)
    assert_literal(out, SHOWN[0], TAG, ",".join(KEYS), PROPERTY[1])
    out = run(cluster, capsys, "dlq", "resend", "--id", dead)
    assert_literal(out, f"resent {dead} to {TOPIC}")
    rows = [json.loads(line) for line in run(cluster, capsys, "dlq", "list", "--group", DLQ_GROUP,
                                             "--json").splitlines()]  # fmt: skip
    assert sorted(r.get("body", "") for r in rows if "body" in r) == sorted(
        b.decode() for b in BODIES[:3]
    ), rows
    assert [r["body_base64"] for r in rows if "body_base64" in r] == [
        base64.b64encode(BODIES[3]).decode()
    ]
    for argv in (
        ("topic", "status", TOPIC),
        ("topic", "list"),
        ("topic", "route", TOPIC),
        ("group", "lag", READERS, "--topic", TOPIC),
        ("group", "list"),
        ("stats", "topic", TOPIC),
        ("stats", "group", READERS),
        ("broker", "status", "--config"),
        ("producer", "list", "--topic", TOPIC),
    ):
        out = run(cluster, capsys, *argv)
        assert TOPIC in out or "broker" in out, (argv, out)
    # `group config` (issue 26): read only without options; its table and its --json
    out = run(cluster, capsys, "group", "config", READERS)
    assert_literal(out, f"consumer group {READERS}: config", "the consumer's", "broker-a")
    rows = json.loads(run(cluster, capsys, "group", "config", READERS, "--json"))
    assert {(r["broker_group"], r["retry_max_times"]) for r in rows} == {
        ("broker-a", -1), ("broker-b", -1)
    }, rows  # fmt: skip


def test_markup_in_a_name_is_echoed_literally_in_the_error(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["--namesrv", cluster.namesrv, "group", "lag", "[bold]g[/]", "--topic", "t"])
    _, err = capsys.readouterr()
    assert code == 1 and "[bold]g[/]" in err and "internal error" not in err, err
    for argv in (["[bold]g[/]", "--consume", "off"], ["g\x1b[31m\udcff", "--json"]):
        code = cli.main(["--namesrv", cluster.namesrv, "group", "config", *argv])
        out, err = capsys.readouterr()
        assert code == 1 and not out and "internal error" not in err, (argv, out, err)
        assert "\x1b" not in err and argv[0].replace("\x1b", "\\x1b")[:6] in err, (argv, err)


def rendered(markup: str) -> str:
    console = make_console()
    console.width = 1000
    with console.capture() as captured:
        console.print(markup, highlight=False, soft_wrap=True)
    return captured.get()


def test_the_clis_own_texts_keep_their_bracketed_words() -> None:
    """Texts of ours that name a TOML table (`[settings.controller]`, `[[group]]`) or a reason
    in brackets printed as written."""
    resp = controller_pb2.GetAlertsResponse(node_id="c1")
    console = cli_controller.console
    console.width = 1000
    with console.capture() as captured:
        cli_alerts.print_alerts(resp, [])
    assert "set [settings.controller] alarm_rules" in captured.get(), captured.get()
    advice = cli_data.balancer_warning("broker-a", "n2", "n1")
    assert "in the [[group]] table of broker-a" in rendered(advice), rendered(advice)
    assert rendered(literal("(no [security.tls])")).strip() == "(no [security.tls])"


def test_a_dead_letter_is_resent_once_unless_forced_and_the_trace_shows_it(
    cluster: Cluster, data: Data, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 26: `dlq resend --id X` twice made two copies, and the original's trace did not
    lead to its resend."""
    with Admin(cluster.namesrv) as admin:
        dead = next(d for d in admin.dead_letters(DLQ_GROUP) if d.body == BODIES[1])
    out = run(cluster, capsys, "dlq", "resend", "--id", dead.msg_id)
    first = re.search(r" as (\S+) ", out)
    assert first is not None, out
    code = cli.main(["--namesrv", cluster.namesrv, "dlq", "resend", "--id", dead.msg_id])
    _, err = capsys.readouterr()
    assert code == 1 and f"already resent to {TOPIC} as {first.group(1)}" in err, err
    assert "--force" in err
    out = run(cluster, capsys, "dlq", "resend", "--id", dead.msg_id, "--force")
    assert f"resent {dead.msg_id} to {TOPIC}" in out
    origin = data.sent[1].msg_id
    out = run(cluster, capsys, "message", "trace", "--id", origin)
    assert "resend" in out and first.group(1) in out, out
