"""The `raftmq` data subcommands (client/cli_data.py through client/cli.py's parser) against the
real cluster: topics, produce with a progress bar, consume, group lag and reset, message lookups,
and one clear line (no traceback) for every typed error."""

from __future__ import annotations

import re

import pytest

from raftmq.ops import cli, cli_data
from tests.harness.procs import Cluster, wait_until

MSG_ID = re.compile(r"broker-[ab]-[0-9A-F]{32}")


def run(cluster: Cluster, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["--namesrv", cluster.namesrv, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def total_lag(table: str) -> int:
    row = next(line for line in table.splitlines() if "total" in line)
    return int(re.findall(r"\d+", row)[-1])


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tables fold long cells at the 80 columns of a non-terminal; ids must stay whole here.
    monkeypatch.setattr(cli_data.console, "width", 250)
    monkeypatch.setattr(cli.err_console, "width", 400)


def test_topic_produce_consume_lag_reset_and_lookup(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(cluster, capsys, "topic", "create", "cli-topic", "--queues", "2")
    assert code == 0 and "created on broker-a, broker-b" in out

    def routed() -> bool:
        code, out, _ = run(cluster, capsys, "topic", "route", "cli-topic")
        return code == 0 and "broker-a" in out and "broker-b" in out

    wait_until(routed, 30, "the route of cli-topic")
    code, out, _ = run(cluster, capsys, "topic", "list")
    assert code == 0 and "cli-topic" in out and "2/2" in out

    args = ["produce", "cli-topic", "--count", "200", "--size", "50", "--batch", "20"]
    code, out, _ = run(cluster, capsys, *args, "--key", "kk")
    assert code == 0 and "200 messages" in out and "acknowledged" in out
    code, out, _ = run(
        cluster, capsys, "produce", "cli-topic", "--message", "hello", "--key", "hk", "--show-ids"
    )
    assert code == 0
    ids = MSG_ID.findall(out)
    assert len(ids) == 1

    code, out, _ = run(
        cluster,
        capsys,
        "consume",
        "cli-topic",
        "--group",
        "g-cli",
        "--from-beginning",
        "--max",
        "201",
        "--timeout",
        "60",
    )
    assert code == 0 and "201 messages" in out and "consumed by group g-cli" in out
    assert "'hello'" in out, "rows show the bodies"

    code, out, _ = run(cluster, capsys, "group", "lag", "g-cli", "--topic", "cli-topic")
    assert code == 0 and total_lag(out) == 0, out
    code, out, _ = run(
        cluster, capsys, "group", "reset", "g-cli", "--topic", "cli-topic", "--to-time", "0",
        "--execute",
    )  # fmt: skip
    assert code == 0 and "cli-topic@broker-a#0" in out
    code, out, _ = run(cluster, capsys, "group", "lag", "g-cli", "--topic", "cli-topic")
    assert code == 0 and total_lag(out) == 201, "after a reset to the start all is lag again"

    code, out, _ = run(cluster, capsys, "message", "get", "--id", ids[0])
    assert code == 0 and ids[0] in out and "hello" in out
    code, out, _ = run(cluster, capsys, "message", "get", "--key", "hk", "--topic", "cli-topic")
    assert code == 0 and ids[0] in out

    code, out, _ = run(cluster, capsys, "topic", "delete", "cli-topic")
    assert code == 0 and "deleted from broker-a, broker-b" in out


@pytest.mark.parametrize(
    ("argv", "code_name", "text"),
    [
        (["produce", "no-such-topic"], "TOPIC_NOT_FOUND", "no-such-topic"),
        (["topic", "create", "bad topic!"], "INVALID_NAME", "bad topic!"),
        (["message", "get", "--id", "nope"], "INVALID_MESSAGE_ID", "nope"),
        (["group", "reset", "g", "--topic", "t", "--to-time", "yesterday"], "INVALID_ARGUMENT", ""),
        (["consume", "no-such-topic", "--group", "g"], "NO_ROUTE", "no-such-topic"),
    ],
)
def test_typed_errors_are_one_line(
    cluster: Cluster,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code_name: str,
    text: str,
) -> None:
    code, _, err = run(cluster, capsys, *argv)
    assert code == 1
    assert f"error ({code_name})" in err and text in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_no_namesrv_answering_names_the_address(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--namesrv", "127.0.0.1:1", "topic", "list"])
    _, err = capsys.readouterr()
    assert code == 1 and "error (BROKER_UNAVAILABLE)" in err and "127.0.0.1:1" in err


def one_error_line(err: str, code_name: str) -> str:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"error ({code_name})" in err, err
    return err


def test_cli_words_say_what_happened_and_what_to_do(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 15's CLI items: no silent default queue count, a `topic update` that exists, the
    help's own `--to-time -10m`, a produce summary that counts only successes, a key lookup with
    no match, a reset of an unknown group, a bad filter: each one line, never a traceback."""
    code, _, err = run(cluster, capsys, "topic", "create", "cli-words", "--queues", "0")
    assert code == 1 and "0 queues" in one_error_line(err, "INVALID_TOPIC_CONFIG")
    code, out, _ = run(cluster, capsys, "topic", "create", "cli-words", "--queues", "2")
    assert code == 0 and "(2 queues each)" in out

    def routed(queues: int) -> bool:
        code, out, _ = run(cluster, capsys, "topic", "list")
        return code == 0 and any(
            "cli-words" in ln and f"{queues}/{queues}" in ln for ln in out.splitlines()
        )

    wait_until(lambda: routed(2), 30, "cli-words with 2 queues")
    code, out, _ = run(cluster, capsys, "topic", "update", "cli-words", "--queues", "3")
    assert code == 0 and "updated on broker-a, broker-b: 3 queues" in out, out
    wait_until(lambda: routed(3), 30, "cli-words with 3 queues")
    code, _, err = run(cluster, capsys, "topic", "update", "cli-words")
    assert code == 1 and "nothing to change" in one_error_line(err, "INVALID_ARGUMENT")

    code, out, _ = run(cluster, capsys, "produce", "cli-words", "--count", "5")
    assert code == 0 and "5 messages acknowledged, 0 failed, 0 outcome unknown, of 5 sent" in out
    code, out, err = run(cluster, capsys, "produce", "no-such-topic", "--count", "3")
    assert code == 1 and "0 messages acknowledged" in out and "of 3 sent" in out, out
    one_error_line(err, "TOPIC_NOT_FOUND")

    code, _, err = run(
        cluster, capsys, "group", "reset", "g-never", "--topic", "cli-words", "--to-time", "-10m"
    )
    assert code == 1 and "--create" in one_error_line(err, "INVALID_ARGUMENT")
    code, out, _ = run(
        cluster, capsys, "group", "reset", "g-never", "--topic", "cli-words", "--to-time", "-10m",
        "--create", "--execute",
    )  # fmt: skip
    assert code == 0 and "cli-words@broker-a#0" in out, out
    code, out, _ = run(
        cluster, capsys, "group", "reset", "g-never", "--topic", "cli-words", "--to-time", "-1h",
        "--execute",
    )  # fmt: skip
    assert code == 0, "a group with committed offsets exists"

    code, out, err = run(
        cluster, capsys, "message", "get", "--key", "no-such-key", "--topic", "cli-words"
    )
    assert code == 1 and "messages" not in out, "no empty table"
    assert "no message with key 'no-such-key' in topic 'cli-words'" in one_error_line(
        err, "MESSAGE_NOT_FOUND"
    )

    for tags in ("||", "TagA ||", "TagA && TagB"):
        code, _, err = run(cluster, capsys, "consume", "cli-words", "--group", "g", "--tags", tags)
        assert code == 1 and "position" in one_error_line(err, "INVALID_FILTER")
    code = cli.main(["--namesrv", "", "topic", "list"])
    _, err = capsys.readouterr()
    assert code == 1 and "is empty" in one_error_line(err, "INVALID_ARGUMENT")

    code, out, _ = run(cluster, capsys, "topic", "delete", "cli-words")
    assert code == 0
