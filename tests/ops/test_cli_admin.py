"""The admin commands of issue 18 against a real cluster (NameServer + one broker group of three
processes): `produce --stdin` with properties and keys, `consume --sql --json`, `topic status`,
`broker status --config`, `group list` with members and connections, and `group reset` to
earliest / latest / an offset / a shift / a time: --dry-run changes nothing, an unknown group is
refused without --create, and --execute is followed by a running PushConsumer."""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.consumer_push import ConsumeResult, PushConsumer
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offset_reset import ResetTarget, ResetTo
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.common.pb import common_pb2
from raftmq.common.types import QueueRef
from raftmq.ops import cli, cli_data
from tests.harness.procs import Cluster, start_cluster, wait_until

GROUP = "broker-a"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("cli-admin"), groups=(GROUP,), namesrvs=1)
    try:
        c.wait_leaders()
        yield c
    finally:
        c.close()


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_data.console, "width", 250)
    monkeypatch.setattr(cli.err_console, "width", 400)


def run(cluster: Cluster, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["--namesrv", cluster.namesrv, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def make_topic(cluster: Cluster, name: str, queues: int = 2) -> None:
    with Admin(cluster.namesrv) as admin:
        admin.create_topic(name, queues=queues)
        wait_until(lambda: admin.route(name), 30, f"the route of {name}")


def stdin(data: bytes) -> io.TextIOWrapper:
    """Standard input as a terminal or pipe gives it: text with its bytes beneath."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")


def highs(cluster: Cluster, topic: str) -> dict[int, int]:
    with Admin(cluster.namesrv) as admin:
        return {q.queue.queue_id: q.max_offset for q in admin.topic_status(topic)}


def committed(cluster: Cluster, group: str, topic: str) -> dict[int, int | None]:
    with Admin(cluster.namesrv) as admin:
        return {q.queue.queue_id: q.committed for q in admin.group_lag(group, topic)}


def test_produce_stdin_consume_sql_json_topic_and_broker_status(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_topic(cluster, "adm-in")
    lines = "".join(f"k{i}:body {i}\n" for i in range(10))
    monkeypatch.setattr("sys.stdin", stdin(lines.encode()))
    code, out, _ = run(
        cluster, capsys, "produce", "adm-in", "--stdin", "--key-separator", ":",
        "--property", "color=red", "--property", "n=1", "--tags", "T",
    )  # fmt: skip
    assert code == 0 and "10 messages acknowledged" in out, out
    monkeypatch.setattr("sys.stdin", stdin(b"plain a\nplain b\n"))
    code, out, _ = run(
        cluster, capsys, "produce", "adm-in", "--stdin", "--property", "color=blue", "--batch", "5"
    )
    assert code == 0 and "2 messages acknowledged" in out, out
    code, _, err = run(cluster, capsys, "produce", "adm-in", "--property", "novalue")
    assert code == 1 and "NAME=VALUE" in err

    code, out, err = run(
        cluster, capsys, "consume", "adm-in", "--group", "g-sql", "--from-beginning",
        "--sql", "color = 'red'", "--json", "--max", "10", "--timeout", "30",
    )  # fmt: skip
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["body"] for r in rows) == sorted(f"body {i}" for i in range(10))
    for r in rows:
        i = r["body"].split()[1]
        assert r["keys"] == [f"k{i}"] and r["tags"] == "T"
        assert r["properties"]["color"] == "red" and r["properties"]["n"] == "1"
        assert r["topic"] == "adm-in" and r["msg_id"] and r["broker_group"] == GROUP
    assert "10 messages" in err  # the summary leaves stdout to the JSON lines

    code, out, _ = run(cluster, capsys, "topic", "status", "adm-in")
    assert code == 0
    total_row = next(line for line in out.splitlines() if "total" in line)
    assert re.findall(r"\d+", total_row)[-1] == "12", out
    assert f"{GROUP}" in out and "last stored" in out

    code, out, _ = run(cluster, capsys, "broker", "status", "--config")
    assert code == 0
    assert out.count("leader") >= 1 and out.count("follower") >= 2, out
    assert "max_message_bytes" in out and "raft_password" in out
    assert "***" not in out  # no password set: shown empty, never a secret


def test_group_list_shows_members_and_connections(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    make_topic(cluster, "adm-members")
    consumer = PushConsumer(
        cluster.namesrv,
        "g-members",
        "adm-members",
        lambda m: ConsumeResult.SUCCESS,
        heartbeat_interval_ms=300,
        client_id="test-host@123@members",
    )
    with consumer:

        def listed() -> list[dict[str, object]]:
            code, out, _ = run(cluster, capsys, "group", "list", "--json")
            assert code == 0
            return [g for g in json.loads(out) if g["group"] == "g-members"]

        groups = wait_until(listed, 20, "g-members in the group list")
        assert isinstance(groups, list)
        [g] = groups
        # A push consumer also reads its group's retry topic (RocketMQ lists it too).
        assert g["topics"] == ["%RETRY%g-members", "adm-members"]
        assert g["members"] == [
            {
                "client_id": "test-host@123@members",
                "topics": ["%RETRY%g-members", "adm-members"],
                "connections": [GROUP],
            }
        ]
        code, out, _ = run(cluster, capsys, "group", "list")
        assert code == 0 and "test-host@123@members" in out and "g-members" in out


def test_reset_dry_run_execute_and_a_running_consumer_follows(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    topic, group = "adm-reset", "g-reset"
    make_topic(cluster, topic, queues=2)
    with Producer(cluster.namesrv) as p:
        for f in [p.send_async(topic, b"m%d" % i) for i in range(100)]:
            f.result(30)
    lock = threading.Lock()
    seen: list[ReceivedMessage] = []

    def listen(m: ReceivedMessage) -> ConsumeResult:
        with lock:
            seen.append(m)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        cluster.namesrv,
        group,
        topic,
        listen,
        start_from=StartFrom.EARLIEST,
        heartbeat_interval_ms=300,
        commit_interval_ms=200,
    )
    end = highs(cluster, topic)  # the producer spreads 100 over 2 queues, not always 50/50
    assert sum(end.values()) == 100 and min(end.values()) >= 10, end
    with consumer:
        wait_until(lambda: len(seen) >= 100, 30, "100 messages")
        wait_until(lambda: committed(cluster, group, topic) == end, 20, "commits at the end")
        before = committed(cluster, group, topic)

        # Every target, as a dry run: the plan is printed, nothing changes.
        for target, new in (
            (["--to-earliest"], "0"),
            (["--to-offset", "7"], "7"),
            (["--shift-by", "-10"], str(end[0] - 10)),
            (["--to-time", "0"], "0"),
            (["--to-latest"], str(end[0])),
        ):
            code, out, _ = run(
                cluster, capsys, "group", "reset", group, "--topic", topic, *target, "--dry-run"
            )
            assert code == 0 and "dry run" in out, out
            row = next(line for line in out.splitlines() if f"{topic}@{GROUP}#0" in line)
            assert re.findall(r"[+-]?\d+", row.split("#0", 1)[1])[3] == new, (target, row)
        code, out, _ = run(
            cluster, capsys, "group", "reset", group, "--topic", topic, "--to-earliest"
        )
        assert code == 0 and "add --execute" in out  # neither flag: a dry run too
        assert committed(cluster, group, topic) == before

        # An unknown group is refused unless asked for.
        code, _, err = run(
            cluster, capsys, "group", "reset", "g-typo", "--topic", topic, "--to-earliest",
            "--execute",
        )  # fmt: skip
        assert code == 1 and "--create" in err
        assert committed(cluster, "g-typo", topic) == {0: None, 1: None}

        # Executed: the running consumer moves back 10 on each queue and consumes them again.
        count_before = len(seen)
        code, out, _ = run(
            cluster, capsys, "group", "reset", group, "--topic", topic, "--shift-by", "-10",
            "--execute",
        )  # fmt: skip
        assert code == 0 and "next heartbeat" in out, out
        wait_until(lambda: len(seen) >= count_before + 20, 30, "the 20 reset messages again")
        with lock:
            again = seen[count_before:]
        assert sorted((m.queue_id, m.queue_offset) for m in again) == sorted(
            (q, o) for q in (0, 1) for o in range(end[q] - 10, end[q])
        )
        wait_until(lambda: committed(cluster, group, topic) == end, 20, "commits at the end")

    # The same through the Admin API, the consumer stopped: a plan, then the reset.
    with Admin(cluster.namesrv) as admin:
        plan = admin.plan_offset_reset(group, topic, ResetTarget(ResetTo.OFFSET, 20))
        assert [(r.queue, r.current, r.new) for r in plan] == [
            (QueueRef(topic, GROUP, 0), end[0], min(20, end[0])),
            (QueueRef(topic, GROUP, 1), end[1], min(20, end[1])),
        ]
        assert committed(cluster, group, topic) == end
        done = admin.reset_offsets(group, topic, ResetTarget(ResetTo.OFFSET, 999))
        assert [r.new for r in done] == [end[0], end[1]]  # clamped to the end
        admin.reset_offsets(group, topic, ResetTarget(ResetTo.EARLIEST))
    assert committed(cluster, group, topic) == {0: 0, 1: 0}


def test_reset_of_a_new_group_with_create(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    make_topic(cluster, "adm-new", queues=1)
    with Producer(cluster.namesrv) as p:
        for f in [p.send_async("adm-new", b"x") for _ in range(5)]:
            f.result(30)
    code, out, _ = run(
        cluster, capsys, "group", "reset", "g-new", "--topic", "adm-new", "--to-offset", "3",
        "--create", "--execute",
    )  # fmt: skip
    assert code == 0, out
    assert committed(cluster, "g-new", "adm-new") == {0: 3}


# ---- issue 26: what an operator met ----------------------------------------------------------


def test_topic_update_perm_is_applied(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """It failed with a type-check message about a protobuf enum."""
    make_topic(cluster, "adm-perm")
    code, out, err = run(cluster, capsys, "topic", "update", "adm-perm", "--perm", "r")
    assert code == 0 and "permission r" in out, out + err
    with Admin(cluster.namesrv) as admin:
        [(_, cfg)] = admin.list_topics()["adm-perm"]
    assert cfg.perm == common_pb2.PERM_READ_ONLY


def test_relative_times_of_the_readme_are_accepted(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """`message list --from -10m` and `stats topic T --since -1h` were refused by argparse."""
    make_topic(cluster, "adm-rel")
    with Producer(cluster.namesrv) as p:
        p.send("adm-rel", b"recent")
    code, out, err = run(cluster, capsys, "message", "list", "--topic", "adm-rel", "--from", "-10m")
    assert code == 0 and "recent" in out and "1 messages" in out, out + err
    code, out, err = run(
        cluster, capsys, "message", "list", "--topic", "adm-rel", "--from", "-2h", "--to", "-1h"
    )
    assert code == 0 and "0 messages" in out, out + err
    code, out, err = run(cluster, capsys, "stats", "topic", "adm-rel", "--since", "-1h", "--json")
    assert code == 0 and json.loads(out)["series"][0]["total"] == 1, out + err


def test_shrinking_queues_with_unconsumed_messages_is_refused_unless_forced(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """`topic update --queues 2` on a topic with data in 4 queues hid the messages of queues
    2 and 3 without a word."""
    make_topic(cluster, "adm-shrink", queues=4)
    with Producer(cluster.namesrv) as p:
        for qid in range(4):
            for _ in range(qid + 1):  # 1, 2, 3, 4 messages: queues 2 and 3 hold 7
                p.send("adm-shrink", b"x", queue=QueueRef("adm-shrink", GROUP, qid))
    code, out, err = run(cluster, capsys, "topic", "update", "adm-shrink", "--queues", "2")
    assert code == 1 and "7 messages" in err and "--drop-unconsumed" in err, out + err
    assert "that no consumer group has read" in err and f"{GROUP}#3 (4)" in err, err
    assert highs(cluster, "adm-shrink") == {0: 1, 1: 2, 2: 3, 3: 4}, "nothing changed"
    # A group that has read queue 2 but not queue 3: only queue 3's 4 messages strand it.
    with Admin(cluster.namesrv) as admin:
        admin.reset_offsets(
            "g-shrink", "adm-shrink", ResetTarget(ResetTo.LATEST), allow_new_group=True
        )
        admin.reset_offsets("g-shrink", "adm-shrink", ResetTarget(ResetTo.SHIFT, -1))
    code, out, err = run(cluster, capsys, "topic", "update", "adm-shrink", "--queues", "3")
    assert code == 1 and "1 messages not yet consumed by g-shrink" in err, out + err
    # Growing, or shrinking what is consumed, needs no flag.
    with Admin(cluster.namesrv) as admin:
        admin.reset_offsets("g-shrink", "adm-shrink", ResetTarget(ResetTo.LATEST))
    code, out, err = run(cluster, capsys, "topic", "update", "adm-shrink", "--queues", "3")
    assert code == 0, out + err
    code, out, err = run(
        cluster, capsys, "topic", "update", "adm-shrink", "--queues", "1", "--drop-unconsumed"
    )
    assert code == 0 and "1 queues" in out, out + err


def test_produce_stdin_names_a_bad_line_and_what_was_sent_before_it(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty line failed the whole batch without naming it; a bad line 4 stopped after lines
    1-3 were stored without saying so; invalid UTF-8 ended in an internal error."""
    make_topic(cluster, "adm-lines", queues=1)
    monkeypatch.setattr("sys.stdin", stdin(b"one\ntwo\n\nfour\n"))
    code, out, err = run(cluster, capsys, "produce", "adm-lines", "--stdin", "--batch", "10")
    assert code == 1 and "line 3 of standard input is empty" in err, out + err
    assert "lines 1-2 before it were sent" in err and "2 messages acknowledged" in out, out + err
    assert "tail -n +3" in err
    monkeypatch.setattr("sys.stdin", stdin(b"k1:a\nk2:b\nk3:c\nno separator\nk5:e\n"))
    code, out, err = run(cluster, capsys, "produce", "adm-lines", "--stdin", "--key-separator", ":")
    assert code == 1 and "line 4 of standard input has no key separator" in err, out + err
    assert "lines 1-3 before it were sent" in err and "3 messages acknowledged" in out, out + err
    monkeypatch.setattr("sys.stdin", stdin(b"\xff\xfebinary\n\xc3(\n"))
    code, out, err = run(cluster, capsys, "produce", "adm-lines", "--stdin")
    assert code == 0 and "2 messages acknowledged" in out, out + err
    monkeypatch.setattr("sys.stdin", stdin(b"k:fine\n\xff:bad key\n"))
    code, out, err = run(cluster, capsys, "produce", "adm-lines", "--stdin", "--key-separator", ":")
    assert code == 1 and "line 2 of standard input has a key that is not UTF-8" in err, err
    assert "internal error" not in err
    # Exactly the lines before each bad one, in order, binary bodies byte for byte.
    with PullConsumer(cluster.namesrv, "g-lines", start_from=StartFrom.EARLIEST) as c:
        c.subscribe("adm-lines")
        got: list[bytes] = []
        wait_until(lambda: got.extend(m.body for m in c.poll(200)) or len(got) >= 8, 30, "all")
    assert got == [b"one", b"two", b"a", b"b", b"c", b"\xff\xfebinary", b"\xc3(", b"fine"]


def test_group_lag_across_topics_and_json_on_read_commands(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """`group lag G` without --topic covers every topic of the group (kafka-consumer-groups
    --describe); topic list/status, group lag, message get/list take --json."""
    for t in ("adm-lag1", "adm-lag2"):
        make_topic(cluster, t, queues=1)
    with Producer(cluster.namesrv) as p:
        for i in range(3):
            p.send("adm-lag1", f"one {i}".encode())
        for i in range(2):
            p.send("adm-lag2", f"two {i}".encode(), keys=["k-lag"])
    with Admin(cluster.namesrv) as admin:
        admin.reset_offsets("g-lag", "adm-lag1", ResetTarget(ResetTo.LATEST), allow_new_group=True)
        admin.reset_offsets(
            "g-lag", "adm-lag2", ResetTarget(ResetTo.EARLIEST), allow_new_group=True
        )
    code, out, err = run(cluster, capsys, "group", "lag", "g-lag")
    assert code == 0 and "adm-lag1" in out and "adm-lag2" in out, out + err
    assert re.search(r"total\D+2\b", out), out
    code, out, err = run(cluster, capsys, "group", "lag", "g-lag", "--json")
    rows = json.loads(out)
    assert {(r["topic"], r["lag"]) for r in rows} == {("adm-lag1", 0), ("adm-lag2", 2)}, rows
    code, _, err = run(cluster, capsys, "group", "lag", "g-nobody")
    assert code == 1 and "raftmq group list" in err, err
    code, out, _ = run(cluster, capsys, "topic", "list", "--json")
    assert json.loads(out)["adm-lag1"][0]["perm"] == "PERM_READ_WRITE"
    code, out, _ = run(cluster, capsys, "topic", "status", "adm-lag2", "--json")
    assert [q["max_offset"] for q in json.loads(out)] == [2]
    code, out, err = run(
        cluster, capsys, "message", "list", "--topic", "adm-lag2", "--from", "-10m", "--json"
    )
    bodies = [json.loads(line)["body"] for line in out.splitlines()]
    assert code == 0 and bodies == ["two 0", "two 1"] and "2 messages" in err, out + err
    code, out, _ = run(
        cluster, capsys, "message", "get", "--key", "k-lag", "--topic", "adm-lag2", "--json"
    )
    assert sorted(json.loads(line)["body"] for line in out.splitlines()) == ["two 0", "two 1"]
